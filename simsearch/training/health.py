"""Training health: the signals a collapse shows before the reward falls, and rules that raise alarms.

`trajectory_signals` reads a step's trajectories (share that searches, repeated n-grams, reward
spread inside groups); the update logs entropy, ratios and clip fractions (`policy.update`). A
`Monitor` takes each step's metrics and returns the alarms of the `RULES` the recipe's `health`
section turns on; it holds only what its rules need (each signal's first values, for a baseline,
and its recent ones) and saves it with the checkpoint. No I/O here: `simsearch train` prints the
alarms, writes them to `health.jsonl` and acts (`ON_ALARM`). What each signal means and what to do
when it fires: docs/health.md.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from simsearch.checks import check_choice, check_positive, check_range, setting
from simsearch.errors import RecipeError
from simsearch.types import Trajectory

HEALTH_FILE = "health.jsonl"
"""One JSON object per alarm (and per rollback) in the run directory."""

STOP_STATUS = 3
"""Exit status of a run the monitor stopped (`health.on_alarm=stop`, or a rollback past `max_rollbacks`)."""

ON_ALARM = {
    "warn": "print the alarm and record it in health.jsonl; training goes on",
    "stop": "also save the step's checkpoint and exit with status 3",
    "rollback": "also reload the last checkpoint before the alarm and go on with the learning rate scaled",
}
"""`health.on_alarm`: what `simsearch train` does when an alarm fires."""

ENTROPY = "health/entropy"
SEARCH_SHARE = "health/search_share"
REPEATS = "health/repeat_ngram_share"
ANSWER_RATE = "rollout/answer_rate"
GRAD_NORM = "optim/grad_norm"
FLAT_SHARE = "sampling/flat_share"
KL = "losses/kl"
REWARD = "reward/mean"


@dataclass
class HealthConfig:
    """The health monitor of `simsearch train` (docs/health.md): its rules, thresholds and action."""

    on_alarm: str = setting("warn", "a name in training.health.ON_ALARM: warn | stop | rollback")
    rules: list[str] = setting(
        default_factory=lambda: list(RULES),
        help="the rules checked (names in training.health.RULES)",
    )
    baseline_steps: int = setting(5, "a signal's baseline: the median of its first this many steps; rules wait for it")
    window: int = setting(3, "rules on levels compare the mean of a signal's last this many steps")
    entropy_low: float = setting(0.05, "entropy_low: fires under this share of health/entropy's baseline")
    entropy_high: float = setting(3.0, "entropy_high: fires over this multiple of health/entropy's baseline")
    search_floor: float = setting(
        0.1,
        "search_stopped: fires when health/search_share falls under this (baseline above it)",
    )
    flat_max: float = setting(0.95, "no_signal: fires when sampling/flat_share's mean reaches this")
    flat_window: int = setting(3, "no_signal: the mean over sampling/flat_share's last this many steps")
    answer_low: float = setting(0.5, "answer_drop: fires under this share of rollout/answer_rate's baseline")
    repeat_rise: float = setting(
        0.2,
        "repeats_rising: fires when health/repeat_ngram_share rises this much over its baseline",
    )
    repeat_n: int = setting(4, "tokens per n-gram of health/repeat_ngram_share")
    spike_k: float = setting(10.0, "grad_norm_spike / kl_spike: fires over k x the median of the signal's recent steps")
    spike_window: int = setting(20, "steps in that running median")
    kl_floor: float = setting(0.01, "kl_spike: the running median counts as at least this (KL starts at 0)")
    reward_drop: float = setting(
        0.1,
        "reward_fall: fires when reward/mean's window mean falls under this share of its best window mean before",
    )
    reward_window: int = setting(2, "reward_fall: the steps of a window mean of reward/mean")
    reward_lookback: int = setting(10, "reward_fall: the best window mean is taken over this many steps before")
    reward_floor: float = setting(0.1, "reward_fall: a best window mean under this is nothing to fall from")
    lr_scale: float = setting(0.5, "rollback: the learning rate is multiplied by this at each rollback")
    max_rollbacks: int = setting(2, "rollback: at most this many; an alarm after them stops the run (status 3)")

    def check(self, key: str) -> None:
        check_choice(f"{key}.on_alarm", self.on_alarm, tuple(ON_ALARM))
        for name in self.rules:
            check_choice(f"{key}.rules", name, tuple(RULES))
        for name in ("baseline_steps", "window", "flat_window", "repeat_n", "spike_window", "reward_window",
                     "reward_lookback"):  # fmt: skip
            check_positive(f"{key}.{name}", getattr(self, name))
        check_range(f"{key}.entropy_low", self.entropy_low, 0.0, 1.0)
        check_range(f"{key}.search_floor", self.search_floor, 0.0, 1.0)
        check_range(f"{key}.answer_low", self.answer_low, 0.0, 1.0)
        check_range(f"{key}.flat_max", self.flat_max, 0.0, 1.0)
        check_range(f"{key}.repeat_rise", self.repeat_rise, 0.0, 1.0)
        check_range(f"{key}.reward_drop", self.reward_drop, 0.0, 1.0)
        check_range(f"{key}.reward_floor", self.reward_floor, 0.0, 1.0)
        if not self.entropy_high > 1:
            raise RecipeError(f"{key}.entropy_high={self.entropy_high} must be > 1 (a multiple of the baseline)")
        if not self.spike_k > 1:
            raise RecipeError(f"{key}.spike_k={self.spike_k} must be > 1 (a multiple of the running median)")
        if not 0 < self.lr_scale < 1:
            raise RecipeError(f"{key}.lr_scale={self.lr_scale} must be in (0, 1): a rollback lowers the learning rate")
        if self.max_rollbacks < 0:
            raise RecipeError(f"{key}.max_rollbacks={self.max_rollbacks} must be >= 0")
        if self.kl_floor < 0:
            raise RecipeError(f"{key}.kl_floor={self.kl_floor} must be >= 0")


# ---------------------------------------------------------------------------------------------
# Signals
# ---------------------------------------------------------------------------------------------


def repeated_ngram_share(tokens: Sequence[int], n: int) -> float:
    """The share of a sequence's n-grams that already occurred earlier in it (0 with fewer than n tokens).

    [1, 2, 1, 2, 1] with n=2: n-grams 12 21 12 21, the last two repeat: 0.5.
    """
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


def trajectory_signals(trajectories: Sequence[Trajectory], rewards: Sequence[float], n: int) -> dict[str, float]:
    """A step's `health/*` signals of its trajectories (and their rewards, in the same order).

    Returns:
        `health/search_share` (trajectories that searched at least once), `health/repeat_ngram_share`
        (mean over trajectories of `repeated_ngram_share` of the tokens the policy generated), and
        `health/group_reward_std` (mean over groups, by `prompt_id`, of the rewards' population std).
    """
    count = max(len(trajectories), 1)
    groups: dict[int, list[float]] = defaultdict(list)
    for trajectory, reward in zip(trajectories, rewards, strict=True):
        groups[trajectory.prompt_id].append(reward)
    generated = [[tok for tok, m in zip(t.response_ids, t.loss_mask, strict=True) if m] for t in trajectories]
    return {
        SEARCH_SHARE: sum(t.num_searches > 0 for t in trajectories) / count,
        REPEATS: sum(repeated_ngram_share(tokens, n) for tokens in generated) / count,
        "health/group_reward_std": sum(statistics.pstdev(g) for g in groups.values()) / max(len(groups), 1),
    }


# ---------------------------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------------------------


@dataclass
class History:
    """What the rules read of each signal: its first `baseline_steps` values and its last `keep` ones."""

    baseline_steps: int
    keep: int
    first: dict[str, list[float]] = field(default_factory=dict)
    recent: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        first = self.first.setdefault(name, [])
        if len(first) < self.baseline_steps:
            first.append(value)
        recent = self.recent.setdefault(name, [])
        recent.append(value)
        del recent[: -self.keep]

    def baseline(self, name: str) -> float | None:
        """The median of the signal's first values, once it has `baseline_steps` of them; else None."""
        first = self.first.get(name, [])
        return statistics.median(first) if len(first) == self.baseline_steps else None

    def mean(self, name: str, n: int) -> float | None:
        """The mean of its last n values (None before n, or before the baseline is complete)."""
        recent = self.recent.get(name, [])
        if len(recent) < n or self.baseline(name) is None:
            return None
        return sum(recent[-n:]) / n

    def latest_and_median(self, name: str, n: int) -> tuple[float, float] | None:
        """(its last value, the median of up to n values before it); None before the baseline is complete."""
        recent = self.recent.get(name, [])
        if self.baseline(name) is None or len(recent) < 2:
            return None
        return recent[-1], statistics.median(recent[-n - 1 : -1])


@dataclass(frozen=True)
class Reading:
    """A rule that fires: the signal, the value it compared, the threshold it crossed, and how."""

    signal: str
    value: float
    threshold: float
    relation: str  # "<", ">" or ">="
    why: str  # how the threshold was derived ("0.3 x baseline 0.112")


Rule = Callable[[History, HealthConfig], Reading | None]


def entropy_low(h: History, cfg: HealthConfig) -> Reading | None:
    """The policy stops exploring: entropy's window mean under `entropy_low` x its baseline."""
    value, base = h.mean(ENTROPY, cfg.window), h.baseline(ENTROPY)
    if value is None or base is None or not value < cfg.entropy_low * base:
        return None
    return Reading(ENTROPY, value, cfg.entropy_low * base, "<", f"{cfg.entropy_low:g} x baseline {base:.4g}")


def entropy_high(h: History, cfg: HealthConfig) -> Reading | None:
    """The policy falls apart into noise: entropy's window mean over `entropy_high` x its baseline."""
    value, base = h.mean(ENTROPY, cfg.window), h.baseline(ENTROPY)
    if value is None or base is None or not value > cfg.entropy_high * base:
        return None
    return Reading(ENTROPY, value, cfg.entropy_high * base, ">", f"{cfg.entropy_high:g} x baseline {base:.4g}")


def search_stopped(h: History, cfg: HealthConfig) -> Reading | None:
    """The policy stops searching: the share that searches under `search_floor`, from a baseline above it."""
    value, base = h.mean(SEARCH_SHARE, cfg.window), h.baseline(SEARCH_SHARE)
    if value is None or base is None or base <= cfg.search_floor or not value < cfg.search_floor:
        return None
    return Reading(SEARCH_SHARE, value, cfg.search_floor, "<", f"search_floor, baseline {base:.3g}")


def no_signal(h: History, cfg: HealthConfig) -> Reading | None:
    """Nothing left to learn from: the share of groups whose rewards are all equal reaches `flat_max`."""
    value = h.mean(FLAT_SHARE, cfg.flat_window)
    if value is None or not value >= cfg.flat_max:
        return None
    return Reading(FLAT_SHARE, value, cfg.flat_max, ">=", "flat_max")


def answer_drop(h: History, cfg: HealthConfig) -> Reading | None:
    """Trajectories stop answering: the answer rate under `answer_low` x its baseline."""
    value, base = h.mean(ANSWER_RATE, cfg.window), h.baseline(ANSWER_RATE)
    if value is None or base is None or not value < cfg.answer_low * base:
        return None
    return Reading(ANSWER_RATE, value, cfg.answer_low * base, "<", f"{cfg.answer_low:g} x baseline {base:.3g}")


def repeats_rising(h: History, cfg: HealthConfig) -> Reading | None:
    """Responses degenerate into loops: the repeated n-gram share `repeat_rise` above its baseline."""
    value, base = h.mean(REPEATS, cfg.window), h.baseline(REPEATS)
    if value is None or base is None or not value > base + cfg.repeat_rise:
        return None
    return Reading(REPEATS, value, base + cfg.repeat_rise, ">", f"baseline {base:.3g} + {cfg.repeat_rise:g}")


def reward_fall(h: History, cfg: HealthConfig) -> Reading | None:
    """Rewards collapse within a few steps: the training reward's window mean under `reward_drop` x its best
    window mean over the `reward_lookback` steps before that window (a best under `reward_floor` is skipped)."""
    recent, n = h.recent.get(REWARD, []), cfg.reward_window
    before = recent[-(cfg.reward_lookback + n) : -n]
    if h.baseline(REWARD) is None or len(before) < n:
        return None
    value = sum(recent[-n:]) / n
    best = max(sum(before[i : i + n]) / n for i in range(len(before) - n + 1))
    if best < cfg.reward_floor or not value < cfg.reward_drop * best:
        return None
    why = f"{cfg.reward_drop:g} x best window mean {best:.3g} of the {len(before)} steps before"
    return Reading(REWARD, value, cfg.reward_drop * best, "<", why)


def grad_norm_spike(h: History, cfg: HealthConfig) -> Reading | None:
    """A gradient far outside the run's range: the step's norm over `spike_k` x the running median."""
    return _spike(h, GRAD_NORM, cfg, floor=0.0)


def kl_spike(h: History, cfg: HealthConfig) -> Reading | None:
    """The policy jumps away from the reference: the step's KL over `spike_k` x max(running median, kl_floor)."""
    return _spike(h, KL, cfg, floor=cfg.kl_floor)


def _spike(h: History, name: str, cfg: HealthConfig, floor: float) -> Reading | None:
    seen = h.latest_and_median(name, cfg.spike_window)
    if seen is None:
        return None
    value, median = seen
    threshold = cfg.spike_k * max(median, floor)
    if not value > threshold:
        return None
    return Reading(name, value, threshold, ">", f"{cfg.spike_k:g} x running median {median:.4g}")


RULES: dict[str, Rule] = {
    "entropy_low": entropy_low,
    "entropy_high": entropy_high,
    "search_stopped": search_stopped,
    "no_signal": no_signal,
    "answer_drop": answer_drop,
    "repeats_rising": repeats_rising,
    "grad_norm_spike": grad_norm_spike,
    "kl_spike": kl_spike,
    "reward_fall": reward_fall,
}
"""Every rule by name; `health.rules` lists those a run checks."""

SIGNALS = (ENTROPY, SEARCH_SHARE, FLAT_SHARE, REPEATS, ANSWER_RATE, GRAD_NORM, KL, REWARD)
"""The metrics the rules read; the monitor keeps nothing else."""


# ---------------------------------------------------------------------------------------------
# The monitor
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Alarm:
    """One rule that started firing at one step."""

    step: int
    rule: str
    reading: Reading

    def line(self) -> str:
        """One line: 'health: step 12: entropy_low: health/entropy 0.021 < 0.034 (0.3 x baseline 0.112)'."""
        r = self.reading
        return (f"health: step {self.step}: {self.rule}: {r.signal} {r.value:.4g} {r.relation} {r.threshold:.4g} "
                f"({r.why})")  # fmt: skip

    def row(self) -> dict[str, Any]:
        """Its `health.jsonl` object."""
        return {"step": self.step, "rule": self.rule, **asdict(self.reading), "line": self.line()}


class Monitor:
    """Runs the recipe's rules over each step's metrics; an alarm when a rule starts firing.

    A rule that keeps firing raises one alarm, another once it has stopped and fires again.
    `rollbacks` and `lr_scale` count what `simsearch train` did about alarms; all of it is in
    `state_dict`, so a resumed run goes on with it.
    """

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg
        keep = max(cfg.window, cfg.flat_window, cfg.spike_window + 1, cfg.reward_lookback + cfg.reward_window)
        self.history = History(cfg.baseline_steps, keep)
        self.firing: set[str] = set()
        self.rollbacks = 0
        self.lr_scale = 1.0

    def observe(self, step: int, metrics: dict[str, float]) -> list[Alarm]:
        """Records the step's signals (finite ones; others are skipped) and returns the new alarms."""
        for name in SIGNALS:
            value = metrics.get(name)
            if value is not None and math.isfinite(value):
                self.history.add(name, float(value))
        alarms = []
        for name in self.cfg.rules:
            reading = RULES[name](self.history, self.cfg)
            if reading is None:
                self.firing.discard(name)
            elif name not in self.firing:
                self.firing.add(name)
                alarms.append(Alarm(step, name, reading))
        return alarms

    def state_dict(self) -> dict[str, Any]:
        """Plain lists, numbers and strings (a trainer state loads with `weights_only=True`)."""
        return {"first": self.history.first, "recent": self.history.recent, "firing": sorted(self.firing),
                "rollbacks": self.rollbacks, "lr_scale": self.lr_scale}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history.first = {k: list(v) for k, v in state["first"].items()}
        self.history.recent = {k: list(v) for k, v in state["recent"].items()}
        self.firing = set(state["firing"])
        self.rollbacks, self.lr_scale = int(state["rollbacks"]), float(state["lr_scale"])
