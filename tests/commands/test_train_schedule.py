"""`simsearch train` with several optimizer steps per training step and a warm-up ratio, on CPU.

PPO-style updates: `algorithm.ppo_epochs` passes over `algorithm.minibatch_size`-trajectory
minibatches, one optimizer step each; the learning-rate schedule advances once per training step
(as verl's), so every optimizer step of a training step runs at that step's rate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import simsearch.training.session as session
from simsearch.commands import train
from simsearch.errors import RecipeError
from simsearch.training.runlog import read_metrics
from tests.commands import test_train
from tests.commands.test_train import _finite_losses, _recipe

# The module-scoped fixture of test_train.py: QA files, a corpus, a tiny policy that searches.
world = test_train.world

LR = 1e-3


def test_minibatch_epochs_take_several_steps_at_the_training_steps_warmup_rate(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rates: list[float] = []  # the policy optimizer's learning rate at each of its steps
    real = session.adamw_with_schedule

    def recording(*args: Any, **kwargs: Any) -> Any:
        optimizer, scheduler = real(*args, **kwargs)
        if not rates and kwargs["lr"] == LR:  # the policy's (a critic would have its own lr)
            step = optimizer.step

            def recorded_step(*a: Any, **k: Any) -> Any:
                rates.append(optimizer.param_groups[0]["lr"])
                return step(*a, **k)

            optimizer.step = recorded_step  # type: ignore[method-assign]
        return optimizer, scheduler

    monkeypatch.setattr(session, "adamw_with_schedule", recording)
    # 2 prompts x 4 rollouts = 8 trajectories: 2 minibatches of 4, 2 epochs -> 4 optimizer steps per
    # training step. warmup_ratio 0.75 of 4 steps -> 3 warm-up steps: rates 1/3, 2/3, 1, 1 x lr.
    settings = {"algorithm.ppo_epochs": 2, "algorithm.minibatch_size": 4, "optim.warmup_ratio": 0.75}
    run = tmp_path / "run"
    train.main(_recipe(world, run, steps=4, **{"optim.lr": LR}, **settings))

    expected = [LR / 3] * 4 + [2 * LR / 3] * 4 + [LR] * 8
    assert len(rates) == len(expected)
    torch.testing.assert_close(torch.tensor(rates), torch.tensor(expected), rtol=1e-12, atol=0)
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(_finite_losses(r) for r in rows)
    # Logged after the step's scheduler step, as verl logs actor/lr: the next step's rate.
    assert [r["optim/lr"] for r in rows] == pytest.approx([2 * LR / 3, LR, LR, LR], rel=1e-12)


def test_warmup_steps_and_ratio_are_exclusive(world: Path, tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"optim.warmup_steps=2 and optim.warmup_ratio=0.5 both set"):
        _recipe(world, tmp_path / "run", **{"optim.warmup_steps": 2, "optim.warmup_ratio": 0.5})


def test_the_critic_warms_up_over_its_own_share_of_the_run(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: dict[float, int] = {}  # lr -> warm-up steps of each optimizer built
    real = session.adamw_with_schedule

    def recording(*args: Any, **kwargs: Any) -> Any:
        built[kwargs["lr"]] = kwargs["warmup_steps"]
        return real(*args, **kwargs)

    monkeypatch.setattr(session, "adamw_with_schedule", recording)
    # 4 steps: the actor warms up over int(0.75 x 4) = 3, the critic over int(0.25 x 4) = 1.
    settings = {"algorithm.estimator": "ppo", "optim.warmup_ratio": 0.75, "algorithm.critic_warmup_ratio": 0.25}
    train.main(_recipe(world, tmp_path / "run", steps=4, **{"optim.lr": LR}, **settings))
    assert built == {LR: 3, 1e-5: 1}
    built.clear()
    # Without a share of its own the critic takes the actor's warm-up.
    ppo = {"algorithm.estimator": "ppo", "optim.lr": LR, "optim.warmup_steps": 2}
    train.main(_recipe(world, tmp_path / "run2", steps=1, **ppo))
    assert built == {LR: 2, 1e-5: 2}
