"""The curriculum section of a recipe: how the share of noisy search results moves over training.

Its `kind` and `granularity` are names in `curriculum.schedules`' tables, which its check reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from simsearch.checks import check_choice, check_range, setting
from simsearch.curriculum.schedules import GRANULARITIES, SCHEDULE_KINDS
from simsearch.errors import RecipeError


@dataclass
class CurriculumConfig:
    """How the probability that a search returns noisy documents moves over training."""

    kind: str = setting("exponential", "a name in curriculum.schedules.SCHEDULE_KINDS (ZeroSearch's is exponential)")
    p_start: float = setting(0.0, "p_noise at step 0 (constant: the value throughout)")
    p_end: float = setting(0.5, "p_noise at total_steps (ZeroSearch README: 0.5)")
    base: float = setting(4.0, "exponential: b in p_s + (b^(i/m) - 1)/(b - 1)(p_e - p_s)")
    total_steps: int = setting(0, "steps over which p moves; 0 = the trainer's total steps")
    milestones: list[int] = setting(default_factory=list, help="step: steps where p changes")
    values: list[float] = setting(default_factory=list, help="step: p from each milestone on")
    target_reward: float = setting(0.5, "adaptive: raise p when the recent mean reward passes this")
    collapse_reward: float = setting(0.1, "adaptive: lower p when it falls under this")
    delta: float = setting(0.05, "adaptive: change of p per adjustment")
    window: int = setting(10, "adaptive: steps in the reward average")
    p_min: float = setting(0.0, "adaptive: lower bound")
    p_max: float = setting(0.9, "adaptive: upper bound")
    granularity: str = setting(
        "call",
        "a name in curriculum.schedules.GRANULARITIES (call: ZeroSearch's one flip per search)",
    )

    def check(self, key: str) -> None:
        check_choice(f"{key}.kind", self.kind, SCHEDULE_KINDS)
        check_choice(f"{key}.granularity", self.granularity, tuple(GRANULARITIES))
        check_range(f"{key}.p_start", self.p_start, 0.0, 1.0)
        check_range(f"{key}.p_end", self.p_end, 0.0, 1.0)
        if self.kind == "exponential" and (self.base <= 0 or self.base == 1):
            raise RecipeError(f"{key}.base={self.base} must be > 0 and != 1 (ZeroSearch: 4)")
        if self.total_steps < 0:
            raise RecipeError(f"{key}.total_steps={self.total_steps} must be >= 0 (0 = the run's steps)")
        if self.kind == "adaptive" and not (0 <= self.p_min <= self.p_max <= 1 and self.window >= 1):
            raise RecipeError(f"{key}: adaptive needs 0 <= p_min <= p_max <= 1 and window >= 1")
        if self.kind == "step" and len(self.milestones) != len(self.values):
            raise RecipeError(f"{key}.kind=step needs as many {key}.values as {key}.milestones")
