"""Metrics rows are appended per step and cut back on resume."""

from pathlib import Path

from simsearch.training.runlog import RunLogger, read_metrics


def test_rows_are_appended_and_resume_drops_later_steps(tmp_path: Path) -> None:
    log = RunLogger(tmp_path, tensorboard=True)
    for step in (1, 2, 3):
        log.log(step, {"reward/mean": step / 10, "losses/policy": float("nan") if step == 3 else 0.5})
    log.close()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["reward/mean"] == 0.1 and rows[2]["losses/policy"] is None
    assert any((tmp_path / "tensorboard").iterdir())
    resumed = RunLogger(tmp_path, resume_step=2)
    resumed.log(3, {"reward/mean": 0.7})
    resumed.close()
    assert [(r["step"], r["reward/mean"]) for r in read_metrics(tmp_path)] == [(1, 0.1), (2, 0.2), (3, 0.7)]
