"""What the two training commands (`train`, `simulator finetune`) share about processes and weights."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
import torch.distributed as dist

from simsearch.errors import RecipeError, SimsearchError
from simsearch.models import load_model

T = TypeVar("T")


class ZeroSpec(Protocol):
    """What the DeepSpeed config reads of a recipe's `deepspeed` section."""

    @property
    def stage(self) -> int: ...
    @property
    def offload_optimizer(self) -> bool: ...
    @property
    def offload_params(self) -> bool: ...


class ModelSpec(Protocol):
    """What `load_for_training` reads of a recipe's model section."""

    @property
    def path(self) -> str: ...
    @property
    def dtype(self) -> str: ...


class LoraSpec(Protocol):
    """What `apply_lora` reads of a recipe's `lora` section (`r = 0`: no adapter)."""

    @property
    def r(self) -> int: ...
    @property
    def alpha(self) -> int: ...
    @property
    def dropout(self) -> float: ...
    @property
    def target_modules(self) -> Sequence[str]: ...


@dataclass(frozen=True)
class BatchShape:
    """How a process's optimizer step is cut: `accum` micro-batches of `micro` rows, over `world` processes."""

    micro: int
    accum: int
    world: int


# --------------------------------------------------------------------------- processes


def init_distributed(use_deepspeed: bool, *, task: str) -> tuple[int, int]:
    """(rank, world size); starts torch.distributed through DeepSpeed when `use_deepspeed`.

    Raises:
        RecipeError: Several processes were launched without DeepSpeed (`task` names the command).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if not use_deepspeed:
        if world > 1:
            raise RecipeError(
                f"launched as {world} processes but deepspeed.stage=0: multi-process {task} runs on "
                "DeepSpeed, set deepspeed.stage=2 or 3 (or launch one process)"
            )
        return 0, 1
    import deepspeed

    if "RANK" not in os.environ:  # a plain `simsearch ...` launch: a world of one
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size()


def all_reduce_sum(values: torch.Tensor, world: int) -> torch.Tensor:
    """Sums a small CPU tensor over processes, in place."""
    return _all_reduce(values, world, dist.ReduceOp.SUM)


def all_reduce_max(values: torch.Tensor, world: int) -> torch.Tensor:
    """Element-wise maximum of a small CPU tensor over processes, in place."""
    return _all_reduce(values, world, dist.ReduceOp.MAX)


def _all_reduce(values: torch.Tensor, world: int, op: Any) -> torch.Tensor:
    if world == 1:
        return values
    if dist.get_backend() == "nccl":  # NCCL reduces GPU tensors only
        reduced = values.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(reduced, op=op)
        return values.copy_(reduced.cpu())
    dist.all_reduce(values, op=op)
    return values


class FailedElsewhereError(SimsearchError, RuntimeError):
    """Another process failed in a collective step; this one stops with it instead of waiting for it."""


def raise_if_any_failed(error: BaseException | None, world: int, *, what: str) -> None:
    """Every process learns whether any failed in `what` (one all-reduce), and all raise if one did.

    The failed process raises its own `error`; the others `FailedElsewhereError`. Every process
    must call it, failed or not: it is the collective that replaces waiting for a process that left.
    """
    failed = all_reduce_max(torch.tensor([int(error is not None)]), world)
    if error is not None:
        raise error
    if int(failed.item()):
        raise FailedElsewhereError(
            f"{what} failed on another process (its own error says why); this process stops too rather "
            "than wait for it in the next collective"
        )


def collective_export(pairs: Iterable[T], consume: Callable[[Iterator[T]], Any], world: int, *, what: str) -> None:
    """`consume(pairs)` where producing `pairs` is collective (ZeRO-3 gathers: every process iterates to the end).

    A process whose `consume` raises still iterates what is left of `pairs`, using nothing of it,
    so that every gather the others enter has it too; then `raise_if_any_failed` ends every
    process. (An error inside the production itself, e.g. in a gather, cannot be rescued so.)
    """
    iterator = iter(pairs)
    if world == 1:
        consume(iterator)
        return
    error: Exception | None = None
    try:
        consume(iterator)
    except Exception as err:  # re-raised below, once every process has finished the collective
        error = err
    for _ in iterator:  # what the consumer left: the gathers go on, nothing is used
        pass
    raise_if_any_failed(error, world, what=what)


def mean_over_ranks(metrics: dict[str, float], world: int) -> dict[str, float]:
    """Each metric averaged over processes (every process must pass the same keys)."""
    if world == 1:
        return metrics
    keys = sorted(metrics)
    values = all_reduce_sum(torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64), world) / world
    return dict(zip(keys, values.tolist()))


def deepspeed_config(zero: ZeroSpec, batch: BatchShape, *, grad_clip: float, bf16: bool) -> dict[str, Any]:
    """The DeepSpeed ZeRO-2/3 config dict; the optimizer and LR schedule stay ours (client).

    Raises:
        ValueError: `zero.stage` is not 2 or 3, or `zero.offload_params` without stage 3.
    """
    if zero.stage not in (2, 3):
        raise ValueError(f"deepspeed stage={zero.stage} must be 2 or 3")
    if zero.offload_params and zero.stage != 3:
        raise ValueError("deepspeed.offload_params needs deepspeed.stage=3 (ZeRO-2 does not partition parameters)")
    section: dict[str, Any] = {"stage": zero.stage}
    if zero.offload_optimizer:
        section["offload_optimizer"] = {"device": "cpu"}
    if zero.offload_params:
        section["offload_param"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": batch.micro,
        "gradient_accumulation_steps": batch.accum,
        "train_batch_size": batch.micro * batch.accum * batch.world,
        "gradient_clipping": grad_clip,
        "zero_optimization": section,
        "bf16": {"enabled": bf16},
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,  # we log ourselves
    }


def backward(loss: torch.Tensor, engine: Any | None, boundary: bool | None = None) -> None:
    """Backpropagates one micro-batch's (already normalised) loss, through `engine` when there is one.

    `boundary` says whether the micro-batch ends the accumulation; None leaves it to DeepSpeed.
    """
    if engine is not None:
        if boundary is not None:
            engine.set_gradient_accumulation_boundary(boundary)
        engine.backward(loss, scale_wrt_gas=False)
        engine.step()
    else:
        loss.backward()


# --------------------------------------------------------------------------- weights


def load_for_training(
    model: ModelSpec,
    lora: LoraSpec,
    *,
    checkpoint: Path | None,
    deepspeed: bool,
    gradient_checkpointing: bool,
) -> tuple[Any, Any]:
    """(model, tokenizer) a training command updates, resuming from `checkpoint` when given.

    Under DeepSpeed the base model is loaded and the caller's `engine.load_checkpoint` overwrites
    it. With `lora.r > 0` the model is a PEFT model whose adapter alone trains.
    """
    use_lora = lora.r > 0
    # A full checkpoint replaces the base weights; LoRA and DeepSpeed resume their own state later.
    source = checkpoint / "model" if checkpoint is not None and not (use_lora or deepspeed) else model.path
    loaded, tokenizer = load_model(source, dtype=model.dtype)
    if use_lora:
        resumed = adapter_dir(checkpoint) if checkpoint is not None and not deepspeed else None
        loaded = apply_lora(loaded, lora, adapter=resumed)
    if gradient_checkpointing:
        loaded.gradient_checkpointing_enable()
        if use_lora:
            # The frozen embeddings' outputs do not require gradients, so (reentrant) checkpointed
            # blocks would pass none to the adapter: make them require it.
            loaded.enable_input_require_grads()
    return loaded, tokenizer


def apply_lora(model: Any, lora: LoraSpec, *, adapter: Path | None = None) -> Any:
    """Wraps a causal LM in a fresh PEFT LoRA adapter, loading `adapter`'s weights when given."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file

    model = get_peft_model(
        model,
        LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules),
            task_type="CAUSAL_LM",
        ),
    )
    if adapter is not None:
        set_peft_model_state_dict(model, load_file(adapter / "adapter_model.safetensors"))
    return model


