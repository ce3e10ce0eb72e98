"""What recipe sections share: `setting` (a field and its help) and the checks, each of which raises
`RecipeError` naming the key, the value and the bound.

A section checks itself under its own key (`policy` gives `policy.kind`); a command's recipe checks its
own fields under the key "", so their names arrive as `.steps` and are shown as `steps`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, overload

from simsearch.errors import RecipeError

T = TypeVar("T")

HELP = "help"
"""The metadata key of a recipe field's help: `dataclasses.fields(cls)[i].metadata[HELP]`."""


@overload
def setting(default: T, help: str) -> T: ...


@overload
def setting(*, default_factory: Callable[[], T], help: str) -> T: ...


def setting(default: Any = dataclasses.MISSING, help: str = "", *, default_factory: Any = dataclasses.MISSING) -> Any:
    """A recipe field declared with its help: `steps: int = setting(200, "optimizer steps")`, or
    `setting(default_factory=list, help="...")` for a mutable default.

    The help is data, `field.metadata["help"]`: `simsearch config COMMAND --doc` and docs/recipes.md
    print it beside the key, and a test requires it on every field of every recipe. A setting several
    recipes share is declared once, as a function returning its `setting` (`config._threads`).
    """
    return dataclasses.field(default=default, default_factory=default_factory, metadata={HELP: help})


_recorders: list[list[tuple[str, tuple[str, ...]]]] = []  # open `recording_choices` blocks


def user_key(name: str) -> str:
    """The key as a recipe spells it: `.steps` (a top-level field, checked under key "") -> `steps`."""
    return name.lstrip(".")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """Refuses a `value` that is not one of `choices`."""
    for seen in _recorders:
        seen.append((user_key(name), tuple(choices)))
    if value not in choices:
        raise RecipeError(f"{user_key(name)}={value!r} is not one of {', '.join(choices)}")


def check_range(name: str, value: float, low: float, high: float) -> None:
    """Refuses a `value` outside [low, high] (NaN included)."""
    if not low <= value <= high:
        raise RecipeError(f"{user_key(name)}={value} must lie in [{low}, {high}]")


def check_positive(name: str, value: float) -> None:
    """Refuses a `value` <= 0."""
    if value <= 0:
        raise RecipeError(f"{user_key(name)}={value} must be > 0")


@contextmanager
def recording_choices() -> Iterator[list[tuple[str, tuple[str, ...]]]]:
    """While inside, every `check_choice` also appends (key, allowed values) to the list it yields.

    How `simsearch config --doc` and docs/recipes.md learn each key's allowed values from the checks.
    """
    seen: list[tuple[str, tuple[str, ...]]] = []
    _recorders.append(seen)
    try:
        yield seen
    finally:
        _recorders.pop()  # blocks nest, so the last one opened is this one
