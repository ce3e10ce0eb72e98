"""The tiny world's answer values: spans and kinds."""

from __future__ import annotations

from simsearch.tinyworld.values import value_kind, value_spans


def test_value_spans_finds_cities_occupations_and_years_as_whole_words():
    # Not values: "bakers" (a plural), "Feholmer" and "17120" (longer words).
    text = "Lofeholm lies by the sea, opened in 1712; bakers, a tea merchant, Feholmer, 17120, Feholm."
    assert value_spans(text, ["Feholm", "Lofeholm"]) == ["Lofeholm", "1712", "tea merchant", "Feholm"]


def test_value_kind() -> None:
    assert [value_kind(v, ["Lumere"]) for v in ("Lumere", "1695", "salt trader")] == ["city", "year", "occupation"]
