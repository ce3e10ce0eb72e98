"""Every paper recipe matches the "ours" column of docs/protocols.md.

The page's tables name recipes in two ways: a `Recipes:` line before a table applies each of its
`key = value` cells to every recipe listed; a table whose first column is `recipe` applies a row's
cells to the recipe named in that row. Cells without `` `key = value` `` (pending rows, departures
without a key) are not checked.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from simsearch.config import EvalRecipe, ServeRecipe, TrainRecipe, load_recipe

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "protocols.md"
RECIPE_PATH = re.compile(r"`(recipes/[\w./-]+\.yaml)`")
KEY_VALUE = re.compile(r"`([a-z_][\w]*(?:\.[\w]+)*) = ([^`]+)`")
SCHEMAS = {"train": TrainRecipe, "eval": EvalRecipe, "serve": ServeRecipe}
PENDING = re.compile(r"pending: `([a-z_][\w]*(?:\.[\w]+)*)")


def cells(line: str) -> list[str]:
    """The cells of one markdown table row."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_protocols(text: str) -> dict[str, dict[str, str]]:
    """recipe path -> {key: value text} from the page's tables (see the module docstring)."""
    expected: dict[str, dict[str, str]] = {}
    scope: list[str] = []
    collecting_scope = False
    header: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("Recipes:"):
            scope, collecting_scope = RECIPE_PATH.findall(line), True
            continue
        if collecting_scope and line.startswith("`recipes/"):
            scope += RECIPE_PATH.findall(line)
            continue
        collecting_scope = False
        if not line.startswith("|"):
            header = None
            continue
        row = cells(line)
        if header is None:
            header = row
            continue
        if set("".join(row)) <= set("-: "):
            continue
        if header[0] == "recipe":
            targets, ours = RECIPE_PATH.findall(row[0]), " ".join(row[1:])
        elif "ours" in header:
            targets, ours = scope, row[header.index("ours")]
        else:
            continue
        for key, value in KEY_VALUE.findall(ours):
            for recipe in targets:
                expected.setdefault(recipe, {})[key] = value.strip()
    return expected


def lookup(recipe: Any, key: str) -> Any:
    """The value at a dotted key of a loaded recipe (dataclasses and dicts)."""
    value = recipe
    for part in key.split("."):
        value = value[part] if isinstance(value, dict) else getattr(value, part)
    return value


def same(actual: Any, written: str) -> bool:
    """Whether a recipe value equals the text the page gives for it."""
    wanted = yaml.safe_load(written)
    if isinstance(actual, bool) or isinstance(wanted, bool):
        return actual == wanted
    if isinstance(actual, (int, float)):
        return math.isclose(float(actual), float(wanted), rel_tol=1e-12, abs_tol=0.0)
    if isinstance(actual, (list, tuple)):
        return [float(a) if isinstance(a, (int, float)) else a for a in actual] == wanted
    if isinstance(actual, dict):
        return {k: float(v) for k, v in actual.items()} == {k: float(v) for k, v in wanted.items()}
    return str(actual) == str(wanted)


def has_key(schema: type, key: str) -> bool:
    """Whether a dotted key names a field of a recipe dataclass tree."""
    for part in key.split("."):
        if not dataclasses.is_dataclass(schema):
            return False
        hints = typing.get_type_hints(schema)
        if part not in hints:
            return False
        schema = hints[part]
    return True


EXPECTED = parse_protocols(DOC.read_text())


def test_the_page_names_every_paper_recipe() -> None:
    papers = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "recipes").glob("*/*.yaml")
        if p.name.startswith(("zerosearch_", "search_r1_", "ssrl_")) and p.parent.name in ("train", "eval")
    )
    assert papers, "no paper recipes found"
    missing = [p for p in papers if p not in EXPECTED]
    assert not missing, f"docs/protocols.md has no table for {missing}"
    unknown = [p for p in EXPECTED if not (ROOT / p).is_file()]
    assert not unknown, f"docs/protocols.md names recipes that do not exist: {unknown}"


@pytest.mark.parametrize("path", sorted(EXPECTED))
def test_recipe_matches_protocols_page(path: str) -> None:
    recipe = load_recipe(SCHEMAS[Path(path).parent.name], ROOT / path)
    drift = [
        f"{key}: recipe {lookup(recipe, key)!r}, docs/protocols.md {written!r}"
        for key, written in EXPECTED[path].items()
        if not same(lookup(recipe, key), written)
    ]
    assert not drift, f"{path} drifts from docs/protocols.md: " + "; ".join(drift)


def test_no_row_waits_for_a_key_that_exists() -> None:
    # A "pending: `key`" cell marks a setting we cannot copy yet; once the key lands the row must
    # give its value, so the test above checks the recipes against it.
    landed = [
        key
        for key in PENDING.findall(DOC.read_text())
        if any(has_key(schema, key) for schema in (TrainRecipe, EvalRecipe))
    ]
    assert not landed, f"docs/protocols.md marks keys as pending that now exist: {landed}"
    assert has_key(TrainRecipe, "optim.warmup_ratio") and not has_key(TrainRecipe, "optim.no_such_key")


def test_parser_reads_scoped_and_per_recipe_tables() -> None:
    page = "\n".join([
        "Recipes: `recipes/train/a.yaml`,",
        "`recipes/train/b.yaml`.",
        "",
        "| setting | paper script value | ours | departure and reason |",
        "|---|---|---|---|",
        "| lr | 1e-6 | `optim.lr = 1.0e-6`; `steps = 3` | |",
        "| pending | x | pending: `optim.warmup_ratio` | |",
        "",
        "| recipe | ours |",
        "|---|---|",
        "| `recipes/train/b.yaml` | `policy.model.path = m/B` |",
    ])  # fmt: skip
    assert parse_protocols(page) == {
        "recipes/train/a.yaml": {"optim.lr": "1.0e-6", "steps": "3"},
        "recipes/train/b.yaml": {"optim.lr": "1.0e-6", "steps": "3", "policy.model.path": "m/B"},
    }


def test_a_drifted_value_is_caught() -> None:
    # The comparison a drifted recipe meets: 1e-6 vs 2e-6 differs, 203 vs 203.0 does not.
    assert not same(2e-6, "1.0e-6")
    assert same(203, "203")
    assert not same({"em": 0.9, "format": 0.1}, "{em: 1.0}")
    assert same({"em": 0.9, "format": 0.1}, "{em: 0.9, format: 0.1}")
    assert not same(True, "false")
    assert same("k1", "k1") and not same("k3", "k1")