def gathered_state_dict(module: torch.nn.Module, *, zero3: bool, rank: int) -> dict[str, torch.Tensor] | None:
    """A full CPU copy of `module`'s state dict on rank 0 (None elsewhere); collective under ZeRO-3."""
    if zero3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()} if rank == 0 else None
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()} if rank == 0 else None


class HFExport:
    """What `checkpoint.save_checkpoint` saves as the checkpoint's `model/` directory.

    `merge_from` (a PEFT model's base path) saves merged weights in `model/` and the adapter in
    `model/adapter/`; None saves what `save_pretrained` writes.
    """

    def __init__(self, module: Any, state_dict: dict[str, torch.Tensor], merge_from: str | None = None) -> None:
        self.module = module
        self.state_dict = state_dict
        self.merge_from = merge_from

    def save_pretrained(self, path: str | Path, **kwargs: Any) -> None:
        out = Path(path)
        if self.merge_from is None:
            self.module.save_pretrained(out, state_dict=self.state_dict, **kwargs)
            return
        # Merge a fresh copy (base + the adapter just written), leaving the training model as is.
        self.module.save_pretrained(out / "adapter", state_dict=self.state_dict, **kwargs)
        merged, _ = load_model(self.merge_from, adapter=out / "adapter", dtype="float32")
        merged.merge_and_unload().save_pretrained(out, **kwargs)  # type: ignore[operator]  # a PeftModel method


def adapter_dir(checkpoint: Path) -> Path:
    """Where a LoRA checkpoint keeps its adapter (`model/adapter` when merged, else `model`)."""
    merged = checkpoint / "model" / "adapter"
    return merged if merged.is_dir() else checkpoint / "model"


def deepspeed_state_dir(run_dir: Path, step: int) -> Path:
    """Where the DeepSpeed (partitioned optimizer) state of the checkpoint of `step` goes."""
    return run_dir / "deepspeed" / f"step_{step:07d}"


def prune_deepspeed_dirs(run_dir: Path) -> None:
    """Deletes DeepSpeed states no remaining checkpoint refers to."""
    root = run_dir / "deepspeed"
    if not root.is_dir():
        return
    kept = {p.name for p in (run_dir / "checkpoints").glob("step_*")}
    for ds_dir in root.glob("step_*"):
        if ds_dir.name not in kept:
            shutil.rmtree(ds_dir, ignore_errors=True)
