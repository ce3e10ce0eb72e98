"""benchmarks/naming.py: its tallies by hand (the end-to-end run is in test_controls' smoke test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import naming, study
from simsearch.tinyworld.world import build_world

WORLD = build_world(seed=0, n_entities=12, n_train_entities=6)


@pytest.mark.parametrize(
    ("argv", "message"),
    [([], "--controls (not given): no such directory"), (["--controls", "missing"], "--controls missing: no such"),
     (["--controls", ".", "--seeds", "3"], "--controls .: world 3 holds no finished quickstart")],
)  # fmt: skip
def test_a_directory_without_a_controls_run_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as refused:
        naming.main(argv)
    assert refused.value.code == 2 and message in capsys.readouterr().err


def test_a_worker_reads_the_controls_run_and_writes_its_record_in_the_run_directory(tmp_path: Path) -> None:
    (tmp_path / "world_0" / "quickstart").mkdir(parents=True)
    (tmp_path / "world_0" / "quickstart" / "recipe.yaml").write_text("seed: 0\n")
    argv = ["--controls", str(tmp_path), "--run-dir", str(tmp_path / "probes"), "--reseed", "7"]
    args = study.parse(naming.STUDY, argv)
    worker = study.parse(naming.STUDY, study.worker_arguments(0, args, argv))
    assert (worker.one_world, worker.controls, worker.run_dir, worker.reseed) == (0, tmp_path, tmp_path / "probes", [7])
