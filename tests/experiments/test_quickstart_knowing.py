"""`simsearch quickstart simulator=knowing`: a simulator that read the world and is fit on other people."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from simsearch.config import QuickstartRecipe, load_recipe
from simsearch.errors import RecipeError
from simsearch.experiments import knowing, pipeline, quickstart
from simsearch.experiments import release as release_command
from simsearch.fingerprints import stage_fingerprint
from simsearch.tinyworld import knowing as tinyworld_knowing

# The quickstart's default world (seed 0), built in memory as its world stage builds it.
WORLD = {"seed": 0, "n_entities": 300, "n_train_entities": 200, "n_background_entities": 900}


def _recipe(run_dir: Path, *overrides: str) -> QuickstartRecipe:
    return load_recipe(QuickstartRecipe, None, [f"run_dir={run_dir}", "smoke=true", "simulator=knowing", *overrides])


def _names_in(text: str, names: set[str]) -> set[str]:
    return {word for word in re.findall(r"[A-Z][a-z]+", text) if word in names}


@pytest.fixture(scope="module")
def knowing_run(tmp_path_factory) -> tuple[Path, dict]:
    run_dir = tmp_path_factory.mktemp("knowing")
    return run_dir, quickstart.main(_recipe(run_dir))


def test_an_unknown_simulator_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"simulator='oracle' is not one of knowing, fit"):
        load_recipe(QuickstartRecipe, None, [f"run_dir={tmp_path}", "simulator=oracle"])


@pytest.mark.slow
def test_the_knowing_simulator_read_the_world_and_was_fit_on_other_people(knowing_run) -> None:
    run_dir, report = knowing_run
    world = pipeline.build_world(**WORLD)
    fit = set(tinyworld_knowing.fit_people(world, knowing.KNOWING_FIT_PEOPLE))
    # Its SFT pairs ask about the fit people only: never one RL asks about, never a held-out one.
    pairs = [
        json.loads(line)
        for name in ("train.jsonl", "val.jsonl")
        for line in (run_dir / "knowing" / "collect" / name).read_text().splitlines()
    ]
    assert pairs
    text = "\n".join(pair["prompt"] + pair["response"] for pair in pairs)
    assert _names_in(text, fit) and not _names_in(text, world.people("train") | world.people("test"))
    # It was fine-tuned from the knowing base (which read), on those pairs with reading mixed in.
    sft = yaml.safe_load((run_dir / "simulator" / "recipe.yaml").read_text())
    assert sft["model"]["path"] == str(run_dir / "knowing" / "base")
    assert sft["train_file"] == str(run_dir / "knowing" / "sft-mixed.jsonl")
    mixed = [json.loads(line) for line in Path(sft["train_file"]).read_text().splitlines()]
    collected = (run_dir / "knowing" / "collect" / "train.jsonl").read_text().splitlines()
    train_pairs = [json.loads(line) for line in collected]
    assert [row for row in mixed if row["prompt"]] == train_pairs
    assert sum(row["prompt"] == "" for row in mixed) == len(train_pairs)  # the reading (no prompt): half the file
    read = "\n".join(row["response"] for row in mixed if row["prompt"] == "")
    assert not _names_in(read, world.people("test"))  # no held-out person's fact in anything it read
    # RL searched it alone; its report is the quickstart's.
    engines = json.loads((run_dir / "train" / "cost.json").read_text())["engines"]
    assert [usage["kind"] for usage in engines.values()] == ["simulator"]
    assert set(report["em"]) == {"base", "rl_search", "rl_nosearch"} and report["released"] == []


@pytest.mark.slow
def test_the_knowing_stages_run_under_the_fingerprints_planned_for_the_release(knowing_run) -> None:
    run_dir, _ = knowing_run
    planned = pipeline.planned_fingerprints(_recipe(run_dir))
    folders = {"world": "world", "base": "base", "collect": "knowing/collect", "simulator": "simulator"}
    built = {stage: stage_fingerprint(run_dir / folder) for stage, folder in folders.items()}
    assert planned == built
    # The fit simulator of the same world is another stage.
    fit = pipeline.planned_fingerprints(_recipe(run_dir, "simulator=fit"))
    assert fit["simulator"] != planned["simulator"] and fit["base"] == planned["base"]


class Built(Exception):
    """Raised by a stage's builder that must not run: its model was to be installed from the release."""


def _refuse(*args, **kwargs):
    raise Built


@pytest.mark.slow
def test_a_released_knowing_simulator_is_installed_with_nothing_before_it_built(
    knowing_run, tmp_path: Path, monkeypatch
) -> None:
    first_dir, first = knowing_run
    release = tmp_path / "release"
    release_command.ship(first_dir, release, commit="abc1234")
    monkeypatch.setattr(pipeline, "RELEASE", release)
    monkeypatch.setattr(knowing, "pretrain_knowing_base", _refuse)
    monkeypatch.setattr(pipeline.simulator_finetune, "main", _refuse)
    monkeypatch.setattr(pipeline.simulator_collect, "main", _refuse)
    monkeypatch.setattr(pipeline, "pretrain_base", _refuse)
    second = quickstart.main(_recipe(tmp_path / "run"))
    assert second["released"] == ["base", "simulator"] and not (tmp_path / "run" / "knowing").exists()
    volatile = {"wall_s", "stage_s", "peak_rss_gb", "released"}
    assert {k: v for k, v in second.items() if k not in volatile} == {
        k: v for k, v in first.items() if k not in volatile
    }
    # A fit quickstart of the same world does not take it: its simulator's fingerprint differs.
    with pytest.raises(Built):
        quickstart.main(_recipe(tmp_path / "fit", "simulator=fit"))
