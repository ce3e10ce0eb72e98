"""The set-up `train` and `simulator finetune` share: processes, seed, resume, trained models, saving.

A command opens a `Run` (process group, seed, the checkpoint it resumes from), wraps each model
it trains in a `TrainedModel` (AdamW and its LR schedule, under DeepSpeed or not, restored from
the checkpoint) and saves through `Run.save`. The LR schedule stays outside DeepSpeed unless the
command steps it once per optimizer step (`simulator finetune`); `train` steps it once per step.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from simsearch.training.checkpoint import (
    checkpoint_dir,
    latest_checkpoint,
    load_state,
    save_checkpoint,
    set_rng_state,
)
from simsearch.training.distributed import (
    BatchShape,
    ZeroSpec,
    deepspeed_config,
    deepspeed_state_dir,
    init_distributed,
    prune_deepspeed_dirs,
    raise_if_any_failed,
)
from simsearch.training.optim import adamw_with_schedule
from simsearch.training.recipe import OptimConfig


@dataclass(frozen=True)
class TrainSettings:
    """How a run trains each of its models (the policy and its critic alike).

    Attributes:
        optim: The recipe's `optim` section (betas, weight decay, schedule kind, gradient clipping).
        total_steps: The LR schedule's length.
        zero: The DeepSpeed ZeRO stage and offloads; stage 0 trains without DeepSpeed.
        batch: The optimizer step's shape, for DeepSpeed.
        device: Where a model trains without DeepSpeed.
        bf16: DeepSpeed's bf16 mode.
    """

    optim: OptimConfig
    total_steps: int
    zero: ZeroSpec
    batch: BatchShape
    device: str
    bf16: bool


@dataclass
class Run:
    """A training run's processes and the checkpoint it resumes from.

    Attributes:
        rank: This process.
        world: The number of processes.
        run_dir: Where checkpoints, metrics and the resolved recipe go.
        checkpoint: The checkpoint resumed from, or None for a fresh start.
        state: Its trainer state (`checkpoint.load_state`), or None.
    """

    rank: int
    world: int
    run_dir: Path
    checkpoint: Path | None
    state: dict[str, Any] | None

    @property
    def start(self) -> int:
        """Steps already done: the resumed checkpoint's step, or 0."""
        return int(self.state["step"]) if self.state else 0

    def restore_rng(self) -> None:
        """Puts back the resumed checkpoint's RNG states; call it last, just before the loop."""
        if self.state is not None:
            set_rng_state(self.state["rng"])

    def save(
        self,
        step: int,
        models: Sequence[TrainedModel],
        export: Callable[[], Any],
        tokenizer: Any,
        trainer_state: Callable[[Path], dict[str, Any]],
    ) -> Path:
        """Writes the checkpoint of `step` finished steps; every process must call it.

        Args:
            step: Steps done.
            models: The trained models; under DeepSpeed each writes its partitions.
            export: Called on process 0 while the first model's parameters are gathered (ZeRO-3):
                what `checkpoint.save_checkpoint` writes as `model/`.
            tokenizer: Saved beside the model.
            trainer_state: Called on process 0 with the step's DeepSpeed directory: the rest of the
                checkpoint's trainer state.

        Returns:
            The checkpoint's directory.
        """
        ds_dir = deepspeed_state_dir(self.run_dir, step)
        for model in models:
            if model.deepspeed:  # every process writes its partitions
                model.engine.save_checkpoint(str(ds_dir / model.name), tag="state")
        error: Exception | None = None
        with models[0].gathered():  # ZeRO-3: every process holds the full weights while process 0 writes
            if self.rank == 0:
                try:
                    save_checkpoint(
                        self.run_dir, step, model=export(), tokenizer=tokenizer, state=trainer_state(ds_dir)
                    )
                    prune_deepspeed_dirs(self.run_dir)
                except Exception as err:  # raised below, on every process: the others must not wait for it
                    error = err
        if self.world > 1:  # the barrier, which also tells every process whether process 0's save failed
            raise_if_any_failed(error, self.world, what=f"saving the checkpoint of step {step}")
        elif error is not None:
            raise error
        return checkpoint_dir(self.run_dir, step)


def open_run(run_dir: str, *, seed: int, deepspeed: bool, resume: bool, task: str) -> Run:
    """Starts the processes, seeds torch's and Python's generators and finds the checkpoint to resume from.

    Args:
        run_dir: The run directory.
        seed: The same on every process: LoRA and head initialisations must agree.
        deepspeed: The recipe's `deepspeed.stage > 0`.
        resume: Continue from the run directory's last checkpoint if there is one.
        task: What the command does ("training", "fine-tuning"), for error messages.
    """
    rank, world = init_distributed(deepspeed, task=task)
    torch.manual_seed(seed)
    random.seed(seed)  # nothing draws from it today; a run is reproducible if something does
    checkpoint = latest_checkpoint(run_dir) if resume else None
    return Run(rank, world, Path(run_dir), checkpoint, load_state(checkpoint) if checkpoint else None)


