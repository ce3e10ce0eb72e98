"""`simsearch simulator finetune`: supervised fine-tuning of the simulator LLM.

Reads top to bottom: setup (processes, model, data, optimizer, resume) → loop (accumulate,
step, log, validate, checkpoint) → cleanup (final checkpoint). The loss is on response tokens
only (see `simsearch.simulator.sft`). Full fine-tuning or LoRA (`lora.r > 0`); DeepSpeed ZeRO-2/3
when `deepspeed.stage > 0`.

Launch:
    simsearch simulator finetune recipe.yaml                       # one process
    torchrun --nproc_per_node 2 -m simsearch.cli simulator finetune recipe.yaml deepspeed.stage=3
    deepspeed --num_gpus 8 --no_local_rank --module simsearch.cli simulator finetune recipe.yaml deepspeed.stage=2

Run directory: `recipe.yaml`, `metrics.jsonl` (`losses/train`, `losses/val`, `optim/lr`,
`optim/grad_norm`, `perf/tokens_per_s`), `checkpoints/step_N/` (`model/`: Hugging Face format,
full weights, the LoRA adapter, or merged weights with the adapter in `model/adapter/` when
`lora.merge_on_save`; `trainer_state.pt`), and with DeepSpeed `deepspeed/step_N/` (its
partitioned optimizer state, referenced from the checkpoint). ZeroSearch's recipe: lr 1e-6,
batch 2, 1000 steps.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from simsearch.config import FinetuneRecipe, save_recipe
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
from simsearch.training.checkpoint import (
    checkpoint_dir,
    latest_checkpoint,
    load_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from simsearch.training.distributed import (
    HFExport,
    all_reduce_sum,
    backward,
    deepspeed_config,
    deepspeed_state_dir,
    gathered_state_dict,
    init_distributed,
    load_for_training,
    prune_deepspeed_dirs,
)
from simsearch.training.optim import adamw_with_schedule
from simsearch.training.runlog import RunLogger


def main(recipe: FinetuneRecipe) -> Path:
    """Fine-tunes the simulator; returns the final checkpoint directory (its `model/` is the result)."""
    # ------------------------------------------------------------------ setup
    use_ds, lora = recipe.deepspeed.stage > 0, recipe.lora.r > 0
    rank, world = init_distributed(use_ds, task="fine-tuning")
    run_dir = Path(recipe.run_dir)
    if rank == 0:
        save_recipe(recipe, run_dir)
    torch.manual_seed(recipe.seed)
    checkpoint = latest_checkpoint(run_dir) if recipe.resume else None
    state = load_state(checkpoint) if checkpoint else None

    # Resumed weights: full or the LoRA adapter load here; under DeepSpeed `load_checkpoint` restores them below.
    model, tokenizer = load_for_training(
        recipe.model.path, dtype=recipe.model.dtype, checkpoint=checkpoint, deepspeed=use_ds,
        lora_r=recipe.lora.r, lora_alpha=recipe.lora.alpha, lora_dropout=recipe.lora.dropout,
        lora_target_modules=recipe.lora.target_modules, gradient_checkpointing=recipe.gradient_checkpointing,
    )  # fmt: skip
    model.train()

    train, dropped = tokenize_pairs(
        read_pairs(recipe.train_file), tokenizer, chat_template=recipe.chat_template, max_length=recipe.max_length,
        answer_weight=recipe.answer_loss_weight,
    )  # fmt: skip
    if not train:
        raise DataError(
            f"{recipe.train_file}: every prompt is at least max_length={recipe.max_length} tokens; "
            "raise max_length"
        )
    train_lengths = [len(pair.input_ids) for pair in train]
    val: list[TokenizedPair] = []
    if recipe.val_file:
        val, _ = tokenize_pairs(
            read_pairs(recipe.val_file), tokenizer, chat_template=recipe.chat_template, max_length=recipe.max_length
        )
        # The validation loss is a sum over pairs, so their order is free: by length, batches pad less.
        val.sort(key=lambda pair: len(pair.input_ids))

    optim = recipe.optim
    optimizer, scheduler = adamw_with_schedule(
        [p for p in model.parameters() if p.requires_grad],
        lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay,
        warmup_steps=optim.warmup_for(recipe.steps), total_steps=recipe.steps, schedule=optim.schedule,
    )  # fmt: skip
    if use_ds:
        import deepspeed

        config = deepspeed_config(
            stage=recipe.deepspeed.stage,
            offload_optimizer=recipe.deepspeed.offload_optimizer,
            offload_params=recipe.deepspeed.offload_params,
            micro_batch_size=recipe.batch_size,
            grad_accum=recipe.grad_accum,
            world_size=world,
            grad_clip=optim.grad_clip,
            bf16=recipe.bf16,
        )
        engine, optimizer, _, scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config
        )
        if state is not None:
            engine.load_checkpoint(state["deepspeed_dir"], tag="state")
        device, forward = engine.device, engine
    else:
        device = torch.device(recipe.model.device)
        model.to(device)
        if state is not None:
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
        engine, forward = None, model
    start = int(state["step"]) if state else 0
    if state is not None:
        set_rng_state(state["rng"])
    logger = RunLogger(run_dir, resume_step=start) if rank == 0 else None
    if logger is not None and start == 0:
        logger.log(0, {"data/train_pairs": len(train), "data/val_pairs": len(val), "data/dropped_too_long": dropped})

    def batch_on_device(indices: list[int], pairs: list[TokenizedPair]) -> dict[str, torch.Tensor]:
        return {k: v.to(device) for k, v in collate([pairs[i] for i in indices], tokenizer.pad_token_id).items()}

    def forward_loss(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=recipe.bf16 and not use_ds):
            logits = forward(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return response_loss(logits, batch["labels"], batch["weights"])

    def validate() -> float:
        forward.eval()
        total = torch.zeros(2, dtype=torch.float64)  # [loss sum, tokens]
        with torch.no_grad():
            for indices, counted in eval_batches(len(val), batch_size=recipe.batch_size, rank=rank, world_size=world):
                batch = batch_on_device(indices, val)
                loss = forward_loss(batch)
                if counted:
                    total += torch.tensor([loss.item(), count_targets(batch["weights"])], dtype=torch.float64)
        forward.train()
        total = all_reduce_sum(total, world)
        return float(total[0] / max(total[1], 1))

    def save(step: int) -> Path:
        ds_dir = deepspeed_state_dir(run_dir, step)
        if engine is not None:
            engine.save_checkpoint(str(ds_dir), tag="state")  # every rank writes its partition
        module = engine.module if engine is not None else model
        weights = gathered_state_dict(module, zero3=recipe.deepspeed.stage == 3, rank=rank)
        if rank == 0:
            trainer: dict[str, Any] = {"rng": rng_state()}
            if engine is not None:
                trainer["deepspeed_dir"] = str(ds_dir)
            else:
                trainer["optimizer"] = optimizer.state_dict()
                trainer["scheduler"] = scheduler.state_dict()
            merge_from = recipe.model.path if lora and recipe.lora.merge_on_save else None
            export = HFExport(module, weights, merge_from)
            save_checkpoint(run_dir, step, model=export, tokenizer=tokenizer, state=trainer)
            prune_deepspeed_dirs(run_dir)
        if world > 1:
            dist.barrier()
        return checkpoint_dir(run_dir, step)

    # ------------------------------------------------------------------ loop
    last_saved = start if checkpoint is not None else -1
    progress = tqdm(range(start, recipe.steps), initial=start, total=recipe.steps, disable=rank != 0, desc="sft")
    for step in progress:
        began = time.perf_counter()
        micro = [
            batch_on_device(indices, train)
            for indices in step_batches(
                len(train), step=step, batch_size=recipe.batch_size, grad_accum=recipe.grad_accum,
                rank=rank, world_size=world, seed=recipe.seed, lengths=train_lengths,
            )
        ]
        targets = max(1.0, sum(count_targets(b["weights"]) for b in micro))
        loss_sum = 0.0
        for batch in micro:
            # Divided by the step's token count, so the accumulated gradient is the token mean.
            loss = forward_loss(batch) / targets
            loss_sum += loss.item()
            backward(loss, engine)
        if engine is not None:
            grad_norm = float(engine.get_global_grad_norm() or 0.0)
        else:
            clip = optim.grad_clip if optim.grad_clip > 0 else float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)

        tokens = sum(int(b["attention_mask"].sum()) for b in micro)
        loss_mean, tokens_all = all_reduce_sum(torch.tensor([loss_sum, tokens], dtype=torch.float64), world).tolist()
        metrics = {
            "losses/train": loss_mean / world,
            "optim/lr": scheduler.get_last_lr()[0],
            "optim/grad_norm": grad_norm,
            "perf/tokens_per_s": tokens_all / (time.perf_counter() - began),
        }
        done = step + 1
        if val and recipe.eval_every and (done % recipe.eval_every == 0 or done == recipe.steps):
            metrics["losses/val"] = validate()
        if logger is not None:
            logger.log(done, metrics)
            progress.set_postfix(loss=f"{metrics['losses/train']:.4f}")
        if recipe.save_every and done % recipe.save_every == 0:
            save(done)
            last_saved = done

    # ------------------------------------------------------------------ cleanup
    final = checkpoint_dir(run_dir, recipe.steps) if last_saved == recipe.steps else save(recipe.steps)
    if logger is not None:
        logger.close()
    return final
