"""`simsearch simulator finetune`: supervised fine-tuning of the simulator LLM.

Setup (processes, model, data, optimizer, resume) → loop (accumulate, step, log, validate,
checkpoint) → cleanup. The loss is on response tokens only (`simulator.sft`). Full fine-tuning or
LoRA (`lora.r > 0`); DeepSpeed ZeRO-2/3 when `deepspeed.stage > 0`.

Launch:
    simsearch simulator finetune recipe.yaml                       # one process
    torchrun --nproc_per_node 2 -m simsearch.cli simulator finetune recipe.yaml deepspeed.stage=3
    deepspeed --num_gpus 8 --no_local_rank --module simsearch.cli simulator finetune recipe.yaml deepspeed.stage=2

Run directory: `recipe.yaml`, `metrics.jsonl`, `checkpoints/step_N/` (`model/`: Hugging Face
format, full, LoRA adapter, or merged with the adapter in `model/adapter/` when
`lora.merge_on_save`; `trainer_state.pt`), with DeepSpeed `deepspeed/step_N/`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from simsearch.commands import preflight
from simsearch.config import FinetuneRecipe
from simsearch.errors import DataError
from simsearch.simulator.sft import (
    TokenizedPair,
    collate,
    count_targets,
    eval_batches,
    read_pairs,
    response_loss,
    step_batches,
    tokenize_pairs,
)
from simsearch.training import preempt
from simsearch.training.checkpoint import checkpoint_dir, rng_state
from simsearch.training.distributed import (
    BatchShape,
    HFExport,
    all_reduce_sum,
    backward,
    gathered_state_dict,
    load_for_training,
)
from simsearch.training.runlog import RunLogger
from simsearch.training.session import Run, TrainedModel, TrainSettings, deepspeed_device, open_run, train_model


def main(recipe: FinetuneRecipe) -> Path:
    """Fine-tunes the simulator; returns the final checkpoint directory (its `model/` is the result)."""
    # ------------------------------------------------------------------ setup
    use_ds = recipe.deepspeed.stage > 0
    preflight.set_threads(recipe.threads)
    preflight.check_paths(recipe)
    changes = preflight.check_resume(recipe, Path(recipe.run_dir), preflight.FINETUNE_UNCOMPUTED)
    run = open_run(recipe.run_dir, seed=recipe.seed, deepspeed=use_ds, resume=recipe.resume != "false",
                   task="fine-tuning")  # fmt: skip

    # Resumed weights: full or the LoRA adapter load here; under DeepSpeed `TrainedModel.restore` restores them below.
    model, tokenizer = load_for_training(
        recipe.model,
        recipe.lora,
        checkpoint=run.checkpoint,
        deepspeed=use_ds,
        gradient_checkpointing=recipe.gradient_checkpointing,
    )
    model.train()
    train, val, dropped = _tokenized(recipe, tokenizer)
    train_lengths = [len(pair.input_ids) for pair in train]

    batch = BatchShape(recipe.batch_size, recipe.grad_accum, run.world)
    settings = TrainSettings(recipe.optim, recipe.steps, recipe.deepspeed, batch, recipe.model.device, recipe.bf16)
    warmup = recipe.optim.warmup_for(recipe.steps)
    trained = train_model(model, settings, lr=recipe.optim.lr, warmup=warmup, schedule_in_deepspeed=True)
    if run.state is not None:
        trained.restore(run.state)
    start = run.start
    run.restore_rng()
    if run.rank == 0:  # the data and the model loaded: now the run directory is written
        preflight.start_records(recipe, run.run_dir, start, changes, "simulator finetune")
    sft = _SFT(recipe, run, trained, tokenizer, deepspeed_device() if use_ds else torch.device(recipe.model.device))
    logger = RunLogger(run.run_dir, resume_step=start) if run.rank == 0 else None
    if logger is not None and start == 0:
        logger.log(0, {"data/train_pairs": len(train), "data/val_pairs": len(val), "data/dropped_too_long": dropped})

    # ------------------------------------------------------------------ loop
    last_good = partial(preempt.last_checkpoint_line, run.run_dir)
    with preempt.stop_on_signals(recipe.stop_grace_s, last_good, "simsearch simulator finetune") as stop:
        last_saved = _loop(sft, logger, (train, train_lengths, val), stop)

        # -------------------------------------------------------------- cleanup (a signal now: it still ends)
        final = checkpoint_dir(run.run_dir, recipe.steps) if last_saved == recipe.steps else _save(sft, recipe.steps)
    if logger is not None:
        logger.close()
        print(f"simsearch simulator finetune: final checkpoint {final / 'model'}", flush=True)
    return final


def _loop(
    sft: _SFT, logger: RunLogger | None, data: tuple[list[TokenizedPair], list[int], list[TokenizedPair]],
    stop: preempt.Stop,
) -> int:  # fmt: skip
    """The steps from the resumed one on (log, validate, checkpoint); returns the last checkpoint's step (-1: none).

    After a signal the step in flight ends, is saved, and the process exits with status 143.
    """
    recipe, run = sft.recipe, sft.run
    train, train_lengths, val = data
    last_saved = run.start if run.checkpoint is not None else -1
    progress = tqdm(range(run.start, recipe.steps), initial=run.start, total=recipe.steps, disable=run.rank != 0,
                    desc="sft")  # fmt: skip
    for step in progress:
        metrics = _step(sft, train, train_lengths, step)
        done = step + 1
        if val and recipe.eval_every and (done % recipe.eval_every == 0 or done == recipe.steps):
            metrics["losses/val"] = _validate(sft, val)
        if logger is not None:
            logger.log(done, metrics)
            progress.set_postfix(loss=f"{metrics['losses/train']:.4f}")
        if recipe.save_every and done % recipe.save_every == 0:
            _save(sft, done)
            last_saved = done
        if done < recipe.steps and stop.agreed(run.world):  # every process stops after the same step
            saved = checkpoint_dir(run.run_dir, done) if last_saved == done else _save(sft, done)
            if logger is not None:
                logger.close()
            resume = preempt.resume_command("simulator finetune", run.run_dir, resume_false=recipe.resume == "false",
                                            world=run.world)  # fmt: skip
            preempt.exit_stopped(stop, f"after step {done}/{recipe.steps}: checkpoint {saved}", resume, rank=run.rank)
    return last_saved


@dataclass
class _SFT:
    """What the fine-tuning steps work with."""

    recipe: FinetuneRecipe
    run: Run
    trained: TrainedModel
    tokenizer: Any
    device: torch.device

    def on_device(self, indices: list[int], pairs: list[TokenizedPair]) -> dict[str, torch.Tensor]:
        batch = collate([pairs[i] for i in indices], self.tokenizer.pad_token_id)
        return {k: v.to(self.device) for k, v in batch.items()}

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        autocast = self.recipe.bf16 and not self.trained.deepspeed
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = self.trained.engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return response_loss(logits, batch["labels"], batch["weights"])


def _step(sft: _SFT, train: list[TokenizedPair], lengths: list[int], step: int) -> dict[str, float]:
    """One optimizer step on this process's share of the step's pairs; its metrics, over every process."""
    recipe, run, began = sft.recipe, sft.run, time.perf_counter()
    micro = [
        sft.on_device(indices, train)
        for indices in step_batches(
            len(train), step=step, batch_size=recipe.batch_size, grad_accum=recipe.grad_accum,
            rank=run.rank, world_size=run.world, seed=recipe.seed, lengths=lengths,
        )
    ]  # fmt: skip
    loss_sum, grad_norm = _train_step(sft, micro)
    tokens = sum(int(b["attention_mask"].sum()) for b in micro)
    summed = all_reduce_sum(torch.tensor([loss_sum, tokens], dtype=torch.float64), run.world).tolist()
    return {
        "losses/train": summed[0] / run.world,
        "optim/lr": sft.trained.scheduler.get_last_lr()[0],
        "optim/grad_norm": grad_norm,
        "perf/tokens_per_s": summed[1] / (time.perf_counter() - began),
    }


def _train_step(sft: _SFT, micro: list[dict[str, torch.Tensor]]) -> tuple[float, float]:
    """Accumulates the micro-batches and steps; returns (this process's loss, the gradient norm)."""
    trained, grad_clip = sft.trained, sft.recipe.optim.grad_clip
    engine = trained.engine if trained.deepspeed else None
    targets = max(1.0, sum(count_targets(b["weights"]) for b in micro))
    loss_sum = 0.0
    for batch in micro:
        # Divided by the step's token count, so the accumulated gradient is the token mean.
        loss = sft.loss(batch) / targets
        loss_sum += loss.item()
        backward(loss, engine)
    if engine is not None:
        return loss_sum, float(engine.get_global_grad_norm() or 0.0)
    clip = grad_clip if grad_clip > 0 else float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(trained.module.parameters(), clip))
    trained.optimizer.step()
    trained.scheduler.step()
    trained.optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm


