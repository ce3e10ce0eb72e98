"""`simsearch config COMMAND [RECIPE] [key=value ...] [--doc]`: the fully resolved recipe, and docs/recipes.md.

Everything shown is read from the recipe dataclasses (`simsearch.config` and the sections its recipes
compose, each in its library's `recipe` module), so it cannot drift from what a command accepts: each
key's description is the help declared with its field (`checks.setting(default, help)`, kept in the
field's metadata), and its allowed values are those its section's `check` tests (recorded while checking
the recipe and the shipped recipes, so a choice table added to a check shows up here unasked).

    python -m simsearch.commands.recipe_doc --write docs/recipes.md   # regenerate the reference
    python -m simsearch.commands.recipe_doc --check docs/recipes.md   # exit 1 when it is stale
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from dataclasses import fields, is_dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from simsearch.checks import HELP, recording_choices
from simsearch.config import (
    CollectRecipe,
    EvalRecipe,
    FinetuneRecipe,
    QuickstartRecipe,
    ServeRecipe,
    TrainRecipe,
    load_recipe,
)
from simsearch.errors import RecipeError

COMMANDS: dict[str, type] = {
    "quickstart": QuickstartRecipe,
    "train": TrainRecipe,
    "eval": EvalRecipe,
    "serve": ServeRecipe,
    "simulator-collect": CollectRecipe,
    "simulator-finetune": FinetuneRecipe,
}
"""`simsearch config COMMAND`: each command's recipe schema."""

SHIPPED = Path(__file__).resolve().parents[2] / "recipes"
"""The shipped recipes (in a source checkout): their checks show the allowed values of every section."""

Choices = dict[tuple[type, str], tuple[str, ...]]


def main(command: str, path: str | None, overrides: list[str], *, doc: bool) -> str:
    """Prints (and returns) the resolved recipe as YAML; with `doc`, each key annotated.

    Without a recipe file or overrides the schema's defaults are shown, required values as `???`.

    Raises:
        RecipeError: As `load_recipe` (the recipe does not resolve).
    """
    schema = COMMANDS[command]
    recipe = load_recipe(schema, path, overrides) if path or overrides else schema()
    if doc:
        choices = {**shipped_choices(), **recorded_choices([recipe])}
        text = "\n".join(annotated_yaml(recipe, choices)) + "\n"
    else:
        text = OmegaConf.to_yaml(OmegaConf.structured(recipe))
    print(text, end="", flush=True)
    return text


# --------------------------------------------------------------------------- what the dataclasses say


def descriptions(cls: type) -> dict[str, str]:
    """Field name -> the help declared with it (`checks.setting`); "" for a field declared without one."""
    return {f.name: f.metadata.get(HELP, "") for f in fields(cls)}


def section_type(cls: type, name: str) -> tuple[type | None, str]:
    """The dataclass a field holds and how: ("", "optional", "mapping" or "list"); (None, "") for a leaf."""
    hint = typing.get_type_hints(cls)[name]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, type) and is_dataclass(hint):
        return hint, ""
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return (inner[0], "optional") if len(inner) == 1 and _is_section(inner[0]) else (None, "")
    if origin is dict and _is_section(args[1]):
        return args[1], "mapping"
    if origin is list and args and _is_section(args[0]):
        return args[0], "list"
    return None, ""


def _is_section(hint: Any) -> bool:
    return isinstance(hint, type) and is_dataclass(hint)


def recorded_choices(recipes: list[Any]) -> Choices:
    """(section class, field) -> allowed values, as the recipes' checks test them."""
    out: Choices = {}
    for recipe in recipes:
        with recording_choices() as seen:
            recipe.check("")
        for key, allowed in seen:
            owner = _owner(recipe, key.removesuffix(" key"))
            if owner is not None:
                out[owner] = allowed
    return out


def _owner(recipe: Any, key: str) -> tuple[type, str] | None:
    """The section class holding the dotted `key` of `recipe`, and the field's name."""
    *path, name = key.split(".")
    node = recipe
    for part in path:
        node = node.get(part) if isinstance(node, dict) else getattr(node, part, None)
    return (type(node), name) if is_dataclass(node) and name in {f.name for f in fields(node)} else None


@cache
def shipped_choices() -> Choices:
    """The allowed values the shipped recipes' checks test ({} outside a source checkout)."""
    recipes: list[Any] = []
    for path in sorted(SHIPPED.rglob("*.yaml")):
        first = path.read_text(encoding="utf-8").splitlines()[0]
        command = next((c for c in COMMANDS if f"simsearch {c.replace('-', ' ')} " in first + " "), None)
        if command is not None:
            try:
                recipes.append(load_recipe(COMMANDS[command], path))
            except RecipeError:  # a broken recipe is the recipe test's business, not the docs'
                continue
    return recorded_choices(recipes)


