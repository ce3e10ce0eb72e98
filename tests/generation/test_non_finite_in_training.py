"""A policy whose logits turn inf or nan mid-run: `simsearch train` ends with one line, the last checkpoint intact."""

from __future__ import annotations

from pathlib import Path

import pytest

from simsearch.cli import main
from simsearch.training.checkpoint import latest_checkpoint, load_state
from simsearch.training.runlog import read_metrics
from tests.commands.test_train import _overrides, world  # noqa: F401  (the fixture: a tiny policy and its data)


@pytest.mark.slow  # ~10 s: two train steps of a tiny policy
def test_an_overflowed_policy_stops_training_with_one_line_and_its_checkpoint_kept(
    world: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    run = tmp_path / "run"
    # Adam moves every weight by about lr per step: at 1e30, step 1's update overflows the next
    # forward (RMSNorm squares 1e30 values), so step 2's rollout gets inf / nan logits.
    overrides = _overrides(world, run, steps=3, save_every=1, **{"optim.lr": 1e30, "optim.warmup_steps": 0})
    (tmp_path / "recipe.yaml").write_text("seed: 0\n")
    assert main(["train", str(tmp_path / "recipe.yaml"), *overrides]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "simsearch: error:" in line or "Traceback" in line]
    assert len(err) == 1  # one line, no traceback: the step, the rows, the checkpoint kept, what to do
    assert err[0].startswith("simsearch: error: training stopped in step 2/3: rollout turn 1, questions [")
    assert "logits are inf or nan" in err[0] and "at generated token 1" in err[0]
    assert f"the last good checkpoint is {run / 'checkpoints' / 'step_0000001'} (step 1)" in err[0]
    assert "lower optim.lr (now 1e+30)" in err[0] and "policy.model.dtype=float32" in err[0]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_0000001"]
    assert load_state(latest_checkpoint(run))["step"] == 1
    assert [r["step"] for r in read_metrics(run)] == [1]
