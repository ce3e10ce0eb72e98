"""The noise curriculum a `/retrieve` server runs for the trainers it serves.

`train` decides p_noise itself; a trainer of another framework only sends queries. The server
therefore keeps each client's place on the schedule: the training step the client last reported
(a `step` in a request, or `POST /curriculum`), or, for a client that never reports one, the
searches it has been served against the run's declared total:
`step = searches_served * total_steps // total_searches`. The schedules are `train`'s
(`make_schedule`), and so is the noise per query (`num_noisy`, by granularity).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from inspect import signature
from typing import Any

from simsearch.curriculum.recipe import CurriculumConfig
from simsearch.curriculum.schedules import ADAPTIVE, P_NOISE, NoiseSchedule, num_noisy
from simsearch.errors import RecipeError

STEP_SOURCES: tuple[str, ...] = ("request", "reported", "searches", "none")
"""Where a served step came from: this request's `step`, the client's last report, its searches
served against `total_searches`, or nothing yet (step 0)."""


def needs_total_steps(kind: str) -> bool:
    """Whether schedule `kind` moves over `total_steps` (the curves), so a server must be told them."""
    return kind in P_NOISE and "total_steps" in signature(P_NOISE[kind]).parameters


@dataclass(frozen=True)
class NoiseDraw:
    """The curriculum's decision for one request: the step it read and the p_noise at that step."""

    step: int
    p_noise: float
    source: str  # a name in STEP_SOURCES


@dataclass
class _ClientPlace:
    schedule: NoiseSchedule
    reported_step: int | None = None
    searches: int = 0
    last: NoiseDraw | None = None


@dataclass
class ServedCurriculum:
    """Per-client schedule positions; thread-safe.

    Args:
        make_schedule: Builds a fresh schedule (one per client: the adaptive one keeps state).
        total_steps: The trainer's total steps (maps searches to steps; 0 for schedules without).
        total_searches: Searches the training run makes in all; 0 = only reported steps move it.
        granularity: A name in `curriculum.schedules.GRANULARITIES`.
        seed: Seeds the noise draws.
    """

    make_schedule: Callable[[], NoiseSchedule]
    total_steps: int
    total_searches: int
    granularity: str
    seed: int = 0
    _places: dict[str, _ClientPlace] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._place("")  # checks the schedule now, not at the first request

    def _place(self, client: str) -> _ClientPlace:
        if client not in self._places:
            self._places[client] = _ClientPlace(self.make_schedule())
        return self._places[client]

    def report(self, client: str, step: int, metrics: dict[str, float] | None = None) -> NoiseDraw:
        """Records `client`'s training step (and, for an adaptive schedule, that step's metrics)."""
        if step < 0:
            raise ValueError(f"step={step} must be >= 0")
        with self._lock:
            place = self._place(client)
            if metrics:
                place.schedule.observe(metrics)
            place.reported_step = step
            place.last = NoiseDraw(step, place.schedule(step), "reported")
            return place.last

    def draw(self, client: str, queries: int, step: int | None = None) -> NoiseDraw:
        """The step and p_noise for a request of `queries` queries from `client`; counts them as served."""
        with self._lock:
            place = self._place(client)
            if step is not None:
                place.reported_step, source = step, "request"
            elif place.reported_step is not None:
                step, source = place.reported_step, "reported"
            elif self.total_searches > 0:
                step, source = place.searches * self.total_steps // self.total_searches, "searches"
            else:
                step, source = 0, "none"
            place.searches += queries
            place.last = NoiseDraw(step, place.schedule(step), source)
            return place.last

    def noisy_counts(self, p_noise: float, top_k: int, queries: int) -> list[int]:
        """Noisy documents of each of `queries` queries of `top_k` (`num_noisy` at this granularity)."""
        with self._lock:
            return [num_noisy(p_noise, top_k, self.granularity, self._rng) for _ in range(queries)]

    def state(self) -> dict[str, Any]:
        """For `/health` and the closing line: per client, its searches and its last step and p_noise."""
        with self._lock:
            return {
                client or "(unnamed)": {
                    "searches": place.searches,
                    "step": place.last.step if place.last else None,
                    "p_noise": place.last.p_noise if place.last else None,
                    "source": place.last.source if place.last else None,
                }
                for client, place in sorted(self._places.items())
                if place.last is not None or not client
            }


def check_served_curriculum(cfg: CurriculumConfig, total_searches: int) -> None:
    """`simsearch serve`'s checks of its `curriculum` section and `curriculum_total_searches`.

    Raises:
        RecipeError: The section is invalid, or a curve has no `total_steps` to move over (a server
            has no trainer to take them from), naming the key and the fix.
    """
    cfg.check("curriculum")
    if total_searches < 0:
        raise RecipeError(f"curriculum_total_searches={total_searches} must be >= 0 (0 = reported steps only)")
    if cfg.kind == ADAPTIVE and total_searches > 0:
        raise RecipeError(
            "curriculum.kind=adaptive moves on the rewards a trainer posts to /curriculum, not on searches "
            "served: set curriculum_total_searches=0, or pick a schedule over steps"
        )
    if cfg.total_steps == 0 and (needs_total_steps(cfg.kind) or total_searches > 0):
        raise RecipeError(
            f"curriculum.total_steps=0: a server has no trainer to take the run's steps from; set it to the "
            f"trainer's total steps (verl: trainer.total_training_steps), as curriculum.kind={cfg.kind} moves over them"
        )
