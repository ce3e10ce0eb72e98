"""Every shipped recipe parses onto its command's schema."""

import re
import warnings
from dataclasses import asdict
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from simsearch.config import (
    CollectRecipe,
    EvalRecipe,
    FinetuneRecipe,
    QuickstartRecipe,
    ServeRecipe,
    TrainRecipe,
    load_recipe,
)

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").rglob("*.yaml"))
EVAL_RECIPES = [path for path in RECIPES if path.parent.name == "eval"]
RECIPE_PATH = re.compile(r"recipes/[\w/.-]+\.yaml")


def schema_for(path: Path) -> type:
    """The schema a recipe is written for, from the command named on its first line."""
    first = path.read_text().splitlines()[0]
    for marker, schema in (
        ("simsearch simulator collect", CollectRecipe),
        ("simsearch simulator finetune", FinetuneRecipe),
        ("simsearch train", TrainRecipe),
        ("simsearch eval", EvalRecipe),
        ("simsearch serve", ServeRecipe),
        ("simsearch quickstart", QuickstartRecipe),
    ):
        if marker in first:
            return schema
    raise AssertionError(f"{path}: the first line must be a comment with the command that runs it")


def test_recipes_exist() -> None:
    assert RECIPES, "no recipes/**/*.yaml shipped"


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_recipe_parses(path: Path) -> None:
    assert path.read_text().startswith("#"), "a recipe opens with the command that runs it"
    recipe = load_recipe(schema_for(path), path)
    assert isinstance(recipe, schema_for(path))
    # Every value the file writes reaches the recipe as written: none dropped for a default, renamed or coerced.
    loaded = asdict(recipe)
    for keys, value in _leaves(OmegaConf.to_container(OmegaConf.load(path), resolve=True)):
        got = loaded
        for key in keys:
            got = got[key]
        assert (list(got) if isinstance(got, tuple) else got) == value, ".".join(map(str, keys))


def _leaves(node: object, keys: tuple = ()) -> list[tuple[tuple, object]]:
    """(key path, value) of every scalar, or list of scalars, in a YAML tree of mappings and lists."""
    if isinstance(node, dict):
        return [leaf for key, value in node.items() for leaf in _leaves(value, (*keys, key))]
    if isinstance(node, list) and any(isinstance(value, dict | list) for value in node):
        return [leaf for i, value in enumerate(node) for leaf in _leaves(value, (*keys, i))]
    return [(keys, node)]


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_recipe_comments_name_itself_and_existing_recipes(path: Path) -> None:
    # The opening command runs this very file, and every recipe a comment points to (e.g. a train
    # recipe's eval command) ships with it.
    text = path.read_text()
    own = str(path.relative_to(ROOT))
    assert own in text.splitlines()[0], f"{own}: the first line must run {own}"
    missing = [name for name in RECIPE_PATH.findall(text) if not (ROOT / name).is_file()]
    assert not missing, f"{own} names recipes that do not exist: {missing}"


@pytest.mark.parametrize("path", EVAL_RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_eval_recipe_passes_the_checks_made_before_any_work(path: Path) -> None:
    # The recipe's checks refuse rows that could never call their engine (e.g. a self-search policy
    # with max_turns=0 on a real engine) and plan_methods warns of paid engines without a cache; a
    # shipped recipe must get past both.
    from simsearch.commands.evaluate import plan_methods

    recipe = load_recipe(EvalRecipe, path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. a paid web engine without a cache
        methods = plan_methods(recipe)
    assert [m.name for m in methods if m.name not in ("direct", "rag")] == list(recipe.engines)