def _note(cls: type, name: str, choices: Choices) -> str:
    text = descriptions(cls).get(name, "")
    allowed = choices.get((cls, name))
    if allowed:
        text = f"{text} [{' | '.join(allowed)}]".strip()
    return text


# --------------------------------------------------------------------------- annotated YAML


def _scalar(value: Any) -> str:
    """One value in YAML flow style, as a recipe would spell it."""
    return yaml.safe_dump([value], default_flow_style=True, width=10**6).strip()[1:-1]


def annotated_yaml(section: Any, choices: Choices, indent: int = 0) -> list[str]:
    """A section as YAML lines, each key followed by `# description [allowed values]`."""
    pad, lines = " " * indent, []
    for f in fields(section):
        value, note = getattr(section, f.name), _note(type(section), f.name, choices)
        comment = f"  # {note}" if note else ""
        if is_dataclass(value):
            lines += [f"{pad}{f.name}:{comment}", *annotated_yaml(value, choices, indent + 2)]
        elif isinstance(value, dict) and value and all(is_dataclass(v) for v in value.values()):
            lines.append(f"{pad}{f.name}:{comment}")
            for key, entry in value.items():
                lines += [f"{pad}  {key}:", *annotated_yaml(entry, choices, indent + 4)]
        elif isinstance(value, list) and value and all(is_dataclass(v) for v in value):
            lines.append(f"{pad}{f.name}:{comment}")
            for entry in value:
                entry_lines = annotated_yaml(entry, choices, indent + 4)
                lines += [f"{pad}  - {entry_lines[0].lstrip()}", *entry_lines[1:]]
        else:
            lines.append(f"{pad}{f.name}: {_scalar(value)}{comment}")
    return lines


# --------------------------------------------------------------------------- docs/recipes.md


def markdown() -> str:
    """docs/recipes.md: every command's keys, then every section's, with defaults and allowed values."""
    choices = shipped_choices()
    sections: dict[type, None] = {}
    parts = [
        "# Recipe reference\n",
        "Generated from the recipe dataclasses (`simsearch/config.py` and the sections it composes) by "
        "`python -m simsearch.commands.recipe_doc --write docs/recipes.md`; a test fails when it is stale. "
        "`simsearch config COMMAND RECIPE [key=value ...] --doc` prints one recipe resolved, with the "
        "same notes. Overrides are dotted keys (`optim.lr=1e-4`); `~key` or `key=null` removes an "
        "entry of a mapping (`~engines.dense`) or sets an optional section to null.\n",
    ]
    for command, schema in COMMANDS.items():
        doc = (schema.__doc__ or "").strip().splitlines()[0].split(": ", 1)[-1]  # past "`simsearch x`: "
        title = f"## `simsearch {command.replace('-', ' ')}`\n"
        parts += [title, f"{doc[:1].upper()}{doc[1:]}\n", _table(schema, choices, sections)]
    done: set[type] = set()
    while len(done) < len(sections):
        cls = next(c for c in sections if c not in done)
        done.add(cls)
        doc = " ".join((cls.__doc__ or "").split())
        parts += [f"### {cls.__name__}\n", f"{doc}\n", _table(cls, choices, sections)]
    return "\n".join(parts)


def _table(cls: type, choices: Choices, sections: dict[type, None]) -> str:
    """One row per field: key, default, description with allowed values; sections link to their own table."""
    defaults = cls()
    rows = ["| key | default | description |", "|---|---|---|"]
    for f in fields(cls):
        inner, how = section_type(cls, f.name)
        value = getattr(defaults, f.name)
        if inner is not None:
            sections.setdefault(inner)
            shape = {"": "", "optional": " or null", "mapping": ", a mapping name -> section", "list": ", a list"}
            default = f"[{inner.__name__}](#{inner.__name__.lower()}){shape[how]}"
            if how in ("optional", "mapping", "list") and not value:
                default += f" (default `{_scalar(value)}`)"
        else:
            default = "required" if value == "???" else f"`{_scalar(value)}`"
        note = _note(cls, f.name, choices).replace("|", "\\|")
        rows.append(f"| `{f.name}` | {default} | {note} |")
    return "\n".join(rows) + "\n"


def _cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simsearch.commands.recipe_doc", description=__doc__)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", metavar="PATH", help="write the reference to PATH")
    group.add_argument("--check", metavar="PATH", help="exit 1 when PATH differs from the reference")
    args = parser.parse_args(argv)
    text = markdown()
    if args.write:
        Path(args.write).write_text(text, encoding="utf-8")
        return 0
    if Path(args.check).read_text(encoding="utf-8") != text:
        print(f"{args.check} is stale: python -m simsearch.commands.recipe_doc --write {args.check}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
