"""Pretraining the quickstart's tiny "base" model on traces, in-process.

The loss is the LM loss on the tokens the policy generates plus a weighted copy loss on the
information tokens `Trace.copy_mask` marks; other information tokens are out of the loss, as in RL.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from simsearch.tinyworld.traces import Trace


def trace_loss(
    model: PreTrainedModel,
    traces: Sequence[Trace],
    *,
    copy_loss_weight: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The pretraining loss `policy + copy_loss_weight * copy`, each a mean over its own marked targets.

    `model` is a Hugging Face causal LM with `get_decoder()` and `get_output_embeddings()`.

    Returns:
        (total loss with gradient, {"losses/total", "losses/policy", "losses/copy"} as floats).
    """
    device = next(model.parameters()).device
    ids, policy_mask, copy = _batch_tensors(traces, copy_loss_weight)
    shared = _shared_prefix(traces, policy_mask + copy)
    ids, policy_mask, copy = ids.to(device), policy_mask.to(device), copy.to(device)
    hidden = _suffix_hidden_states(model, ids, shared)  # [B, L-P, H]
    targets = ids[:, shared + 1 :]  # [B, L-P-1]: position i is predicted from hidden state i-1
    policy_mask, copy = policy_mask[:, shared + 1 :], copy[:, shared + 1 :]
    selected = (policy_mask + copy) > 0  # [B, L-P-1]
    # The vocabulary projection runs only on positions with a marked target.
    logits = model.get_output_embeddings()(hidden[:, :-1][selected])  # [N, V]
    token_loss = F.cross_entropy(logits.float(), targets[selected], reduction="none")  # [N]
    policy_weights = policy_mask[selected].float()  # [N]
    copy_weights = copy[selected].float()  # [N]
    policy_loss = (token_loss * policy_weights).sum() / policy_weights.sum().clamp(min=1.0)
    copy_loss = (token_loss * copy_weights).sum() / copy_weights.sum().clamp(min=1.0)
    total = policy_loss + copy_loss_weight * copy_loss
    stats = {
        "losses/total": total.item(),
        "losses/policy": policy_loss.item(),
        "losses/copy": copy_loss.item(),
    }
    return total, stats


def _batch_tensors(traces: Sequence[Trace], copy_loss_weight: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids, policy mask and copy mask of the batch, right-padded with zeros: each [B, L]."""
    width = max(len(t.input_ids) for t in traces)
    ids = torch.zeros((len(traces), width), dtype=torch.long)  # [B, L]
    policy_mask = torch.zeros_like(ids)
    copy = torch.zeros_like(ids)
    for b, trace in enumerate(traces):
        length = len(trace.input_ids)
        ids[b, :length] = torch.tensor(trace.input_ids)
        policy_mask[b, :length] = torch.tensor(trace.loss_mask)
        copy[b, :length] = torch.tensor(trace.copy_mask)
    if copy_loss_weight == 0:
        copy.zero_()
    return ids, policy_mask, copy


def _suffix_hidden_states(model: PreTrainedModel, ids: torch.Tensor, shared: int) -> torch.Tensor:
    """The decoder's last hidden states after the first `shared` positions, the shared prefix run once: [B, L-P, H]."""
    decoder = model.get_decoder()
    cache = None
    if shared > 0:
        cache = decoder(input_ids=ids[:1, :shared], use_cache=True).past_key_values
        for layer in cache.layers:  # [1, kv_heads, P, head_dim] -> [B, kv_heads, P, head_dim]
            layer.keys = layer.keys.expand(len(ids), -1, -1, -1)
            layer.values = layer.values.expand(len(ids), -1, -1, -1)
    suffix = decoder(input_ids=ids[:, shared:], past_key_values=cache, use_cache=cache is not None)
    return suffix.last_hidden_state


def _shared_prefix(traces: Sequence[Trace], marked: torch.Tensor) -> int:
    """Length P of the prefix shared by all traces with no marked target at or before P (`marked`: [B, L])."""
    first = traces[0].input_ids
    common = min(len(t.input_ids) for t in traces)
    for trace in traces[1:]:
        common = next((i for i, (a, b) in enumerate(zip(first, trace.input_ids[:common])) if a != b), common)
    positions = marked.nonzero()[:, 1]
    first_marked = int(positions.min()) if len(positions) else common + 1
    # Keep at least one token for the second pass (which also predicts the first suffix token).
    return max(0, min(common, first_marked - 1, common - 1))


def pretrain(
    model: PreTrainedModel,
    traces: Sequence[Trace],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    copy_loss_weight: float,
    seed: int,
    warmup: float = 0.05,
    min_lr_ratio: float = 0.1,
    weight_decay: float = 0.01,
    max_grad_norm: float = 1.0,
    progress: bool = True,
) -> dict[str, list[float]]:
    """Trains `model` in place on `traces` (AdamW, linear warmup, cosine decay, clipping); leaves it in eval mode.

    Args:
        steps: Optimizer steps.
        batch_size: Traces per step.
        seed: Seeds the batch order (a shuffle per epoch).
        warmup: Share of `steps` warming up linearly from 0 to `lr`.
        min_lr_ratio: The cosine ends at `lr * min_lr_ratio`.

    Returns:
        Per-step lists under "losses/total", "losses/policy", "losses/copy", "lr" and "grad_norm".

    Raises:
        ValueError: Non-positive steps or batch size, or no traces.
    """
    if steps < 1 or batch_size < 1 or not traces:
        raise ValueError(f"steps={steps} and batch_size={batch_size} must be >= 1 and traces non-empty")
    warmup_steps = max(1, round(warmup * steps))
    schedule = functools.partial(_lr_factor, warmup_steps=warmup_steps, steps=steps, min_lr_ratio=min_lr_ratio)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    batches = _batch_order(len(traces), batch_size, seed)
    keys = ("losses/total", "losses/policy", "losses/copy", "lr", "grad_norm")
    history: dict[str, list[float]] = {key: [] for key in keys}
    model.train()
    try:
        bar = tqdm(range(steps), desc="pretrain", disable=not progress)
        for _ in bar:
            batch = [traces[i] for i in next(batches)]
            stats = _train_step(model, optimizer, scheduler, batch, copy_loss_weight, max_grad_norm)
            for key in keys:
                history[key].append(stats[key])
            bar.set_postfix(policy=f"{stats['losses/policy']:.3f}", copy=f"{stats['losses/copy']:.3f}")
    finally:
        model.eval()
    return history


def _train_step(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: list[Trace],
    copy_loss_weight: float,
    max_grad_norm: float,
) -> dict[str, float]:
    """One optimizer step: `trace_loss`'s stats plus "lr" and "grad_norm" (before clipping)."""
    loss, stats = trace_loss(model, batch, copy_loss_weight=copy_loss_weight)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    lr = float(scheduler.get_last_lr()[0])
    optimizer.step()
    scheduler.step()
    return {**stats, "lr": lr, "grad_norm": float(grad_norm)}


def _lr_factor(step: int, *, warmup_steps: int, steps: int, min_lr_ratio: float) -> float:
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    done = (step - warmup_steps) / max(1, steps - warmup_steps)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * done))


def _batch_order(n: int, batch_size: int, seed: int) -> Iterator[list[int]]:
    """Trace indices of each batch: slices of a seeded shuffle, topped up with a fresh one."""
    rng = random.Random(seed)
    order: list[int] = []
    while True:
        if len(order) < batch_size:
            fresh = list(range(n))
            rng.shuffle(fresh)
            order += fresh
        batch, order = order[:batch_size], order[batch_size:]
        yield batch
