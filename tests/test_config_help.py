"""Every recipe key has its help as data (`checks.setting`), and a setting the commands share has one.

`simsearch config COMMAND --doc` and docs/recipes.md print `field.metadata["help"]` beside each key;
a field declared without it (a plain `field()` or `= default`) would show up there undescribed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, fields

import pytest

from simsearch.checks import HELP, setting
from simsearch.commands import recipe_doc

DIFFERENT_HELP = {
    "seed": "the quickstart's also seeds the tiny world and every stage it runs",
    "run_dir": "what each command writes there differs (serve: cost.json only; the quickstart: every stage)",
    "stop_grace_s": "a step of train and finetune, a chunk of eval",
    "steps": "RL steps of train vs optimizer steps of finetune",
    "batch_size": "collect's questions per rollout call vs finetune's pairs per micro-batch",
    "bf16": "train falls back to float32 where the hardware has no bf16; finetune does not",
    "save_every": "train's checkpoint period vs finetune's",
    "eval_every": "train's validation period vs finetune's validation loss",
}
"""Fields several commands declare whose help differs, and why; any other is one declaration."""


def _sections() -> list[type]:
    """Every dataclass a command's recipe reaches: the recipes, then the sections they compose."""
    found: dict[type, None] = {}

    def walk(cls: type) -> None:
        if cls in found:
            return
        found[cls] = None
        for f in fields(cls):
            inner, _ = recipe_doc.section_type(cls, f.name)
            if inner is not None:
                walk(inner)

    for schema in recipe_doc.COMMANDS.values():
        walk(schema)
    return list(found)


def _undescribed(classes: list[type]) -> list[str]:
    return [
        f"{cls.__name__}.{f.name}" for cls in classes for f in fields(cls) if not str(f.metadata.get(HELP, "")).strip()
    ]


def test_the_walk_reaches_the_nested_sections() -> None:
    names = {cls.__name__ for cls in _sections()}
    assert {"TrainRecipe", "SearchConfig", "SimulatorConfig", "ModelConfig", "HealthConfig", "EvalDataset"} <= names


def test_every_key_of_every_recipe_has_its_help() -> None:
    missing = _undescribed(_sections())
    assert not missing, f"declare these with checks.setting(default, help): {missing}"


def test_a_field_without_help_is_found() -> None:
    @dataclass
    class Section:
        described: int = setting(1, "a described key")
        bare: int = 2
        plain: list[str] = field(default_factory=list)
        blank: str = setting("", " ")

    assert _undescribed([Section]) == ["Section.bare", "Section.plain", "Section.blank"]


def test_the_help_is_what_the_docs_print() -> None:
    assert recipe_doc.descriptions(recipe_doc.COMMANDS["train"])["threads"].startswith("torch threads")
    assert "| `threads` | `1` | torch threads (0 = torch's default: every core)" in recipe_doc.markdown()


def test_a_setting_the_commands_share_is_declared_once() -> None:
    helps: dict[str, set[str]] = defaultdict(set)
    for schema in recipe_doc.COMMANDS.values():
        for f in fields(schema):
            if recipe_doc.section_type(schema, f.name)[0] is None:
                helps[f.name].add(f.metadata[HELP])
    several = {name: found for name, found in helps.items() if len(found) > 1 and name not in DIFFERENT_HELP}
    assert not several, f"one setting, several helps: declare it once in simsearch.config, or say why: {several}"
    stale = [name for name in DIFFERENT_HELP if len(helps.get(name, ())) < 2]
    assert not stale, f"declared once now, drop from DIFFERENT_HELP: {stale}"


@pytest.mark.parametrize("command", list(recipe_doc.COMMANDS))
def test_every_command_shares_threads(command: str) -> None:
    threads = {f.name: f for f in fields(recipe_doc.COMMANDS[command])}["threads"]
    assert threads.default == 1 and threads.metadata[HELP].startswith("torch threads (0 = torch's default")
