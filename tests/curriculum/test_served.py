"""`simsearch serve`'s curriculum section: its checks, and the per-client place on the schedule."""

from __future__ import annotations

import re

import pytest

from simsearch.config import ServeRecipe, load_recipe
from simsearch.curriculum.schedules import make_schedule
from simsearch.curriculum.served import ServedCurriculum, needs_total_steps
from simsearch.errors import RecipeError

SIMULATOR = ["search.kind=simulator", "search.simulator.generation.model.path=m"]


def test_curves_need_total_steps_and_the_rest_do_not() -> None:
    assert [needs_total_steps(k) for k in ("exponential", "linear", "cosine", "step", "constant", "adaptive")] == [
        True, True, True, False, False, False,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["curriculum.kind=exponential"], "curriculum.total_steps=0: a server has no trainer"),
        (["curriculum.kind=constant", "curriculum_total_searches=100"], "curriculum.total_steps=0"),
        (["curriculum.kind=adaptive", "curriculum_total_searches=100"], "set curriculum_total_searches=0"),
        (["curriculum.kind=linear", "curriculum.total_steps=5", "curriculum_total_searches=-1"], "must be >= 0"),
        (["curriculum.kind=linear", "curriculum.granularity=token"], "curriculum.granularity"),
    ],
)
def test_serve_refuses_a_curriculum_it_cannot_run(overrides: list[str], fragment: str) -> None:
    with pytest.raises(RecipeError, match=re.escape(fragment)):
        load_recipe(ServeRecipe, None, [*SIMULATOR, *overrides])


def test_a_retriever_has_no_noise_to_schedule() -> None:
    with pytest.raises(RecipeError, match=re.escape("search.kind=bm25 writes no noisy documents")):
        load_recipe(ServeRecipe, None, ["search.corpus=c.jsonl", "curriculum.kind=constant"])


def test_a_valid_section_loads_and_none_is_the_default() -> None:
    recipe = load_recipe(ServeRecipe, None, [*SIMULATOR, "curriculum.kind=linear", "curriculum.total_steps=50"])
    assert recipe.curriculum is not None and recipe.curriculum.total_steps == 50
    assert load_recipe(ServeRecipe, None, SIMULATOR).curriculum is None


def test_searches_count_per_client_and_a_report_overrides_them() -> None:
    # linear 0 -> 1 over 4 steps; 8 searches in all, so step = served * 4 // 8 = served // 2.
    curriculum = ServedCurriculum(
        lambda: make_schedule("linear", p_start=0.0, p_end=1.0, total_steps=4),
        total_steps=4,
        total_searches=8,
        granularity="call",
    )
    assert [curriculum.draw("a", 3).step for _ in range(3)] == [0, 1, 3]  # served 0, 3, 6 before each
    assert curriculum.draw("b", 1).step == 0  # b has its own count
    assert curriculum.report("a", 1).p_noise == pytest.approx(0.25)
    assert (curriculum.draw("a", 1).step, curriculum.draw("a", 1, step=2).p_noise) == (1, pytest.approx(0.5))
    assert curriculum.state()["a"] == {"searches": 11, "step": 2, "p_noise": pytest.approx(0.5), "source": "request"}
