"""DAPO's overlong reward shaping (`reward.overlong_buffer`) against hand-computed values."""

from __future__ import annotations

import pytest

from simsearch.errors import RecipeError
from simsearch.policy.recipe import RewardConfig
from simsearch.policy.rewards import RewardOutput, overlong_penalty, shape_overlong


@pytest.mark.parametrize(
    ("length", "expected"),
    [
        (50, 0.0),  # far below L_max - buffer = 80
        (80, 0.0),  # the buffer starts after 80
        (81, -0.05),  # (80 - 81) / 20
        (90, -0.5),  # (80 - 90) / 20
        (100, -1.0),  # at L_max: the whole penalty
        (101, -1.0),  # beyond L_max: -penalty (eq. 13's third case), not -1.05
        (400, -1.0),
    ],
)
def test_penalty_inside_and_beyond_the_buffer(length: int, expected: float) -> None:
    assert overlong_penalty(length, max_length=100, buffer=20) == pytest.approx(expected, abs=1e-12)


def test_penalty_factor_scales_and_buffer_zero_is_off() -> None:
    assert overlong_penalty(90, 100, 20, penalty=0.5) == pytest.approx(-0.25, abs=1e-12)
    assert overlong_penalty(120, 100, 20, penalty=0.5) == pytest.approx(-0.5, abs=1e-12)
    assert overlong_penalty(10_000, 100, 0) == 0.0


def test_penalty_refuses_a_buffer_as_long_as_the_limit() -> None:
    with pytest.raises(ValueError, match="buffer=100 must be below max_length=100"):
        overlong_penalty(50, 100, 100)
    with pytest.raises(ValueError, match="buffer >= 0 and a finite penalty >= 0"):
        overlong_penalty(50, 100, 20, penalty=float("nan"))


def test_shape_overlong_adds_the_penalty_to_the_totals_and_logs_it() -> None:
    scored = RewardOutput(total=[1.0, 0.5, 0.0], components={"f1": [1.0, 0.5, 0.0]},
                          stats={"reward/mean": 0.5, "reward/f1": 0.5})  # fmt: skip
    # lengths 70, 90, 100 with L_max 100, buffer 20, penalty 0.5: penalties 0, -0.25, -0.5
    shaped = shape_overlong(scored, [70, 90, 100], max_length=100, buffer=20, penalty=0.5)
    assert shaped.total == pytest.approx([1.0, 0.25, -0.5])
    assert shaped.components == scored.components  # the components stay the unshaped scores
    assert shaped.stats["reward/mean"] == pytest.approx(0.75 / 3)
    assert shaped.stats["reward/f1"] == 0.5
    assert shaped.stats["reward/overlong"] == pytest.approx(-0.25)
    assert shaped.stats["reward/overlong_share"] == pytest.approx(2 / 3)
    assert shape_overlong(scored, [70, 90, 100], 100, 0) is scored
    with pytest.raises(ValueError, match="2 lengths for 3 rewards"):
        shape_overlong(scored, [70, 90], 100, 20)


def test_recipe_checks_the_overlong_keys() -> None:
    config = RewardConfig()
    assert (config.overlong_buffer, config.overlong_penalty) == (0, 1.0)
    RewardConfig(overlong_buffer=512, overlong_penalty=0.5).check("reward")
    with pytest.raises(RecipeError, match=r"reward\.overlong_buffer=-1 must be >= 0"):
        RewardConfig(overlong_buffer=-1).check("reward")
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(RecipeError, match=r"reward\.overlong_penalty=.* must be finite and >= 0"):
            RewardConfig(overlong_buffer=8, overlong_penalty=bad).check("reward")
