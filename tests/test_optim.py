"""The warmup + decay learning-rate factor, and the AdamW + LambdaLR pair both trainers build."""

from __future__ import annotations

import math

import pytest
import torch

from simsearch.errors import RecipeError
from simsearch.training.optim import adamw_with_schedule, lr_factor
from simsearch.training.recipe import OptimConfig


@pytest.mark.parametrize(
    ("step", "schedule", "expected"),
    [
        (0, "constant", 0.5),  # warmup 2: (0 + 1) / 2
        (1, "constant", 1.0),
        (5, "constant", 1.0),
        (2, "linear", 1.0),  # progress (2 - 2) / (10 - 2) = 0
        (6, "linear", 0.5),  # progress 4 / 8
        (10, "linear", 0.0),
        (6, "cosine", 0.5),  # 0.5 (1 + cos(pi / 2))
        (4, "cosine", 0.5 * (1 + math.cos(math.pi / 4))),  # progress 2 / 8
    ],
)
def test_lr_factor(step: int, schedule: str, expected: float) -> None:
    assert lr_factor(step, warmup_steps=2, total_steps=10, schedule=schedule) == pytest.approx(expected, abs=1e-12)


def test_lr_factor_names_an_unknown_schedule() -> None:
    with pytest.raises(ValueError, match="schedule='step' is not one of constant, linear, cosine"):
        lr_factor(3, warmup_steps=2, total_steps=10, schedule="step")


def test_adamw_with_schedule_drives_the_optimizer_with_lr_factor() -> None:
    weight = torch.nn.Parameter(torch.tensor([1.0]))
    optimizer, scheduler = adamw_with_schedule(
        [weight], lr=0.1, betas=[0.9, 0.95], weight_decay=0.1, warmup_steps=2, total_steps=4, schedule="linear"
    )
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.95) and group["weight_decay"] == 0.1
    # Step 0 of a 2-step warmup: 0.1 * (0 + 1) / 2.
    assert group["lr"] == pytest.approx(0.05, abs=1e-12)
    (2.0 * weight).sum().backward()  # gradient 2
    optimizer.step()
    # AdamW's first step: decay w <- 1 * (1 - 0.05 * 0.1) = 0.995, then w -= 0.05 * m̂ / (sqrt(v̂) + eps)
    # with m̂ = 2, v̂ = 4: 0.995 - 0.05 * 2 / (2 + 1e-8) = 0.945.
    assert weight.item() == pytest.approx(0.945, abs=1e-6)
    lrs = []
    for _ in range(3):
        scheduler.step()
        lrs.append(group["lr"])
    # Steps 1, 2, 3: warmup 2 / 2 = 1; progress (2 - 2) / (4 - 2) = 0 -> 1; progress 1 / 2 -> 0.5.
    assert lrs == pytest.approx([0.1, 0.1, 0.05], abs=1e-12)
    # A plain function schedule: nothing of it goes into a checkpoint.
    assert scheduler.state_dict()["lr_lambdas"] == [None]


def test_warmup_ratio_is_a_share_of_the_run_rounded_down_as_verl() -> None:
    # Search-R1: lr_warmup_steps_ratio 0.285 of 1005 steps -> int(286.425) = 286 (round() would too,
    # but 0.5 x 5 = 2.5 shows the floor: 2, not 3).
    assert OptimConfig(warmup_ratio=0.285).warmup_for(1005) == 286
    assert OptimConfig(warmup_ratio=0.5).warmup_for(5) == 2
    assert OptimConfig(warmup_steps=7).warmup_for(1005) == 7
    assert OptimConfig().warmup_for(1005) == 0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"warmup_steps": 10, "warmup_ratio": 0.1}, r"optim.warmup_steps=10 and optim.warmup_ratio=0.1 both set"),
        ({"warmup_ratio": 1.5}, r"optim.warmup_ratio=1.5 must lie in \[0.0, 1.0\]"),
        ({"warmup_steps": -1}, r"optim.warmup_steps=-1 must be >= 0"),
    ],
)
def test_warmup_settings_are_checked(settings: dict, message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        OptimConfig(**settings).check("optim")
