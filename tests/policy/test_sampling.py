"""DAPO's dynamic sampling (`policy.sampling`) on hand-written rewards and a fake rollout."""

from __future__ import annotations

import pytest

from simsearch.policy.sampling import Round, flat_groups, flat_share, sample_informative, trainable_groups

# --------------------------------------------------------------------------- flat groups


def test_flat_groups_are_those_whose_rewards_are_all_equal() -> None:
    rewards = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5]
    groups = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    # group 0: {1, 1, 0, 1} varies; group 1: all wrong; group 2: all 0.5 (flat whatever the value)
    assert flat_groups(rewards, groups) == [1, 2]
    assert flat_share(rewards, groups) == pytest.approx(2 / 3, abs=1e-12)


def test_groups_need_not_be_adjacent_and_are_listed_in_order_of_appearance() -> None:
    # group 7 = rows 0, 2 -> {1, 1} flat; group 3 = rows 1, 3 -> {0, 1}; group 5 = rows 4, 5 -> {0, 0} flat
    assert flat_groups([1.0, 0.0, 1.0, 1.0, 0.0, 0.0], [7, 3, 7, 3, 5, 5]) == [7, 5]
    assert flat_share([1.0, 0.0, 1.0, 1.0, 0.0, 0.0], [7, 3, 7, 3, 5, 5]) == pytest.approx(2 / 3, abs=1e-12)


def test_flat_means_exactly_equal() -> None:
    # np.std([0.1] * 3) is 1.4e-17, not 0: verl's std test would keep this group; equal is equal here
    assert flat_groups([0.1, 0.1, 0.1], [0, 0, 0]) == [0]
    assert flat_groups([0.3, 0.1 + 0.2], [0, 0]) == []  # 0.1 + 0.2 == 0.30000000000000004: they differ


def test_a_group_of_one_is_never_flat() -> None:
    assert flat_groups([1.0, 0.0], [4, 9]) == []
    assert flat_share([1.0, 0.0], [4, 9]) == 0.0
    assert flat_share([], []) == 0.0


def test_flat_groups_refuses_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="3 rewards for 2 group ids"):
        flat_groups([1.0, 0.0, 1.0], [0, 0])


# --------------------------------------------------------------------------- the round loop

INFORMATIVE, FLAT = [1.0, 0.0], [0.0, 0.0]  # a group of two samples each


def _fake_rollout(plan: list[list[list[float]]]):
    """rollout(i) returns round i of `plan` (group rewards; group id g has rows 2g, 2g + 1) and records i."""
    calls: list[int] = []

    def rollout(i: int) -> Round[str]:
        calls.append(i)
        rewards = [r for group in plan[i] for r in group]
        return Round(f"round {i}", rewards, [g for g, group in enumerate(plan[i]) for _ in group])

    return rollout, calls


def test_a_full_first_round_is_the_only_round() -> None:
    rollout, calls = _fake_rollout([[INFORMATIVE, INFORMATIVE], [INFORMATIVE, INFORMATIVE]])
    sampled = sample_informative(rollout, target=2, max_rounds=3)
    assert calls == [0]
    assert sampled.informative == [(0, 0), (0, 1)]
    assert (sampled.prompts, sampled.flat_share) == (2, 0.0)
    assert [r.output for r in sampled.rounds] == ["round 0"]


def test_rounds_go_on_until_the_target_and_the_excess_is_dropped_in_order() -> None:
    # Round 0: 1 informative of 4 (flat share 3/4); round 1: 3 more, so 4 >= 4 after two rounds.
    plan = [
        [FLAT, INFORMATIVE, FLAT, FLAT],
        [INFORMATIVE, INFORMATIVE, FLAT, INFORMATIVE],
        [INFORMATIVE] * 4,
    ]
    rollout, calls = _fake_rollout(plan)
    sampled = sample_informative(rollout, target=4, max_rounds=3)
    assert calls == [0, 1]
    assert sampled.informative == [(0, 1), (1, 0), (1, 1), (1, 3)]
    assert (sampled.prompts, sampled.flat_share) == (8, 0.75)
    # More than the target: round 1 finds 4 and only the first 3 of them are kept.
    rollout, _ = _fake_rollout([[FLAT, INFORMATIVE, FLAT, FLAT], [INFORMATIVE] * 4])
    assert sample_informative(rollout, target=4, max_rounds=3).informative == [(0, 1), (1, 0), (1, 1), (1, 2)]


def test_the_bound_stops_the_rounds_and_the_step_trains_on_what_it_found() -> None:
    plan = [[FLAT, FLAT, INFORMATIVE], [FLAT, FLAT, FLAT], [FLAT, FLAT, FLAT], [INFORMATIVE] * 3]
    rollout, calls = _fake_rollout(plan)
    sampled = sample_informative(rollout, target=3, max_rounds=3)
    assert calls == [0, 1, 2]  # round 3 would fill the batch, but the bound is 3 rounds
    assert sampled.informative == [(0, 2)]
    assert sampled.prompts == 9
    assert sampled.flat_share == pytest.approx(2 / 3, abs=1e-12)
    assert sampled.trained(1) == [(0, 2)]


def test_without_any_informative_group_the_first_round_is_trained_on() -> None:
    rollout, calls = _fake_rollout([[FLAT, FLAT], [FLAT, FLAT]])
    sampled = sample_informative(rollout, target=2, max_rounds=2)
    assert calls == [0, 1]
    assert (sampled.informative, sampled.flat_share) == ([], 1.0)
    assert sampled.trained(0) == [(0, 0), (0, 1)]


def test_trained_takes_the_first_groups_and_refuses_more_than_were_found() -> None:
    rollout, _ = _fake_rollout([[INFORMATIVE, FLAT, INFORMATIVE]])
    sampled = sample_informative(rollout, target=3, max_rounds=1)
    assert sampled.trained(2) == [(0, 0), (0, 2)]
    assert sampled.trained(1) == [(0, 0)]  # another process found fewer: every process trains on as many
    with pytest.raises(ValueError, match="cannot train on 3 of 2 informative groups"):
        sampled.trained(3)


def test_sample_informative_refuses_a_zero_target_or_bound() -> None:
    rollout, calls = _fake_rollout([[INFORMATIVE]])
    for target, rounds in ((0, 3), (1, 0)):
        with pytest.raises(ValueError, match="target >= 1 and max_rounds >= 1"):
            sample_informative(rollout, target=target, max_rounds=rounds)
    assert calls == []


# --------------------------------------------------------------------------- minibatches


@pytest.mark.parametrize(
    ("count", "group_size", "minibatch_rows", "expected"),
    [
        (3, 4, 0, 3),  # the whole batch is one minibatch
        (4, 4, 8, 4),  # 16 rows = 2 minibatches of 8
        (3, 4, 8, 2),  # 12 rows are not 8s: 8 rows = 1 minibatch
        (1, 4, 8, 1),  # 4 rows <= 8: the update takes them as one minibatch
        (5, 2, 4, 4),  # 10 -> 8 rows = 2 minibatches of 4
        (3, 5, 10, 2),  # 15 -> 10 rows
        (0, 4, 8, 0),
    ],
)
def test_trainable_groups_fit_the_minibatches(count: int, group_size: int, minibatch_rows: int, expected: int) -> None:
    assert trainable_groups(count, group_size, minibatch_rows) == expected
