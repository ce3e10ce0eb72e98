"""Noise schedules: hand-computed values, clamping, adaptive state, validation, build, num_noisy."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from simsearch.curriculum.schedules import (
    P_NOISE,
    SCHEDULE_KINDS,
    AdaptiveSchedule,
    make_schedule,
    num_noisy,
)


def ExponentialSchedule(p_start: float, p_end: float, total_steps: int, base: float = 4.0):
    return make_schedule("exponential", p_start=p_start, p_end=p_end, total_steps=total_steps, base=base)


def LinearSchedule(p_start: float, p_end: float, total_steps: int):
    return make_schedule("linear", p_start=p_start, p_end=p_end, total_steps=total_steps)


def CosineSchedule(p_start: float, p_end: float, total_steps: int):
    return make_schedule("cosine", p_start=p_start, p_end=p_end, total_steps=total_steps)


def StepSchedule(p_start: float, milestones: list[int], values: list[float]):
    return make_schedule("step", p_start=p_start, milestones=milestones, values=values)


def ConstantSchedule(p_start: float):
    return make_schedule("constant", p_start=p_start)


# --- exponential (ZeroSearch) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p_start", "p_end", "base", "step", "expected"),
    [
        (0.0, 0.5, 4.0, 0, 0.0),  # b^0 - 1 = 0
        (0.0, 0.5, 4.0, 50, 1 / 6),  # (4^0.5 - 1)/(4 - 1) * 0.5 = (2 - 1)/3 * 0.5
        (0.0, 0.5, 4.0, 25, (math.sqrt(2) - 1) / 6),  # 4^0.25 = sqrt(2); (sqrt2 - 1)/3 * 0.5
        (0.0, 0.5, 4.0, 100, 0.5),  # i = m
        (0.0, 0.5, 4.0, 150, 0.5),  # clamped for i > m
        (0.0, 0.5, 16.0, 50, 0.1),  # (16^0.5 - 1)/15 * 0.5 = 3/15 * 0.5
        (0.0, 0.5, 0.25, 50, 1 / 3),  # (0.5 - 1)/(0.25 - 1) * 0.5 = (2/3) * 0.5
        (0.5, 0.1, 4.0, 50, 0.5 - 0.4 / 3),  # decreasing: 0.5 + (1/3) * (0.1 - 0.5)
    ],
)
def test_exponential_values(p_start: float, p_end: float, base: float, step: int, expected: float) -> None:
    schedule = ExponentialSchedule(p_start, p_end, total_steps=100, base=base)
    assert schedule(step) == pytest.approx(expected, abs=1e-12)


def test_exponential_default_base_is_four() -> None:
    assert ExponentialSchedule(0.0, 0.5, total_steps=100)(50) == pytest.approx(1 / 6, abs=1e-12)


def test_exponential_is_monotone_and_below_linear() -> None:
    # with b > 1 the curve is convex: it stays under the straight line until the end
    exponential = ExponentialSchedule(0.0, 0.5, total_steps=100)
    linear = LinearSchedule(0.0, 0.5, total_steps=100)
    values = [exponential(i) for i in range(101)]
    assert all(a < b for a, b in itertools.pairwise(values))
    assert all(exponential(i) < linear(i) for i in range(1, 100))


# --- linear, cosine, step, constant ------------------------------------------------------------


def test_linear_values() -> None:
    schedule = LinearSchedule(0.1, 0.5, total_steps=200)
    assert schedule(0) == pytest.approx(0.1, abs=1e-12)
    assert schedule(50) == pytest.approx(0.2, abs=1e-12)  # 0.1 + (50/200) * 0.4
    assert schedule(200) == pytest.approx(0.5, abs=1e-12)
    assert schedule(300) == pytest.approx(0.5, abs=1e-12)  # clamped


def test_cosine_values() -> None:
    schedule = CosineSchedule(0.0, 0.4, total_steps=100)
    assert schedule(0) == 0.0
    # (1 - cos(pi/4))/2 * 0.4 = (1 - 0.70710678)/2 * 0.4 = 0.05857864
    assert schedule(25) == pytest.approx(0.0585786437626905, abs=1e-12)
    assert schedule(50) == pytest.approx(0.2, abs=1e-12)  # (1 - cos(pi/2))/2 * 0.4
    assert schedule(100) == pytest.approx(0.4, abs=1e-12)
    assert schedule(1000) == pytest.approx(0.4, abs=1e-12)


def test_step_values() -> None:
    schedule = StepSchedule(0.0, milestones=[10, 20], values=[0.25, 0.5])
    assert [schedule(i) for i in (0, 9, 10, 19, 20, 1000)] == [0.0, 0.0, 0.25, 0.25, 0.5, 0.5]


def test_constant_values() -> None:
    schedule = ConstantSchedule(0.3)
    assert [schedule(i) for i in (0, 7, 10_000)] == [0.3, 0.3, 0.3]


@pytest.mark.parametrize(
    "schedule",
    [
        ExponentialSchedule(0.0, 0.5, 100),
        LinearSchedule(0.0, 0.5, 100),
        CosineSchedule(0.0, 0.5, 100),
        StepSchedule(0.0, [10], [0.5]),
        ConstantSchedule(0.3),
    ],
)
def test_stateless_schedules(schedule) -> None:
    before = [schedule(i) for i in range(0, 120, 7)]
    schedule.observe({"reward/mean": 1.0})  # a no-op
    state = schedule.state_dict()
    schedule.load_state_dict(state)
    assert [schedule(i) for i in range(0, 120, 7)] == before
    with pytest.raises(ValueError, match="kind 'adaptive'"):
        schedule.load_state_dict({"kind": "adaptive", "p": 0.2, "recent": []})
    with pytest.raises(ValueError, match="step"):
        schedule(-1)


# --- adaptive ----------------------------------------------------------------------------------


def _adaptive() -> AdaptiveSchedule:
    return AdaptiveSchedule(
        p_start=0.2, p_min=0.1, p_max=0.4, delta=0.1, window=2, target_reward=0.6, collapse_reward=0.2
    )


def test_adaptive_trace() -> None:
    schedule = _adaptive()
    trace = []
    for reward in [0.7, 0.5, 0.9, 0.9, 0.9, 0.9, 0.3, 0.3, 0.0, 0.1, 0.1, 0.0, 0.0, 0.0, 0.0]:
        schedule.observe({"reward/mean": reward, "reward/f1": 0.0})
        trace.append(schedule(123))
    expected = [
        0.2,  # window [0.7] not full
        0.3,  # mean(0.7, 0.5) = 0.6 >= target -> +0.1, window cleared
        0.3,  # [0.9]
        0.4,  # mean 0.9 -> +0.1
        0.4,  # [0.9]
        0.4,  # mean 0.9 -> min(0.5, p_max = 0.4)
        0.4,  # [0.3]
        0.4,  # mean 0.3: between 0.2 and 0.6, no change, window slides
        0.3,  # [0.3, 0.0]: mean 0.15 < collapse -> -0.1, cleared
        0.3,  # [0.1]
        0.2,  # mean 0.1 < 0.2 -> -0.1
        0.2,  # [0.0]
        0.1,  # mean 0.0 -> -0.1
        0.1,  # [0.0]
        0.1,  # mean 0.0 -> max(0.0, p_min = 0.1)
    ]
    assert trace == pytest.approx(expected, abs=1e-12)


def test_adaptive_state_round_trip_gives_same_sequence() -> None:
    original = _adaptive()
    original.observe({"reward/mean": 0.7})  # p = 0.2, window [0.7] (half full)
    resumed = _adaptive()
    resumed.load_state_dict(original.state_dict())
    rewards = [0.5, 0.9, 0.9, 0.1, 0.0, 0.4, 0.4]
    sequence_original, sequence_resumed = [], []
    for reward in rewards:
        original.observe({"reward/mean": reward})
        resumed.observe({"reward/mean": reward})
        sequence_original.append(original(0))
        sequence_resumed.append(resumed(0))
    assert sequence_resumed == sequence_original
    # the saved window matters: 0.7 then 0.5 reaches the target at once (0.2 -> 0.3); a fresh
    # schedule would have seen [0.5] only and kept 0.2
    assert sequence_resumed[0] == pytest.approx(0.3, abs=1e-12)
    assert _adaptive().state_dict() == {"kind": "adaptive", "p": 0.2, "recent": []}


def test_adaptive_state_dict_restores_p() -> None:
    schedule = _adaptive()
    schedule.load_state_dict({"kind": "adaptive", "p": 0.35, "recent": [0.1]})
    assert schedule(0) == 0.35
    with pytest.raises(ValueError, match="window"):
        schedule.load_state_dict({"kind": "adaptive", "p": 0.3, "recent": [0.1, 0.2, 0.3]})
    with pytest.raises(ValueError, match="kind 'exponential'"):
        schedule.load_state_dict({"kind": "exponential"})


def test_adaptive_observe_errors() -> None:
    schedule = _adaptive()
    with pytest.raises(ValueError, match="reward/mean"):
        schedule.observe({"reward/f1": 0.5})
    with pytest.raises(ValueError, match="nan"):
        schedule.observe({"reward/mean": math.nan})


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "field_name"),
    [
        (lambda: ExponentialSchedule(0.0, 0.5, 100, base=1.0), "base"),
        (lambda: ExponentialSchedule(0.0, 0.5, 100, base=0.0), "base"),
        (lambda: ExponentialSchedule(0.0, 0.5, 100, base=-2.0), "base"),
        (lambda: ExponentialSchedule(0.0, 0.5, 100, base=math.inf), "base"),
        (lambda: ExponentialSchedule(1.5, 0.5, 100), "p_start"),
        (lambda: ExponentialSchedule(0.0, -0.1, 100), "p_end"),
        (lambda: ExponentialSchedule(0.0, 0.5, 0), "total_steps"),
        (lambda: LinearSchedule(0.0, 0.5, -3), "total_steps"),
        (lambda: CosineSchedule(0.0, 1.01, 10), "p_end"),
        (lambda: StepSchedule(0.0, [20, 10], [0.1, 0.2]), "milestones"),
        (lambda: StepSchedule(0.0, [10, 10], [0.1, 0.2]), "milestones"),
        (lambda: StepSchedule(0.0, [-1], [0.1]), "milestones"),
        (lambda: StepSchedule(0.0, [10, 20], [0.1]), "milestones and values"),
        (lambda: StepSchedule(0.0, [10, 20], [0.1, 2.0]), r"values\[1\]"),
        (lambda: ConstantSchedule(-0.5), "p_start"),
        (lambda: AdaptiveSchedule(0.05, 0.1, 0.4, 0.1, 2, 0.6, 0.2), "p_min"),
        (lambda: AdaptiveSchedule(0.2, 0.1, 1.4, 0.1, 2, 0.6, 0.2), "p_max"),
        (lambda: AdaptiveSchedule(0.2, 0.1, 0.4, 0.0, 2, 0.6, 0.2), "delta"),
        (lambda: AdaptiveSchedule(0.2, 0.1, 0.4, 0.1, 0, 0.6, 0.2), "window"),
        (lambda: AdaptiveSchedule(0.2, 0.1, 0.4, 0.1, 2, 0.6, 0.6), "collapse_reward"),
    ],
)
def test_invalid_parameters_name_the_field(make, field_name: str) -> None:
    with pytest.raises(ValueError, match=field_name):
        make()


# --- the table ---------------------------------------------------------------------------------


def test_every_kind_is_built_by_name_and_ignores_settings_it_does_not_take() -> None:
    assert SCHEDULE_KINDS == ("exponential", "linear", "cosine", "step", "constant", "adaptive")
    assert set(P_NOISE) == set(SCHEDULE_KINDS) - {"adaptive"}
    settings = dict(
        p_start=0.2,
        p_end=0.5,
        total_steps=100,
        base=4.0,
        milestones=[10],
        values=[0.5],
        p_min=0.1,
        p_max=0.4,
        delta=0.1,
        window=2,
        target_reward=0.6,
        collapse_reward=0.2,
        granularity="call",
    )
    # at step 50: exponential 0.2 + (1/3) * 0.3; linear and cosine halfway; step past 10; constant; adaptive p_start
    expected = {"exponential": 0.3, "linear": 0.35, "cosine": 0.35, "step": 0.5, "constant": 0.2, "adaptive": 0.2}
    for kind in SCHEDULE_KINDS:
        schedule = make_schedule(kind, **settings)
        assert schedule(50) == pytest.approx(expected[kind], abs=1e-12)
        assert schedule.state_dict()["kind"] == kind
    with pytest.raises(ValueError, match=r"curriculum.kind 'exp' is unknown"):
        make_schedule("exp", **settings)


# --- num_noisy ---------------------------------------------------------------------------------


def test_num_noisy_call_granularity() -> None:
    # random.Random(0).random() gives 0.844, 0.758, 0.421, 0.259, 0.511: noisy when < 0.5
    rng = random.Random(0)
    assert [num_noisy(0.5, 3, "call", rng) for _ in range(5)] == [0, 0, 3, 3, 0]


def test_num_noisy_document_granularity() -> None:
    # draws 0.844 0.758 0.421 | 0.259 0.511 0.405: one noisy, then two noisy
    rng = random.Random(0)
    assert [num_noisy(0.5, 3, "document", rng) for _ in range(2)] == [1, 2]
    # Binomial(5, 0.3) has mean 1.5; the mean of 2000 draws has std sqrt(5 * 0.21 / 2000) = 0.023
    rng = random.Random(1)
    draws = [num_noisy(0.3, 5, "document", rng) for _ in range(2000)]
    assert abs(sum(draws) / len(draws) - 1.5) < 0.1
    assert set(draws) - set(range(6)) == set()


@pytest.mark.parametrize("granularity", ["call", "document"])
def test_num_noisy_extremes(granularity: str) -> None:
    rng = random.Random(2)
    assert {num_noisy(0.0, 4, granularity, rng) for _ in range(50)} == {0}
    assert {num_noisy(1.0, 4, granularity, rng) for _ in range(50)} == {4}
    assert num_noisy(0.7, 0, granularity, rng) == 0


def test_num_noisy_errors() -> None:
    rng = random.Random(0)
    with pytest.raises(ValueError, match="granularity"):
        num_noisy(0.5, 3, "doc", rng)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="top_k"):
        num_noisy(0.5, -1, "call", rng)
    with pytest.raises(ValueError, match=" p "):
        num_noisy(1.5, 3, "call", rng)
