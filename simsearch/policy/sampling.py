"""DAPO's dynamic sampling: train on informative groups only, rolling out more prompts to find them.

A group is *flat* when its rewards are all exactly equal (a group of one never is); it adds no
GRPO gradient. `sample_informative` runs up to `max_rounds` rollout rounds, keeps the earliest
informative groups up to the target, and with none at all trains on the first round's groups.
Departures from verl's DAPO: docs/protocols.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


def flat_groups(rewards: Sequence[float], group_ids: Sequence[int]) -> list[int]:
    """Ids of the groups whose rewards are all equal, in order of first appearance.

    Args:
        rewards: `[B]` reward of each trajectory.
        group_ids: `[B]` group (prompt) of each trajectory; a group's rows need not be adjacent.

    Returns:
        The flat groups' ids. A group of a single trajectory is never flat.

    Raises:
        ValueError: `rewards` and `group_ids` differ in length.
    """
    if len(rewards) != len(group_ids):
        raise ValueError(f"{len(rewards)} rewards for {len(group_ids)} group ids: give one group id per reward")
    members: dict[int, list[float]] = {}
    for reward, group in zip(rewards, group_ids):
        members.setdefault(group, []).append(reward)
    return [group for group, values in members.items() if len(values) > 1 and min(values) == max(values)]


def flat_share(rewards: Sequence[float], group_ids: Sequence[int]) -> float:
    """Share of the groups whose rewards are all equal (`flat_groups`); 0.0 for an empty batch."""
    groups = len(set(group_ids))
    return len(flat_groups(rewards, group_ids)) / groups if groups else 0.0


@dataclass
class Round(Generic[T]):
    """One rollout round: what the rollout returned, and the reward and group of each trajectory.

    Attributes:
        output: Anything the caller needs later (trajectories, scores, metrics).
        rewards: `[B]` reward of each trajectory of the round.
        group_ids: `[B]` group of each trajectory, unique within the round.
    """

    output: T
    rewards: list[float]
    group_ids: list[int]

    @property
    def groups(self) -> list[int]:
        """The round's group ids, in order of first appearance."""
        return list(dict.fromkeys(self.group_ids))


@dataclass
class Sampled(Generic[T]):
    """The rounds of one step and the informative groups found in them.

    Attributes:
        rounds: Every round rolled out, in order.
        informative: (round index, group id) of each informative group found, in rollout order, at
            most the target (the excess is dropped).
    """

    rounds: list[Round[T]]
    informative: list[tuple[int, int]]

    @property
    def flat_share(self) -> float:
        """Share of the first round's groups that are flat."""
        first = self.rounds[0]
        return flat_share(first.rewards, first.group_ids)

    @property
    def prompts(self) -> int:
        """Prompts (groups) rolled out in all rounds."""
        return sum(len(r.groups) for r in self.rounds)

    def trained(self, count: int) -> list[tuple[int, int]]:
        """(round index, group id) of the groups to train on: the first `count` informative ones.

        With `count` 0 (no informative group, or none that every process can match) the step
        trains on every group of the first round instead, flat as they are: never an empty batch.

        Raises:
            ValueError: `count` is negative or more than the informative groups found.
        """
        if not 0 <= count <= len(self.informative):
            raise ValueError(f"cannot train on {count} of {len(self.informative)} informative groups")
        return self.informative[:count] if count else [(0, g) for g in self.rounds[0].groups]


def sample_informative(rollout: Callable[[int], Round[T]], target: int, max_rounds: int) -> Sampled[T]:
    """Rolls out round after round until `target` informative groups are found or `max_rounds` ran.

    Args:
        rollout: `rollout(i)` rolls out round i (0 = the step's own prompts, then the next ones of
            the data stream) and returns it with its rewards and group ids.
        target: Informative groups wanted (>= 1).
        max_rounds: Rounds at most, the first included (>= 1).

    Returns:
        The rounds and the first `target` (or fewer) informative groups.

    Raises:
        ValueError: `target` or `max_rounds` below 1.
    """
    if target < 1 or max_rounds < 1:
        raise ValueError(f"sample_informative needs target >= 1 and max_rounds >= 1; got {target}, {max_rounds}")
    rounds: list[Round[T]] = []
    informative: list[tuple[int, int]] = []
    while len(rounds) < max_rounds and len(informative) < target:
        index = len(rounds)
        this = rollout(index)
        rounds.append(this)
        flat = set(flat_groups(this.rewards, this.group_ids))
        informative += [(index, group) for group in this.groups if group not in flat]
    return Sampled(rounds, informative[:target])


def trainable_groups(count: int, group_size: int, minibatch_rows: int) -> int:
    """The most of `count` groups whose rows the update can split into minibatches.

    The update needs its rows to be a multiple of `minibatch_rows` or at most one minibatch; a
    short batch (fewer informative groups than wanted) may be neither, and then loses its last
    groups until it is.

    Args:
        count: Groups available (>= 0).
        group_size: Trajectories per group (>= 1).
        minibatch_rows: Rows per optimizer step (0 = the whole batch in one step).
    """
    while count and minibatch_rows and count * group_size > minibatch_rows and count * group_size % minibatch_rows:
        count -= 1
    return count
