"""benchmarks/budget.py: the rule and the figures by hand, and `--smoke` end to end."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from benchmarks import budget, study

PROVENANCE = {"commit": "abc1234", "cpu": "Some CPU", "torch_threads": 1, "jobs": 1}  # as the runner gives it


def _world(em: dict[str, tuple[float, float]]) -> dict:
    """A world's record: steps -> (BM25, dense) EM; the full run is the most steps."""
    return {
        "full": max(map(int, em)),
        "em": {steps: {"bm25": bm25, "dense": dense} for steps, (bm25, dense) in em.items()},
        "rl_s": {steps: 2.5 * int(steps) for steps in em},
    }


def test_the_rule_takes_the_fewest_steps_within_the_tolerance_on_every_engine() -> None:
    worlds = {
        100: _world({"50": (60.0, 50.0), "100": (69.0, 58.0), "150": (70.0, 59.0), "250": (70.0, 60.0)}),
        101: _world({"50": (58.0, 54.0), "100": (70.0, 60.0), "150": (71.0, 60.0), "250": (71.0, 61.0)}),
    }
    figures = budget.summarize(worlds, argparse.Namespace())
    # 50 steps: -11.5 on BM25; 100: -1.0 / -1.5, within 2 points on both engines; 150 also, but more steps.
    assert figures["chosen"] == 100 and figures["full"] == 250
    assert [figures["minus_full"]["100"][engine]["mean"] for engine in budget.ENGINES] == [-1.0, -1.5]
    assert figures["em"]["50"] == {"bm25": 59.0, "dense": 52.0} and figures["rl_s"]["100"] == 250.0
    assert "250" not in figures["minus_full"]
    worlds[101]["em"]["100"]["dense"] = 55.0  # dense now 3.5 points under: the rule skips 100 for 150
    assert budget.summarize(worlds, argparse.Namespace())["chosen"] == 150
    for world in worlds.values():  # every shorter budget loses more than 2 points: the full run stays
        for steps in ("50", "100", "150"):
            world["em"][steps]["bm25"] -= 10.0
    assert budget.summarize(worlds, argparse.Namespace())["chosen"] == 250


def test_worlds_of_different_full_runs_are_not_summed_up() -> None:
    worlds = {0: _world({"1": (1.0, 1.0), "2": (2.0, 2.0)}), 1: _world({"1": (1.0, 1.0), "250": (2.0, 2.0)})}
    with pytest.raises(SystemExit, match="full runs differ"):
        budget.summarize(worlds, argparse.Namespace())


def test_the_page_shows_each_world_the_differences_and_the_pick(tmp_path: Path) -> None:
    worlds = {
        str(seed): _world({"100": (70.0 + d, 60.0), "250": (70.0, 60.0 + d)}) for seed, d in ((100, -1.0), (101, 1.0))
    }
    figures = budget.summarize({int(seed): world for seed, world in worlds.items()}, argparse.Namespace())
    figures.update(smoke=False, provenance=PROVENANCE)
    text = budget.page(figures, argparse.Namespace(jobs=1, threads=1, run_dir=Path("runs/controls")))["results"]
    assert "`python -m benchmarks.budget --seeds 100 101 --jobs 1 --threads 1 --run-dir runs/controls`" in text
    assert "| 100 | 69.0 / 60.0 | 70.0 / 59.0 |" in text and "| 101 | 71.0 / 60.0 | 70.0 / 61.0 |" in text
    # 100 - 250 per world: BM25 -1, +1 (mean 0, t-interval 0 -+ 12.706 x 1.414 / sqrt(2)); dense +1, -1
    assert "| 100 | no measurable difference (0.0; -12.7 to +12.7) |" in text and "picks **100 steps**" in text


@pytest.mark.slow
def test_smoke_trains_each_budget_as_the_quickstart_trains(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    budget.main(["--smoke", "--run-dir", str(tmp_path), "--threads", "1"])
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["full"] == 2 and set(figures["em"]) == {"1", "2"} and figures["chosen"] in (1, 2)
    world = tmp_path / "world_0"
    full = OmegaConf.to_container(OmegaConf.load(world / "quickstart" / "train" / "recipe.yaml"))
    short = OmegaConf.to_container(OmegaConf.load(world / "budget" / "steps_1" / "recipe.yaml"))
    assert isinstance(full, dict) and isinstance(short, dict)
    # The same RL recipe as the quickstart's own run but for its budget, run directory and cache.
    assert (short.pop("steps"), full.pop("steps")) == (1, 2)
    assert short.pop("run_dir") != full.pop("run_dir")
    assert short["search"].pop("cache") != full["search"].pop("cache")
    assert short == full
    rows = [json.loads(line) for line in (world / "budget" / "steps_1" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1]
    summary = json.loads((world / "eval_budget" / "steps_1" / "summary.json").read_text())
    assert set(summary["rows"]) == set(budget.ENGINES)
    text = (tmp_path / "budget.md").read_text()
    assert "smoke: a pipeline check" in text and "(1 world: no interval)" in text
    assert study.parse(budget.STUDY, []).seeds == [100, 101, 102]