def _validate(sft: _SFT, val: list[TokenizedPair]) -> float:
    """The token-mean response loss over every validation pair (each process a share)."""
    forward, run = sft.trained.engine, sft.run
    forward.eval()
    total = torch.zeros(2, dtype=torch.float64)  # [loss sum, tokens]
    with torch.no_grad():
        for indices, counted in eval_batches(len(val), batch_size=sft.recipe.batch_size, rank=run.rank,
                                             world_size=run.world):  # fmt: skip
            batch = sft.on_device(indices, val)
            loss = sft.loss(batch)
            if counted:
                total += torch.tensor([loss.item(), count_targets(batch["weights"])], dtype=torch.float64)
    forward.train()
    total = all_reduce_sum(total, run.world)
    return float(total[0]) / max(float(total[1]), 1.0)


def _save(sft: _SFT, step: int) -> Path:
    recipe, trained = sft.recipe, sft.trained

    def export() -> HFExport:
        weights = gathered_state_dict(trained.module, zero3=False, rank=0)  # already gathered (ZeRO-3)
        assert weights is not None  # process 0 exports, and it gets the weights
        merge_from = recipe.model.path if recipe.lora.r > 0 and recipe.lora.merge_on_save else None
        return HFExport(trained.module, weights, merge_from)

    return sft.run.save(step, [trained], export, sft.tokenizer, lambda ds_dir: _trainer_state(trained, ds_dir))


