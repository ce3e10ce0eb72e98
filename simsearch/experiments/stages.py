"""One command's run as a step of an experiment, for callers that must not import `simsearch.commands`.

`run_stage` runs a command on a recipe file plus overrides under a fingerprint (the resolved recipe and
its inputs' fingerprints) and skips it when it already finished under that fingerprint;
`train_stage`, `eval_stage`, `collect_stage` and `finetune_stage` are it for one command each.
`train` and `evaluate` run a loaded recipe with no fingerprint; `examples_file` is where `eval` writes
one engine's rows. The benchmarks build on these (they import the experiments, never a command).
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
from simsearch.fingerprints import claim_stage, digest, finish_stage

__all__ = [
    "collect_stage",
    "eval_stage",
    "evaluate",
    "examples_file",
    "finetune_stage",
    "run_stage",
    "train",
    "train_stage",
]


def run_stage(
    schema: type,
    recipe_file: Path,
    overrides: list[str],
    command: Callable[[Any], Any],
    inputs: list[str],
    edit: Callable[[Any], None] | None = None,
) -> str:
    """One command on a recipe plus overrides, skipped when it finished under the same fingerprint.

    `edit`, if given, changes the loaded recipe in place before it is fingerprinted and run (what an
    override cannot say). Returns the fingerprint (resolved recipe and inputs' fingerprints). A
    directory built from anything else is deleted first, as the quickstart's stages are.
    """
    stage: Any = load_recipe(schema, recipe_file, overrides)
    if edit is not None:
        edit(stage)
    fingerprint = digest({"recipe": asdict(stage), "inputs": inputs})
    directory = Path(stage.run_dir)
    if not claim_stage(directory, fingerprint):
        command(stage)
        finish_stage(directory, fingerprint)
    return fingerprint


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
