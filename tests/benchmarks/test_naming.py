"""benchmarks/naming.py: its tallies by hand (the end-to-end run is in test_controls' smoke test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import naming, study
from simsearch.tinyworld.world import build_world

WORLD = build_world(seed=0, n_entities=12, n_train_entities=6)


def _sample(query: str) -> dict:
    return {"turns": [], "response": f"<search> {query} </search>\n\n<answer> x </answer>"}


def test_probe_cells_split_the_em_by_whether_the_first_query_names_the_person(tmp_path: Path) -> None:
    ids = list(WORLD.facts)[:4]
    name = [WORLD.facts[i].entity for i in ids]
    rows = [  # two named (one right), one miscopied (right), one unnamed (wrong)
        {"id": ids[0], "samples": [_sample(f"{name[0]} born")], "scores": {"em": 1.0}},
        {"id": ids[1], "samples": [_sample(name[1])], "scores": {"em": 0.0}},
        {"id": ids[2], "samples": [_sample(name[2][:3] + "zz")], "scores": {"em": 1.0}},
        {"id": ids[3], "samples": [_sample("where born")], "scores": {"em": 0.0}},
    ]
    examples = tmp_path / "examples" / "none" / "train.jsonl"
    examples.parent.mkdir(parents=True)
    examples.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cells = naming._naming_cells(tmp_path, WORLD, "none/train")
    assert cells["em"] == pytest.approx(50.0)
    assert cells["named_share"] == pytest.approx(0.5)
    assert cells["em_named"] == pytest.approx(0.5)
    assert cells["em_unnamed"] == pytest.approx(0.5)  # the miscopied one counts as not named


def test_training_naming_tallies_reward_by_naming_in_each_half(tmp_path: Path) -> None:
    ids = list(WORLD.facts)[:2]
    person = WORLD.facts[ids[0]].entity

    def row(step: int, query: str, reward: float) -> dict:
        return {"step": step, "id": ids[0], "reward": reward, "turns": [], "response": f"<search> {query} </search>"}

    rows = [row(1, "when", 0.0), row(2, person, 0.0), row(3, person, 1.0), row(4, person, 1.0), row(4, "x", 0.0)]
    (tmp_path / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    halves = naming.training_naming(tmp_path, WORLD)
    assert halves["first_half"] == {"samples": 2, "named_share": 0.5, "reward_named": 0.0, "reward_unnamed": 0.0}
    second = halves["second_half"]
    assert second["samples"] == 3 and second["named_share"] == pytest.approx(2 / 3)
    assert second["reward_named"] == 1.0 and second["reward_unnamed"] == 0.0


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
