"""`simsearch.experiments.stages`: a stage runs its command once per fingerprint (the recipe file's name, the
inputs and the resolved recipe), one scheme for the quickstart's stages and every study's."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from simsearch.commands import evaluate, simulator_collect, simulator_finetune, train
from simsearch.config import CollectRecipe, EvalRecipe, FinetuneRecipe, TrainRecipe, load_recipe
from simsearch.experiments import stages
from simsearch.fingerprints import digest, stage_fingerprint

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "quickstart"


def test_a_stage_runs_once_per_fingerprint_and_again_when_its_inputs_change(tmp_path: Path) -> None:
    runs: list[TrainRecipe] = []
    overrides = [f"run_dir={tmp_path / 'train'}", "seed=3"]
    first = stages.run_stage(TrainRecipe, RECIPES / "train.yaml", overrides, runs.append, ["base"])
    again = stages.run_stage(TrainRecipe, RECIPES / "train.yaml", overrides, runs.append, ["base"])
    assert first == again == stage_fingerprint(tmp_path / "train") and len(runs) == 1
    other = stages.run_stage(TrainRecipe, RECIPES / "train.yaml", overrides, runs.append, ["another base"])
    assert other != first and len(runs) == 2


def test_an_edit_changes_the_recipe_before_it_is_fingerprinted_and_run(tmp_path: Path) -> None:
    runs: list[EvalRecipe] = []

    def bm25_only(recipe: EvalRecipe) -> None:
        recipe.engines = {"bm25": recipe.engines["bm25"]}

    overrides = [f"run_dir={tmp_path / 'eval'}"]
    fingerprint = stages.run_stage(EvalRecipe, RECIPES / "eval.yaml", overrides, runs.append, [], edit=bm25_only)
    recipe = load_recipe(EvalRecipe, RECIPES / "eval.yaml", overrides)
    bm25_only(recipe)
    assert list(runs[0].engines) == ["bm25"]
    assert fingerprint == digest({"stage": "eval", "inputs": [], "recipe": asdict(recipe)})


@pytest.mark.parametrize(
    ("helper", "schema", "file", "command"),
    [
        (stages.train_stage, TrainRecipe, "train.yaml", train),
        (stages.eval_stage, EvalRecipe, "eval.yaml", evaluate),
        (stages.collect_stage, CollectRecipe, "collect.yaml", simulator_collect),
        (stages.finetune_stage, FinetuneRecipe, "simulator.yaml", simulator_finetune),
    ],
)
def test_each_helper_runs_its_command_under_the_resolved_recipe_and_inputs(
    helper, schema, file, command, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list = []
    monkeypatch.setattr(command, "main", runs.append)
    overrides = [f"run_dir={tmp_path / 'stage'}", "seed=5"]
    fingerprint = helper(RECIPES / file, overrides, ["a", "b"])
    recipe = load_recipe(schema, RECIPES / file, overrides)
    assert runs == [recipe]
    assert fingerprint == digest({"stage": file.removesuffix(".yaml"), "inputs": ["a", "b"], "recipe": asdict(recipe)})


def test_under_a_root_a_stage_keeps_its_fingerprint_when_its_run_directory_moves(tmp_path: Path) -> None:
    def plan(root: Path, relative: bool) -> str:
        overrides = [f"run_dir={root / 'train'}", f"data.train=[{root / 'world' / 'train.jsonl'}]"]
        under = root if relative else None
        return stages.plan_stage(TrainRecipe, RECIPES / "train.yaml", overrides, ["x"], None, under)[1]

    assert plan(tmp_path / "a", True) == plan(tmp_path / "b", True)
    assert plan(tmp_path / "a", False) != plan(tmp_path / "b", False)


def test_an_installed_stage_is_not_run_and_a_refused_install_runs_it(tmp_path: Path) -> None:
    runs: list[TrainRecipe] = []
    offered: list[tuple[str, Path]] = []

    def install(fingerprint: str, out: Path) -> bool:
        offered.append((fingerprint, out))
        return out.name == "installed"

    for name in ("installed", "built"):
        overrides = [f"run_dir={tmp_path / name}"]
        fingerprint = stages.run_stage(TrainRecipe, RECIPES / "train.yaml", overrides, runs.append, [], install=install)
        assert stage_fingerprint(tmp_path / name) == fingerprint == offered[-1][0]
    assert [out.name for _, out in offered] == ["installed", "built"]
    assert [Path(run.run_dir).name for run in runs] == ["built"]
