"""The optimizer and learning-rate schedule both training commands use.

AdamW over the trainable parameters with a linear warmup then a constant, linear or cosine
multiplier. Departure from the usual warmup (e.g. transformers' `get_*_schedule_with_warmup`, and
verl's `get_constant_schedule_with_warmup` in `verl/utils/torch_functional.py`, min(1, s / warmup),
both starting at 0): the first step already runs at 1/warmup of the base rate, so no step is
wasted on a zero learning rate; the schedule reaches the full rate one step earlier than verl's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """Multiplier of the base learning rate at optimizer step `step` (0-based).

    Warmup is linear, (step + 1) / warmup_steps, so the first step already moves the weights;
    then "constant" holds 1, "linear" decays to 0 at `total_steps`, "cosine" follows
    0.5 · (1 + cos(π · progress)) with progress = (step − warmup) / (total − warmup).

    Raises:
        ValueError: `schedule` is not constant, linear or cosine.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"schedule={schedule!r} is not one of constant, linear, cosine")


def adamw_with_schedule(
    params: Iterable[torch.nn.Parameter],
    *,
    lr: float,
    betas: Sequence[float],
    weight_decay: float,
    warmup_steps: int,
    total_steps: int,
    schedule: str,
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `params` and the `lr_factor` schedule that drives it.

    Args:
        params: The parameters to train (the caller leaves out frozen ones).
        lr: Base learning rate.
        betas: AdamW's (beta1, beta2).
        weight_decay: AdamW's decoupled weight decay.
        warmup_steps: Scheduler steps of linear warmup.
        total_steps: Scheduler steps at which "linear" reaches 0 and "cosine" its minimum.
        schedule: "constant", "linear" or "cosine" after the warmup.

    Returns:
        (optimizer, scheduler); the caller decides how often the scheduler steps.
    """
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(betas[0], betas[1]), weight_decay=weight_decay)
    # A plain function, not a callable object: LambdaLR then leaves it out of its state dict.
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_factor(s, warmup_steps=warmup_steps, total_steps=total_steps, schedule=schedule),
    )
    return optimizer, scheduler
