"""How likely a search is to return noisy documents (p_noise), as training goes on.

Stateless schedules are functions `p_noise(step, **params)` in `P_NOISE`; the adaptive one is
`AdaptiveSchedule`. `make_schedule` binds either as a `NoiseSchedule`; `num_noisy` turns p
into a count of noisy documents.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from inspect import signature
from typing import Any, Protocol

ADAPTIVE = "adaptive"
"""The kind name of `AdaptiveSchedule`, the one schedule with state."""

ADAPTIVE_METRIC = "reward/mean"
"""The metric `AdaptiveSchedule.observe` reads: the batch mean of the training reward."""


class NoiseSchedule(Protocol):
    """p_noise(step), optionally steered by training metrics; checkpointable."""

    def __call__(self, step: int) -> float: ...

    def observe(self, metrics: dict[str, float]) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _check_probability(owner: str, name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{owner}: {name} must be a probability in [0, 1], got {value}")


def _check_total_steps(owner: str, total_steps: int) -> None:
    if total_steps <= 0:
        raise ValueError(
            f"{owner}: total_steps must be > 0, got {total_steps}; set curriculum.total_steps, "
            "or pass the trainer's total steps"
        )


def _check_step(step: int) -> None:
    if step < 0:
        raise ValueError(f"the training step must be >= 0, got {step}")


def _check_kind(kind: str, state: dict[str, Any]) -> None:
    if state.get("kind") != kind:
        raise ValueError(
            f"{kind} schedule: the checkpoint holds curriculum state for kind {state.get('kind')!r}, "
            f"not {kind!r}; resume with the curriculum kind the run was trained with"
        )


def _check_curve(owner: str, step: int, p_start: float, p_end: float, total_steps: int) -> float:
    """Checks a curve's arguments; returns the progress min(step / total_steps, 1)."""
    _check_step(step)
    _check_probability(owner, "p_start", p_start)
    _check_probability(owner, "p_end", p_end)
    _check_total_steps(owner, total_steps)
    return min(step / total_steps, 1.0)


# --------------------------------------------------------------------------- stateless schedules


def exponential(step: int, p_start: float, p_end: float, total_steps: int, base: float = 4.0) -> float:
    """p_i = p_s + (b^(i/m) - 1) / (b - 1) · (p_e - p_s) up to step m = `total_steps`, then p_e (b > 0, b != 1)."""
    progress = _check_curve("exponential schedule", step, p_start, p_end, total_steps)
    if not (base > 0.0 and base != 1.0 and math.isfinite(base)):
        raise ValueError(f"exponential schedule: base must be finite, > 0 and != 1, got {base}")
    if progress >= 1.0:
        return p_end
    return p_start + (base**progress - 1.0) / (base - 1.0) * (p_end - p_start)


def linear(step: int, p_start: float, p_end: float, total_steps: int) -> float:
    """p moves in a straight line from p_start to p_end over total_steps, then stays."""
    progress = _check_curve("linear schedule", step, p_start, p_end, total_steps)
    return p_start + progress * (p_end - p_start)


def cosine(step: int, p_start: float, p_end: float, total_steps: int) -> float:
    """p follows half a cosine from p_start to p_end (slow, fast, slow), then stays."""
    progress = _check_curve("cosine schedule", step, p_start, p_end, total_steps)
    return p_start + (1.0 - math.cos(math.pi * progress)) / 2.0 * (p_end - p_start)


def piecewise(step: int, p_start: float, milestones: list[int], values: list[float]) -> float:
    """p_start, then values[j] from step milestones[j] on (milestones strictly increasing, >= 0)."""
    owner = "step schedule"
    _check_step(step)
    _check_probability(owner, "p_start", p_start)
    if len(milestones) != len(values):
        raise ValueError(
            f"{owner}: milestones and values must have the same length (values[j] applies from step "
            f"milestones[j] on), got {len(milestones)} milestones and {len(values)} values"
        )
    if any(m < 0 for m in milestones) or not all(a < b for a, b in itertools.pairwise(milestones)):
        raise ValueError(f"{owner}: milestones must be >= 0 and strictly increasing, got {milestones}")
    p = p_start
    for j, (milestone, value) in enumerate(zip(milestones, values)):
        _check_probability(owner, f"values[{j}]", value)
        if step >= milestone:
            p = value
    return p


def constant(step: int, p_start: float) -> float:
    """The same p at every step."""
    _check_step(step)
    _check_probability("constant schedule", "p_start", p_start)
    return p_start


P_NOISE: dict[str, Callable[..., float]] = {
    "exponential": exponential,
    "linear": linear,
    "cosine": cosine,
    "step": piecewise,
    "constant": constant,
}
"""The stateless schedules by recipe name (`curriculum.kind`): p_noise(step, **params)."""


@dataclass(frozen=True)
class FixedSchedule:
    """A stateless schedule bound to its parameters: the step alone decides p."""

    kind: str  # a name in P_NOISE
    params: dict[str, Any] = field(default_factory=dict)

    def __call__(self, step: int) -> float:
        return P_NOISE[self.kind](step, **self.params)

    def observe(self, metrics: dict[str, float]) -> None:
        """Does nothing: the step alone decides p."""

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_kind(self.kind, state)


# --------------------------------------------------------------------------- the adaptive schedule


