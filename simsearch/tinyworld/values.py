"""The tiny world's answer values: which spans of a text are values, and of what kind.

A value is a city name, an occupation or a year: the answers of the world's questions, and the
spans a pretraining trace may copy as its answer.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from simsearch.tinyworld.world import OCCUPATIONS, TWO_HOP, YEARS, World

RELATION_KINDS = {"birth_city": "city", "occupation": "occupation", "founding_year": "year", TWO_HOP: "city"}
"""The kind of value (`value_kind`) each tiny-world relation asks for."""


def value_spans(text: str, cities: Sequence[str]) -> list[str]:
    """The value-like spans of a passage: city names, occupations and years, in text order.

    Whole words only: "bakers" holds no "baker", "17120" no year.

    Args:
        text: Passage text.
        cities: The world's city names.

    Returns:
        Every occurrence (repeats included), ordered by position in the text.
    """
    return _value_pattern(tuple(cities)).findall(text)


def value_kind(value: str, cities: Sequence[str]) -> str:
    """ "city", "year" or "occupation": the kind of a span `value_spans` found."""
    if value in cities:
        return "city"
    return "year" if value.isdigit() else "occupation"


def world_values(world: World, kind: str) -> Sequence[str]:
    """Every value of `kind` ("city", "occupation" or "year") the world's passages can hold."""
    return {"city": world.cities, "occupation": OCCUPATIONS, "year": YEARS}[kind]


@functools.lru_cache(maxsize=8)
def _value_pattern(cities: tuple[str, ...]) -> re.Pattern[str]:
    # One alternation, longest first, so "salt trader" is preferred over any shorter value.
    values = sorted((*cities, *OCCUPATIONS), key=len, reverse=True)
    return re.compile(r"\b(?:" + "|".join(map(re.escape, values)) + r"|\d{4})\b")
