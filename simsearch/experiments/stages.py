"""One command's run as a step of an experiment, for callers that must not import `simsearch.commands`.

The one stage runner and fingerprint scheme of the quickstart and every study: `plan_stage` loads a
stage's recipe (a recipe file plus overrides) and gives its fingerprint (the file's name, the inputs'
fingerprints and the resolved recipe); `run_stage` runs a command on it and skips it when it already
finished under that fingerprint; `train_stage`, `eval_stage`, `collect_stage` and `finetune_stage` are it
for one command each.
`train` and `evaluate` run a loaded recipe with no fingerprint; `examples_file` is where `eval` writes
one engine's rows; `final_model` is a finished run's model; `SMOKE_STAGES` the quickstart's smoke settings.
The benchmarks build on these (they import the experiments, never a command).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from simsearch.commands import evaluate as _evaluate
from simsearch.commands import simulator_collect, simulator_finetune
from simsearch.commands import train as _train
from simsearch.commands.evaluate import examples_file
from simsearch.config import CollectRecipe, EvalRecipe, FinetuneRecipe, TrainRecipe, load_recipe
from simsearch.errors import SimsearchError
from simsearch.fingerprints import building, digest
from simsearch.training.checkpoint import latest_checkpoint

__all__ = [
    "SMOKE_STAGES",
    "collect_stage",
    "eval_stage",
    "evaluate",
    "examples_file",
    "final_model",
    "finetune_stage",
    "plan_stage",
    "run_stage",
    "train",
    "train_stage",
]

SMOKE_STAGES = {
    "collect": ["max_questions=32"],
    "simulator": ["steps=2", "eval_every=1", "batch_size=4"],
    "train": ["steps=2", "prompts_per_step=2", "rollout.group_size=2", "save_every=1", "eval_every=0"],
    "eval": ["fidelity_size=4", "chunk_size=8"],
}
"""Stage -> the overrides of its run in the quickstart's smoke mode (and of the studies' stages built alike)."""


def plan_stage(
    schema: type,
    recipe_file: Path,
    overrides: list[str],
    inputs: list[str],
    edit: Callable[[Any], None] | None = None,
    root: Path | None = None,
) -> tuple[Any, str]:
    """A stage's recipe (`recipe_file` plus `overrides`, then `edit` in place: what an override cannot say)
    and its fingerprint: the recipe file's name, the inputs' fingerprints and the resolved recipe, with every
    path under `root` written relative to it (so a run directory that moves keeps its fingerprints)."""
    stage: Any = load_recipe(schema, recipe_file, overrides)
    if edit is not None:
        edit(stage)
    recipe = asdict(stage) if root is None else _relative(asdict(stage), str(root))
    return stage, digest({"stage": Path(recipe_file).stem, "inputs": inputs, "recipe": recipe})


def run_stage(
    schema: type,
    recipe_file: Path,
    overrides: list[str],
    command: Callable[[Any], Any],
    inputs: list[str],
    edit: Callable[[Any], None] | None = None,
    *,
    root: Path | None = None,
    install: Callable[[str, Path], bool] | None = None,
) -> str:
    """`command` on the stage `plan_stage` gives, skipped when its directory finished under the same
    fingerprint; returns the fingerprint. A directory built from anything else is deleted first; a second
    process on the same directory waits for the first (`fingerprints.building`).
    `install(fingerprint, directory)`, if given, may fill the directory instead of the command (True)."""
    stage, fingerprint = plan_stage(schema, recipe_file, overrides, inputs, edit, root)
    directory = Path(stage.run_dir)
    with building(directory, fingerprint) as todo:
        if todo and (install is None or not install(fingerprint, directory)):
            command(stage)
    return fingerprint


def _relative(value: Any, root: str) -> Any:
    """`value` (a recipe's dict) with every path under `root` written as `<run_dir>/...`."""
    if isinstance(value, dict):
        return {key: _relative(item, root) for key, item in value.items()}
    if isinstance(value, list):
        return [_relative(item, root) for item in value]
    if isinstance(value, str) and (value == root or value.startswith(root + "/")):
        return "<run_dir>" + value[len(root) :]
    return value


def train_stage(
    recipe_file: Path, overrides: list[str], inputs: list[str], edit: Callable[[TrainRecipe], None] | None = None
) -> str:
    """`run_stage` of `simsearch train` (a `TrainRecipe`); its fingerprint."""
    return run_stage(TrainRecipe, recipe_file, overrides, _train.main, inputs, edit)


def eval_stage(
    recipe_file: Path, overrides: list[str], inputs: list[str], edit: Callable[[EvalRecipe], None] | None = None
) -> str:
    """`run_stage` of `simsearch eval` (an `EvalRecipe`); its fingerprint."""
    return run_stage(EvalRecipe, recipe_file, overrides, _evaluate.main, inputs, edit)


def collect_stage(
    recipe_file: Path, overrides: list[str], inputs: list[str], edit: Callable[[CollectRecipe], None] | None = None
) -> str:
    """`run_stage` of `simsearch simulator collect` (a `CollectRecipe`); its fingerprint."""
    return run_stage(CollectRecipe, recipe_file, overrides, simulator_collect.main, inputs, edit)


def finetune_stage(
    recipe_file: Path, overrides: list[str], inputs: list[str], edit: Callable[[FinetuneRecipe], None] | None = None
) -> str:
    """`run_stage` of `simsearch simulator finetune` (a `FinetuneRecipe`); its fingerprint."""
    return run_stage(FinetuneRecipe, recipe_file, overrides, simulator_finetune.main, inputs, edit)


def train(recipe: TrainRecipe) -> dict[str, float]:
    """`simsearch train` on `recipe`, with no fingerprint; the last step's metrics."""
    return _train.main(recipe)


def evaluate(recipe: EvalRecipe) -> dict[str, Any]:
    """`simsearch eval` on `recipe`, with no fingerprint; its summary."""
    return _evaluate.main(recipe)


def final_model(train_run: Path) -> Path:
    """The model of a training run's latest checkpoint (policy or simulator)."""
    checkpoint = latest_checkpoint(train_run)
    if checkpoint is None:
        raise SimsearchError(f"{train_run}: training wrote no checkpoint")
    return checkpoint / "model"
