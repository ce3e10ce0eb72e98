"""benchmarks/fuzz.py: the tally of how cases end, and --tiny (a few hundred cases, every target)."""

from __future__ import annotations

import json

import pytest

from benchmarks import fuzz
from simsearch.errors import DataError, RecipeError


def test_cases_are_tallied_by_how_they_end() -> None:
    outcomes = {0: None, 1: RecipeError("bad key"), 2: DataError("bad row"), 3: KeyError("x"),
                4: fuzz.Server5xx("status 500"), 5: fuzz.Refused("422"), 6: None}  # fmt: skip

    def check(case: int) -> None:
        if outcomes[case] is not None:
            raise outcomes[case]  # type: ignore[misc]

    tally = fuzz.run_cases(list(outcomes), check, max_s=60.0)
    # 7 cases: 2 values, 3 user errors (recipe, data, a 4xx), 1 raw traceback (KeyError), 1 server 5xx
    assert (tally.cases, tally.values, tally.user_errors, tally.tracebacks, tally.server_5xx) == (7, 2, 3, 1, 1)
    assert tally.examples[0].startswith("KeyError: 'x' at ") and tally.examples[1].startswith("status 500")


def test_a_target_stops_at_its_time_bound() -> None:
    assert fuzz.run_cases(list(range(100)), lambda case: None, max_s=0.0).cases <= 1


def test_draw_is_reproducible() -> None:
    strategy = fuzz.gen.tagged_text
    first, again = fuzz.draw(strategy, 30, 7), fuzz.draw(strategy, 30, 7)
    assert len(first) == 30 and first == again


def test_tiny_mode_runs_every_target_without_a_traceback(capsys: pytest.CaptureFixture) -> None:
    figures = fuzz.main(["--tiny"])
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == figures
    assert set(figures["per_target"]) == set(fuzz.FULL) and all(n == 40 for n in figures["per_target"].values())
    assert figures["cases"] == 40 * len(fuzz.FULL)
    assert figures["tracebacks"] == 0 and figures["server_5xx"] == 0, figures["examples"]
    assert figures["command"] == "python -m benchmarks.fuzz --tiny"