class AdaptiveSchedule:
    """Raises p when the policy does well, lowers it when rewards collapse; the step is ignored.

    Once the window of the last `window` (>= 1) `reward/mean` values is full, a mean at or above
    `target_reward` raises p by `delta` (> 0) and one below `collapse_reward` (< `target_reward`)
    lowers it, within [p_min, p_max] (holding `p_start`); a change empties the window.
    """

    def __init__(
        self,
        p_start: float,
        p_min: float,
        p_max: float,
        delta: float,
        window: int,
        target_reward: float,
        collapse_reward: float,
    ) -> None:
        owner = "adaptive schedule"
        _check_probability(owner, "p_min", p_min)
        _check_probability(owner, "p_max", p_max)
        _check_probability(owner, "p_start", p_start)
        if not p_min <= p_start <= p_max:
            raise ValueError(
                f"{owner}: need p_min <= p_start <= p_max, got p_min={p_min}, p_start={p_start}, p_max={p_max}"
            )
        if not 0.0 < delta <= 1.0:
            raise ValueError(f"{owner}: delta must be in (0, 1], got {delta}")
        if window < 1:
            raise ValueError(f"{owner}: window must be >= 1, got {window}")
        if not collapse_reward < target_reward:
            raise ValueError(
                f"{owner}: collapse_reward must be < target_reward, got "
                f"collapse_reward={collapse_reward}, target_reward={target_reward}"
            )
        self.p_min = p_min
        self.p_max = p_max
        self.delta = delta
        self.window = window
        self.target_reward = target_reward
        self.collapse_reward = collapse_reward
        self.p = p_start
        self._recent: deque[float] = deque(maxlen=window)

    def __call__(self, step: int) -> float:
        _check_step(step)
        return self.p

    def observe(self, metrics: dict[str, float]) -> None:
        """Records one step's `metrics["reward/mean"]` (finite) and adjusts p when the window says so."""
        if ADAPTIVE_METRIC not in metrics:
            raise ValueError(
                f"AdaptiveSchedule.observe needs {ADAPTIVE_METRIC!r} in the metrics, got keys "
                f"{sorted(metrics)}; pass the step's reward statistics"
            )
        reward = metrics[ADAPTIVE_METRIC]
        if not math.isfinite(reward):
            raise ValueError(f"AdaptiveSchedule.observe got {ADAPTIVE_METRIC}={reward}")
        self._recent.append(float(reward))
        if len(self._recent) < self.window:
            return
        mean = sum(self._recent) / len(self._recent)
        if mean >= self.target_reward:
            self.p = min(self.p + self.delta, self.p_max)
            self._recent.clear()
        elif mean < self.collapse_reward:
            self.p = max(self.p - self.delta, self.p_min)
            self._recent.clear()

    def state_dict(self) -> dict[str, Any]:
        return {"kind": ADAPTIVE, "p": self.p, "recent": list(self._recent)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_kind(ADAPTIVE, state)
        recent = [float(r) for r in state["recent"]]
        if len(recent) > self.window:
            raise ValueError(
                f"AdaptiveSchedule: the checkpoint's reward window holds {len(recent)} values "
                f"but window is {self.window}; resume with the run's curriculum.window"
            )
        self.p = float(state["p"])
        self._recent = deque(recent, maxlen=self.window)


SCHEDULE_KINDS: tuple[str, ...] = (*P_NOISE, ADAPTIVE)
"""Every `curriculum.kind` a recipe may name."""


def make_schedule(kind: str, /, **settings: Any) -> NoiseSchedule:
    """The schedule `kind` of `SCHEDULE_KINDS`, bound to the `settings` it names (others ignored).

    Raises:
        ValueError: On an unknown kind or invalid parameters (the message names the bad one).
    """
    if kind == ADAPTIVE:
        return AdaptiveSchedule(**_taken(AdaptiveSchedule, settings))
    if kind not in P_NOISE:
        raise ValueError(f"curriculum.kind {kind!r} is unknown; use one of {', '.join(SCHEDULE_KINDS)}")
    schedule = FixedSchedule(kind, _taken(P_NOISE[kind], settings))
    schedule(0)  # checks the parameters now rather than at the first training step
    return schedule


def _taken(function: Callable[..., Any], settings: dict[str, Any]) -> dict[str, Any]:
    names = [name for name in signature(function).parameters if name != "step"]
    return {name: settings[name] for name in names if name in settings}


# --------------------------------------------------------------------------- noisy documents per call


def _one_flip_per_call(p: float, top_k: int, rng: random.Random) -> int:
    return top_k if rng.random() < p else 0


def _one_flip_per_document(p: float, top_k: int, rng: random.Random) -> int:
    return sum(rng.random() < p for _ in range(top_k))


GRANULARITIES: dict[str, Callable[[float, int, random.Random], int]] = {
    "call": _one_flip_per_call,  # ZeroSearch: 0 or top_k
    "document": _one_flip_per_document,  # ours: Binomial(top_k, p)
}
"""How `num_noisy` turns p_noise into a count of noisy documents, by `curriculum.granularity`."""


def num_noisy(p: float, top_k: int, granularity: str, rng: random.Random) -> int:
    """How many of a call's `top_k` documents are noisy: per "call" 0 or top_k, per "document" Binomial(top_k, p)."""
    _check_probability("num_noisy", "p", p)
    if top_k < 0:
        raise ValueError(f"num_noisy: top_k must be >= 0, got {top_k}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"num_noisy: granularity must be one of {', '.join(GRANULARITIES)}, got {granularity!r}")
    return GRANULARITIES[granularity](p, top_k, rng)
