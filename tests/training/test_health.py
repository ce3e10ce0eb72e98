"""training.health: the signals by hand, each rule's exact firing step on hand-built metric histories."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from simsearch.errors import RecipeError
from simsearch.policy.update import _update_metrics
from simsearch.training.health import (
    HealthConfig,
    Monitor,
    repeated_ngram_share,
    trajectory_signals,
)
from simsearch.types import QAExample, Trajectory


def _trajectory(prompt_id: int, generated: list[int], inserted: int = 0, searches: int = 0) -> Trajectory:
    ids = generated + [9] * inserted
    return Trajectory(prompt_id, QAExample("q", "q?", ["a"]), [1], ids, [1] * len(generated) + [0] * inserted, [],
                      "", None, searches, 0, "answer")  # fmt: skip


def test_repeated_ngram_share_counts_ngrams_seen_before() -> None:
    # bigrams 12 21 12 21: the last two were seen before -> 2/4
    assert repeated_ngram_share([1, 2, 1, 2, 1], 2) == pytest.approx(0.5)
    # 4-grams of 8 tokens: 5, of which 1234 2341 3412 4123 then 1234 again -> 1/5
    assert repeated_ngram_share([1, 2, 3, 4, 1, 2, 3, 4], 4) == pytest.approx(0.2)
    assert repeated_ngram_share([1, 2, 3], 4) == 0.0


def test_trajectory_signals_by_hand() -> None:
    trajectories = [
        _trajectory(0, [1, 2, 1, 2, 1], inserted=3, searches=1),  # repeats 0.5 (inserted tokens left out)
        _trajectory(0, [1, 2, 3], searches=0),  # repeats 0
        _trajectory(1, [5, 5, 5], searches=2),  # bigrams 55 55: 0.5
        _trajectory(1, [4], searches=0),
    ]
    signals = trajectory_signals(trajectories, [1.0, 0.0, 0.5, 0.5], n=2)
    assert signals["health/search_share"] == pytest.approx(0.5)  # 2 of 4 searched
    assert signals["health/repeat_ngram_share"] == pytest.approx((0.5 + 0 + 0.5 + 0) / 4)
    # group 0: rewards 1, 0 -> population std 0.5; group 1: 0.5, 0.5 -> 0; mean 0.25
    assert signals["health/group_reward_std"] == pytest.approx(0.25)


def _fire_steps(cfg: HealthConfig, rows: list[dict[str, float]]) -> list[tuple[int, str]]:
    monitor = Monitor(cfg)
    return [(a.step, a.rule) for step, row in enumerate(rows, 1) for a in monitor.observe(step, row)]


def _cfg(rule: str, **kwargs: object) -> HealthConfig:
    cfg = HealthConfig(rules=[rule], baseline_steps=3, window=2, **kwargs)  # type: ignore[arg-type]
    cfg.check("health")
    return cfg


def test_entropy_low_fires_when_the_window_mean_falls_under_the_share_of_baseline() -> None:
    # baseline median(1.0, 0.6, 1.1) = 1.0 (the mean, 0.9, would give 0.27); threshold 0.3. Window
    # means: step 4 (1.1+0.25)/2 = 0.675 (the last value alone, 0.25, would fire), step 5
    # (0.25+0.36)/2 = 0.305, step 6 (0.36+0.2)/2 = 0.28 < 0.3: fires at 6, once while it holds.
    values = [1.0, 0.6, 1.1, 0.25, 0.36, 0.2, 0.1]
    cfg = _cfg("entropy_low", entropy_low=0.3)
    assert _fire_steps(cfg, [{"health/entropy": v} for v in values]) == [(6, "entropy_low")]


def test_entropy_high_fires_again_after_it_cleared() -> None:
    # baseline 1.0, threshold 3.0: window means step 4 (1+4)/2 = 2.5, step 5 4.0 > 3 fires,
    # step 6 (4+1)/2 = 2.5 clears, step 7 (1+1)/2 = 1, step 8 (1+7)/2 = 4 fires again.
    values = [1.0, 1.0, 1.0, 4.0, 4.0, 1.0, 1.0, 7.0]
    rows = [{"health/entropy": v} for v in values]
    assert _fire_steps(_cfg("entropy_high"), rows) == [(5, "entropy_high"), (8, "entropy_high")]


def test_search_stopped_needs_a_baseline_above_the_floor() -> None:
    # baseline 1.0; window means: step 4 (1+0.1)/2 = 0.55, step 5 (0.1+0.05)/2 = 0.075 < 0.1: fires at 5.
    values = [1.0, 1.0, 1.0, 0.1, 0.05]
    assert _fire_steps(_cfg("search_stopped"), [{"health/search_share": v} for v in values]) == [(5, "search_stopped")]
    # a run that never searched (baseline 0.05 <= floor) raises nothing
    assert _fire_steps(_cfg("search_stopped"), [{"health/search_share": 0.05}] * 6) == []


def test_answer_drop_and_repeats_rising() -> None:
    # answer rate baseline 0.8, threshold 0.4: window means step 4 (0.8+0.4)/2 = 0.6, step 5 0.3 < 0.4.
    answers = [{"rollout/answer_rate": v} for v in [0.8, 0.8, 0.8, 0.4, 0.2]]
    assert _fire_steps(_cfg("answer_drop"), answers) == [(5, "answer_drop")]
    # repeats baseline 0.1, threshold 0.3: window means step 4 (0.1+0.4)/2 = 0.25, step 5 (0.4+0.4)/2 = 0.4 > 0.3.
    repeats = [{"health/repeat_ngram_share": v} for v in [0.1, 0.1, 0.1, 0.4, 0.4]]
    assert _fire_steps(_cfg("repeats_rising"), repeats) == [(5, "repeats_rising")]


def test_no_signal_fires_when_every_group_stays_flat() -> None:
    # flat_max 0.95, window 2: means step 4 (0.8+1)/2 = 0.9, step 5 (1+1)/2 = 1 >= 0.95 fires once while
    # it holds; step 7 (1+0.5)/2 = 0.75 clears it. Its reading needs no baseline value of its own.
    flat = [{"sampling/flat_share": v} for v in [0.9, 0.7, 0.8, 1.0, 1.0, 1.0, 0.5]]
    assert _fire_steps(_cfg("no_signal", flat_window=2), flat) == [(5, "no_signal")]
    # its own window: over one step it fires at the first flat step, whatever the level rules' window
    assert _fire_steps(_cfg("no_signal", flat_window=1), flat) == [(4, "no_signal")]


def test_reward_fall_compares_with_the_best_window_before_and_skips_a_best_too_low() -> None:
    # window 2, lookback 4: at step 5 the window (0.6, 0.2) means 0.4, the three steps before hold window
    # means 0.45, 0.55: 0.4 >= 0.5 x 0.55. At step 6 the window (0.2, 0.1) means 0.15; the four steps
    # before (0.4, 0.5, 0.6, 0.6) hold window means 0.45, 0.55, 0.6: 0.15 < 0.5 x 0.6 fires, once while it holds.
    rewards = [{"reward/mean": v} for v in [0.4, 0.5, 0.6, 0.6, 0.2, 0.1, 0.1]]
    cfg = _cfg("reward_fall", reward_window=2, reward_lookback=4, reward_drop=0.5)
    assert _fire_steps(cfg, rewards) == [(6, "reward_fall")]
    # the same fall from a best under reward_floor is noise, not a collapse
    low = [{"reward/mean": v / 10} for v in [0.4, 0.5, 0.6, 0.6, 0.2, 0.1, 0.1]]
    assert _fire_steps(cfg, low) == []
    # chosen on the development worlds (docs/health.md): a default rule, a fall to a tenth within two steps
    cfg = HealthConfig()
    assert "reward_fall" in cfg.rules and (cfg.reward_window, cfg.reward_drop) == (2, 0.1)


def test_default_entropy_floor_passes_the_development_worlds_healthy_sharpening() -> None:
    # Healthy RL on the tiny worlds sharpens the policy: entropy's 3-step mean fell to 0.114 x its
    # baseline on world 0 (docs/health.md); the default floor must not fire there, and must fire at 0.04.
    cfg = HealthConfig(rules=["entropy_low"])
    rows = [{"health/entropy": 0.6}] * 5 + [{"health/entropy": 0.6 * 0.114}] * 3
    assert _fire_steps(cfg, rows) == []
    assert _fire_steps(cfg, [*rows, *[{"health/entropy": 0.6 * 0.04}] * 3])[0][1] == "entropy_low"


def test_grad_norm_spike_compares_with_the_median_of_the_steps_before() -> None:
    # running median of the steps before step 5: median(1, 2, 1, 1) = 1, so 10.5 > 10 x 1 fires; at
    # step 6 the median of (1, 2, 1, 1, 10.5) is 1: 9 is no spike (it clears); step 7 30 > 10 fires.
    norms = [1.0, 2.0, 1.0, 1.0, 10.5, 9.0, 30.0]
    cfg = _cfg("grad_norm_spike")
    assert _fire_steps(cfg, [{"optim/grad_norm": v} for v in norms]) == [(5, "grad_norm_spike"), (7, "grad_norm_spike")]


def test_kl_spike_counts_a_median_under_the_floor_as_the_floor() -> None:
    # KL starts at 0: the median 0 counts as kl_floor 0.01, threshold 0.1; 0.09 passes, 0.11 fires.
    kls = [0.0, 0.0, 0.0, 0.09, 0.11]
    assert _fire_steps(_cfg("kl_spike"), [{"losses/kl": v} for v in kls]) == [(5, "kl_spike")]


def test_alarm_line_and_missing_or_non_finite_signals() -> None:
    monitor = Monitor(_cfg("entropy_low", entropy_low=0.3))
    rows = [{"health/entropy": 1.0}, {"health/entropy": float("nan")}, {}, {"health/entropy": 1.0},
            {"health/entropy": 1.0}, {"health/entropy": 0.1}, {"health/entropy": 0.1}]  # fmt: skip
    alarms = [a for step, row in enumerate(rows, 1) for a in monitor.observe(step, row)]
    # NaN and absent values are skipped: baseline from steps 1, 4, 5; window (0.1 + 0.1)/2 at step 7
    assert [a.step for a in alarms] == [7]
    assert alarms[0].line() == "health: step 7: entropy_low: health/entropy 0.1 < 0.3 (0.3 x baseline 1)"
    assert alarms[0].row()["signal"] == "health/entropy"


def test_state_dict_round_trip_resumes_the_same_decisions() -> None:
    cfg = _cfg("entropy_low", entropy_low=0.3)
    values = [1.0, 0.8, 1.2, 0.4, 0.3, 0.2, 0.1, 1.0, 1.0, 0.1, 0.1]
    whole = _fire_steps(cfg, [{"health/entropy": v} for v in values])
    first = Monitor(cfg)
    for step, v in enumerate(values[:5], 1):
        first.observe(step, {"health/entropy": v})
    first.rollbacks, first.lr_scale = 1, 0.5
    second = Monitor(cfg)
    second.load_state_dict(first.state_dict())
    rest = [
        (a.step, a.rule) for step, v in enumerate(values[5:], 6) for a in second.observe(step, {"health/entropy": v})
    ]
    assert rest == whole == [(6, "entropy_low"), (11, "entropy_low")]
    assert (second.rollbacks, second.lr_scale) == (1, 0.5)


@pytest.mark.parametrize(
    ("change", "key"),
    [({"on_alarm": "panic"}, "health.on_alarm"), ({"rules": ["nope"]}, "health.rules"),
     ({"lr_scale": 1.0}, "health.lr_scale"), ({"entropy_high": 0.5}, "health.entropy_high"),
     ({"window": 0}, "health.window"), ({"flat_window": 0}, "health.flat_window"),
     ({"reward_drop": 1.5}, "health.reward_drop"), ({"reward_lookback": 0}, "health.reward_lookback")],
)  # fmt: skip
def test_check_names_the_key(change: dict[str, object], key: str) -> None:
    cfg = HealthConfig(**change)  # type: ignore[arg-type]
    with pytest.raises(RecipeError, match=key):
        cfg.check("health")


def test_a_step_whose_rows_were_all_skipped_logs_no_entropy() -> None:
    # Every group flat: the update scores no token. An entropy of 0 would read as a collapsed policy.
    none_kept = _update_metrics(defaultdict(float), 1, torch.zeros(4, dtype=torch.bool), with_kl=False,
                                with_critic=False)  # fmt: skip
    assert "health/entropy" not in none_kept and none_kept["perf/skipped_row_share"] == 1.0
    some = _update_metrics(defaultdict(float, tokens=4.0, entropy_sum=2.0), 1, torch.ones(4, dtype=torch.bool),
                           with_kl=False, with_critic=False)  # fmt: skip
    assert some["health/entropy"] == 0.5