def _tokenized(recipe: FinetuneRecipe, tokenizer: Any) -> tuple[list[TokenizedPair], list[TokenizedPair], int]:
    """(training pairs, validation pairs sorted by length, training pairs dropped as too long)."""
    train, dropped = tokenize_pairs(
        read_pairs(recipe.train_file), tokenizer, chat_template=recipe.chat_template, max_length=recipe.max_length,
        answer_weight=recipe.answer_loss_weight,
    )  # fmt: skip
    if not train:
        raise DataError(
            f"{recipe.train_file}: every prompt is at least max_length={recipe.max_length} tokens; raise max_length"
        )
    val: list[TokenizedPair] = []
    if recipe.val_file:
        val, _ = tokenize_pairs(
            read_pairs(recipe.val_file), tokenizer, chat_template=recipe.chat_template, max_length=recipe.max_length
        )
        # The validation loss is a sum over pairs, so their order is free: by length, batches pad less.
        val.sort(key=lambda pair: len(pair.input_ids))
    return train, val, dropped


def _trainer_state(trained: TrainedModel, ds_dir: Path) -> dict[str, Any]:
    state: dict[str, Any] = {"rng": rng_state()}
    if trained.deepspeed:
        state["deepspeed_dir"] = str(ds_dir)
    state.update(trained.state())
    return state
