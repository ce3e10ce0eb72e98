"""`simsearch quickstart --smoke` runs every stage for a step or two and writes the report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from PIL import Image

from simsearch.commands import quickstart
from simsearch.config import QuickstartRecipe, RecipeError, load_recipe
from simsearch.errors import SimsearchError


@pytest.mark.slow
def test_smoke_runs_every_stage_and_writes_the_report(tmp_path: Path) -> None:
    result = quickstart.main(load_recipe(QuickstartRecipe, None, [f"run_dir={tmp_path}", "smoke=true"]))

    report = json.loads((tmp_path / "report.json").read_text())
    assert report == result
    assert report["smoke"] is True and report["wall_s"] > 0 and 0 < report["peak_rss_gb"] < 4
    assert set(report["em"]) == {"base", "rl_search", "rl_nosearch"}
    for scores in report["em"].values():
        assert set(scores) == {"simulator", "bm25", "dense"}
        assert all(0.0 <= v <= 100.0 for v in scores.values())
    # Every stage left its output where the next one (and a user) looks for it.
    assert (tmp_path / "base" / "config.json").is_file()
    assert (tmp_path / "collect" / "train.jsonl").stat().st_size > 0
    assert (tmp_path / "simulator" / "checkpoints").is_dir()
    for run in ("train", "train_nosearch"):
        rows = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(r)["step"] for r in rows] == [1, 2]
    assert "| rl_search |" in (tmp_path / "report.md").read_text()
    assert set(report["stage_s"]) == {"world", "pretrain", "collect", "simulator_sft", "rl", "eval"}
    # The second process (RL without search, two evaluations) logged to its own file.
    assert (tmp_path / "eval" / "base" / "summary.json").is_file() and "train" in (tmp_path / "side.log").read_text()
    for plot in ("bars.png", "curves.png"):
        with Image.open(tmp_path / plot) as image:
            assert image.size[0] >= 800 and image.size[1] >= 400


def test_missing_stage_recipes_are_a_clear_error(tmp_path: Path) -> None:
    recipe = load_recipe(QuickstartRecipe, None, [f"run_dir={tmp_path}", f"recipes_dir={tmp_path}"])
    with pytest.raises(RecipeError, match="no quickstart recipes in"):
        quickstart.main(recipe)


@pytest.mark.slow
def test_a_failure_in_the_second_process_is_reported_with_its_log(tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(quickstart._recipes_dir(load_recipe(QuickstartRecipe, None, [])), recipes)
    broken = recipes / "train_nosearch.yaml"
    broken.write_text(broken.read_text() + "no_such_key: 1\n")  # fails in the second process only
    run = tmp_path / "run"
    recipe = load_recipe(QuickstartRecipe, None, [f"run_dir={run}", "smoke=true", f"recipes_dir={recipes}"])
    with pytest.raises(SimsearchError, match=r"second process .* failed: see .*side\.log"):
        quickstart.main(recipe)
    assert "no_such_key" in (run / "side.log").read_text()  # the traceback is in the log named
