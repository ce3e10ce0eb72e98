"""benchmarks/recipes.py: its pure parts by hand, and `--smoke` end to end (every CPU recipe for two steps)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import recipes


def test_first_and_last_average_five_steps_or_each_half() -> None:
    rewards = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1]
    # first five: (0 + .1 + .2 + .3 + .4) / 5 = 0.2; last five: (.7 + .8 + .9 + 1 + 1.1) / 5 = 0.9
    assert recipes.first_and_last(rewards) == pytest.approx((0.2, 0.9))
    assert recipes.first_and_last([0.0, 1.0, 3.0]) == (0.0, 3.0)  # 3 steps: halves of one step


def test_moved_paths_point_every_quickstart_path_at_the_artifacts() -> None:
    overrides = recipes.moved_paths(recipes.CPU_RECIPES["tiny_cpu"], "/tmp/qs")
    assert "policy.model.path=/tmp/qs/base" in overrides
    assert "data.train=[/tmp/qs/world/train.jsonl]" in overrides
    assert "search.index_dir=/tmp/qs/index/bm25" in overrides
    assert not any(o.startswith("run_dir=") for o in overrides)  # the benchmark gives each its own


@pytest.mark.slow
def test_smoke_trains_every_cpu_recipe_and_prints_the_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipes.main(["--smoke", "--run-dir", str(tmp_path), "--threads", "1"])
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # the JSON is the last line
    assert figures["smoke"] is True and figures["threads"] == 1
    for name in recipes.CPU_RECIPES:
        assert figures[name]["steps"] == 2, name
        # two steps: the first and last halves are step 1 and step 2 of the recipe's own log, rounded
        log = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        first, last = (round(json.loads(line)["reward/mean"], 4) for line in log)
        assert (figures[name]["reward_first5"], figures[name]["reward_last5"]) == (first, last), name
        assert (tmp_path / name / "checkpoints" / "step_0000002" / "model").is_dir()
