"""Validation during training: greedy rollouts on held-out questions, scored with EM, F1 and substring EM.

Every question is kept (ZeroSearch's validation loader used `drop_last`, which did not): each
process rolls out its share and the sums are reduced over processes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from simsearch.policy.rewards import score_trajectories
from simsearch.policy.rollout import RolloutSettings, generate_trajectories
from simsearch.training.distributed import all_reduce_sum
from simsearch.types import QAExample, SamplingParams

VAL_REWARDS = {"em": 1.0, "f1": 1.0, "substring_em": 1.0}


@dataclass
class Validation:
    """What validation rolls out and with what.

    Attributes:
        examples: Every validation question (each process takes every `world`-th one).
        search: The validation search engine.
        settings: Rollout settings for it.
        max_new_tokens: Per generation.
        normalization: Answer normalization for the scores.
        seed: The recipe's seed.
    """

    examples: list[QAExample]
    search: Any
    settings: RolloutSettings
    max_new_tokens: int
    normalization: str
    seed: int


def validate(val: Validation, generator: Any, tokenizer: Any, rank: int, world: int) -> dict[str, float]:
    """`val/em`, `val/f1`, `val/substring_em` and `val/calls_per_traj` over every validation question.

    The caller holds the generation context (autocast) the rollout needs.
    """
    mine = val.examples[rank::world]
    totals = torch.zeros(5, dtype=torch.float64)  # em, f1, substring_em, searches, count
    if mine:
        result = generate_trajectories(
            mine, policy=generator, tokenizer=tokenizer, search=val.search, settings=val.settings,
            sampling=SamplingParams(temperature=0.0, max_new_tokens=val.max_new_tokens),
            group_size=1, rng=random.Random(f"val:{val.seed}:{rank}"),
        )  # fmt: skip
        scored = score_trajectories(result.trajectories, VAL_REWARDS, normalization=val.normalization)
        totals += torch.tensor(
            [sum(scored.components[k]) for k in ("em", "f1", "substring_em")]
            + [sum(t.num_searches for t in result.trajectories), len(mine)],
            dtype=torch.float64,
        )
    totals = all_reduce_sum(totals, world)
    count = max(float(totals[4]), 1.0)
    names = ("val/em", "val/f1", "val/substring_em", "val/calls_per_traj")
    return {name: float(totals[i]) / count for i, name in enumerate(names)}
