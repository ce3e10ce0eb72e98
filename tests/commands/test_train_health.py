"""`simsearch train`'s health monitor end to end on the toy world: warn, stop and rollback.

A deliberately tiny threshold makes an alarm fire at step 2: `entropy_high` with a one-step
baseline and window, at 1.05 x the first step's entropy. On the toy world at `optim.lr=1e-3` the
second step's entropy is 1.07 to 1.5 x the first's, by CPU. The rollback test needs a second alarm
after the rollback at half the rate, which entropy gives on some CPUs only: it uses `EVERY_CPU`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import simsearch.commands.train as train
from simsearch.config import TrainRecipe, load_recipe
from simsearch.training.checkpoint import checkpoint_dir, load_state
from simsearch.training.health import STOP_STATUS
from simsearch.training.runlog import read_metrics
from tests.toy_world import TRAIN_SETTINGS, build_world

TINY = {"health.baseline_steps": 1, "health.window": 1, "health.rules": "[entropy_high]",
        "health.entropy_high": 1.05}  # fmt: skip
"""An alarm at step 2 (see the module docstring)."""
EVERY_CPU = {"health.rules": "[no_signal]", "health.flat_max": 0.0, "health.flat_window": 2}
"""An alarm at step 2 on any CPU: the mean of a share of flat groups over two steps is always >= 0."""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_world(tmp_path_factory.mktemp("health_world"))


def _recipe(world: Path, run_dir: Path, **extra: object) -> TrainRecipe:
    base = {"run_dir": run_dir, "policy.model.path": world / "policy", "data.train": f"[{world / 'train.jsonl'}]",
            "search.corpus": world / "corpus.jsonl", **TRAIN_SETTINGS, **TINY, **extra}  # fmt: skip
    return load_recipe(TrainRecipe, None, [f"{key}={value}" for key, value in base.items()])


def _health(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "health.jsonl").read_text().splitlines()]


def test_warn_records_the_alarm_and_trains_on(world: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train.main(_recipe(world, run_dir, steps=3))
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in ("health/entropy", "health/ratio_mean", "health/ratio_max", "health/search_share",
                "health/repeat_ngram_share", "health/group_reward_std", "time/health_s"):  # fmt: skip
        assert all(math.isfinite(r[key]) for r in rows), key
    assert rows[0]["health/ratio_mean"] == 1.0  # one on-policy update: every ratio is 1
    (alarm,) = _health(run_dir)
    assert (alarm["step"], alarm["rule"], alarm["signal"], alarm["action"]) == (
        2,
        "entropy_high",
        "health/entropy",
        "warn",
    )
    assert alarm["value"] == pytest.approx(rows[1]["health/entropy"])
    assert alarm["threshold"] == pytest.approx(1.05 * rows[0]["health/entropy"])
    state = load_state(checkpoint_dir(run_dir, 3))["health"]  # the monitor resumes with the run
    assert state["first"]["health/entropy"] == [pytest.approx(rows[0]["health/entropy"])]
    assert state["rollbacks"] == 0 and state["lr_scale"] == 1.0


def test_stop_saves_the_step_and_exits_with_the_health_status(world: Path, tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as stopped:
        train.main(_recipe(world, run_dir, steps=4, **{"health.on_alarm": "stop"}))
    assert stopped.value.code == STOP_STATUS == 3
    assert (checkpoint_dir(run_dir, 2) / "model").is_dir()
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]
    assert [row["action"] for row in _health(run_dir)] == ["stop"]
    err = capsys.readouterr().err
    assert "stopped by the health monitor after step 2/4 (entropy_high" in err and "resume=force" in err


def test_rollback_reloads_with_the_lr_scaled_then_stops_past_max_rollbacks(world: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # Whether entropy_high fires again after the rollback depends on the CPU's floats: a rule that always fires.
    recipe = _recipe(world, run_dir, steps=3, save_every=1, **EVERY_CPU,
                     **{"health.on_alarm": "rollback", "health.max_rollbacks": 1, "health.lr_scale": 0.5})  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        train.main(recipe)
    assert stopped.value.code == STOP_STATUS
    first, rolled, second = _health(run_dir)
    assert (first["step"], first["rule"], first["action"]) == (2, "no_signal", "rollback")
    # window 2: the values of steps 1 and 2 came from the weights before each, so the run goes back to the start
    assert (rolled["action"], rolled["to_step"], rolled["lr_scale"]) == ("rolled_back", 0, 0.5)
    assert (second["step"], second["action"]) == (2, "stop")  # fired again after 1 of 1 rollbacks
    assert (run_dir / "checkpoints" / "rolled_back" / "step_0000001").is_dir()
    rows = read_metrics(run_dir)  # the replayed steps, at half the rate
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["optim/lr"] for r in rows] == [pytest.approx(5e-4)] * 2
    state = load_state(checkpoint_dir(run_dir, 2))["health"]
    assert (state["rollbacks"], state["lr_scale"]) == (1, 0.5)


def test_losses_entropy_is_the_token_mean_with_several_micro_batches(world: Path, tmp_path: Path) -> None:
    # 8 trajectories a step in micro-batches of 2: each micro-batch's entropy part is over the minibatch's
    # tokens, so weighting it by the micro-batch's own tokens (as before) gave about a quarter of the mean.
    run_dir = tmp_path / "run"
    train.main(_recipe(world, run_dir, steps=2, micro_batch_size=2, **{"health.rules": "[]"}))
    for row in read_metrics(run_dir):
        assert row["losses/entropy"] == pytest.approx(row["health/entropy"], rel=1e-12) and row["losses/entropy"] > 0
