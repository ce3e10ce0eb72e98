"""`simsearch quickstart --smoke` runs every stage for a step or two and writes the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from simsearch.commands import quickstart
from simsearch.config import QuickstartRecipe, RecipeError, load_recipe


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
    for policy in ("base", "rl_search", "rl_nosearch"):
        assert (tmp_path / "eval" / policy / "summary.json").is_file()
    for plot in ("bars.png", "curves.png"):
        with Image.open(tmp_path / plot) as image:
            assert image.size[0] >= 800 and image.size[1] >= 400


def test_missing_stage_recipes_are_a_clear_error(tmp_path: Path) -> None:
    recipe = load_recipe(QuickstartRecipe, None, [f"run_dir={tmp_path}", f"recipes_dir={tmp_path}"])
    with pytest.raises(RecipeError, match="no quickstart recipes in"):
        quickstart.main(recipe)