@dataclass
class TrainedModel:
    """One model under training: what runs forward and backward, and its optimizer and LR schedule.

    Attributes:
        engine: What forward and backward go through: the DeepSpeed engine, or the module itself.
        module: The unwrapped module (for saving and weight sync).
        optimizer: AdamW (DeepSpeed's wrapper of it under DeepSpeed).
        scheduler: Its LR schedule.
        deepspeed: Trained under DeepSpeed.
        zero3: Under ZeRO-3 (parameters partitioned over processes).
        name: Its sub-directory in a checkpoint's DeepSpeed directory ("" = that directory), and
            the prefix of its trainer-state keys ("" or e.g. "critic_").
        schedule_in_deepspeed: DeepSpeed steps (and checkpoints) the LR schedule.
    """

    engine: Any
    module: Any
    optimizer: Any
    scheduler: Any
    deepspeed: bool
    zero3: bool
    name: str = ""
    schedule_in_deepspeed: bool = False

    @property
    def prefix(self) -> str:
        return f"{self.name}_" if self.name and self.name != "policy" else ""

    def gathered(self) -> Any:
        """A context in which every process holds the full parameters (ZeRO-3; else nothing to do)."""
        if not self.zero3:
            return nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None)

    def restore(self, state: dict[str, Any]) -> None:
        """Loads the optimizer (or DeepSpeed) state and the LR schedule from a trainer state.

        The checkpoint gives the state (moments, step counts, schedule position); the recipe this
        model was built from keeps its hyper-parameters (peak LR, betas, weight decay), which differ
        only when a run is resumed with `resume: force` after a change.
        """
        hyper = [{k: v for k, v in group.items() if k not in ("params", "lr")} for group in self.optimizer.param_groups]
        base_lrs = list(self.scheduler.base_lrs) if not self.schedule_in_deepspeed else []
        if self.deepspeed:
            self.engine.load_checkpoint(str(Path(state["deepspeed_dir"]) / self.name), tag="state")
        else:
            self.optimizer.load_state_dict(state[f"{self.prefix}optimizer"])
        for group, kept in zip(self.optimizer.param_groups, hyper, strict=True):
            group.update(kept)
        if not self.schedule_in_deepspeed:
            self.scheduler.load_state_dict(state[f"{self.prefix}scheduler"])
            self.scheduler.base_lrs = base_lrs
            epoch = self.scheduler.last_epoch
            lrs = [base * factor(epoch) for base, factor in zip(base_lrs, self.scheduler.lr_lambdas, strict=True)]
            self.scheduler._last_lr = lrs  # what get_last_lr reports (LambdaLR keeps no other record)
            for group, lr in zip(self.scheduler.optimizer.param_groups, lrs, strict=True):
                group["lr"] = lr  # whatever the optimizer state restored, the schedule decides

    def state(self) -> dict[str, Any]:
        """What a trainer state keeps of it beside DeepSpeed's own checkpoint."""
        out: dict[str, Any] = {}
        if not self.schedule_in_deepspeed:
            out[f"{self.prefix}scheduler"] = self.scheduler.state_dict()
        if not self.deepspeed:
            out[f"{self.prefix}optimizer"] = self.optimizer.state_dict()
        return out


def train_model(
    module: Any,
    settings: TrainSettings,
    *,
    lr: float,
    warmup: int,
    name: str = "",
    schedule_in_deepspeed: bool = False,
) -> TrainedModel:
    """AdamW with its LR schedule over `module`'s trainable parameters, under DeepSpeed when `zero.stage > 0`.

    Args:
        module: The model; without DeepSpeed it is moved to `settings.device`.
        settings: The run's optimizer, schedule length, DeepSpeed and device settings.
        lr: This model's peak learning rate.
        warmup: Warm-up steps of its schedule.
        name: See `TrainedModel.name`.
        schedule_in_deepspeed: Hand the schedule to DeepSpeed, which steps it with the optimizer.
    """
    optim, zero = settings.optim, settings.zero
    optimizer, scheduler = adamw_with_schedule(
        [p for p in module.parameters() if p.requires_grad],
        lr=lr, betas=optim.betas, weight_decay=optim.weight_decay,
        warmup_steps=warmup, total_steps=settings.total_steps, schedule=optim.schedule,
    )  # fmt: skip
    if zero.stage == 0:
        module.to(torch.device(settings.device))
        return TrainedModel(module, module, optimizer, scheduler, False, False, name)  # the schedule is ours
    import deepspeed

    config = deepspeed_config(zero, settings.batch, grad_clip=optim.grad_clip, bf16=settings.bf16)
    handed = scheduler if schedule_in_deepspeed else None
    engine, optimizer, _, ds_scheduler = deepspeed.initialize(
        model=module, optimizer=optimizer, lr_scheduler=handed, config=config
    )
    if schedule_in_deepspeed:
        scheduler = ds_scheduler
    return TrainedModel(engine, engine.module, optimizer, scheduler, True, zero.stage == 3, name, schedule_in_deepspeed)


def deepspeed_device() -> torch.device:
    """This process's accelerator under DeepSpeed."""
    from deepspeed.accelerator import get_accelerator

    return torch.device(get_accelerator().current_device_name())
