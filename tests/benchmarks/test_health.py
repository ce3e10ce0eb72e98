"""benchmarks/health.py: its pure parts by hand, and `--smoke` end to end."""

from __future__ import annotations

from benchmarks import health


def _rows(ems: list[float | None]) -> list[dict]:
    return [{"step": i, "val/em": em} for i, em in enumerate(ems, 1)]


def test_em_fall_step_is_the_first_step_under_half_the_early_best() -> None:
    # best of the first 3 evaluations: 0.75; half is 0.375: step 5 (0.5) holds, step 6 (0.25) falls
    assert health.em_fall_step(_rows([0.5, 0.75, 0.5, 0.5, 0.5, 0.25, 0.0])) == 6
    assert health.em_fall_step(_rows([0.5, None, 0.5, 0.5, 0.2])) == 5  # steps without validation skipped
    assert health.em_fall_step(_rows([0.5, 0.5, 0.5, 0.5])) is None
    assert health.em_fall_step(_rows([0.0, 0.0, 0.0, 0.0])) is None  # nothing to fall from


def test_summarize_counts_leads_detections_and_false_alarms() -> None:
    runs = [
        {"fall": 10, "alarms": {"entropy_high": 7, "kl_spike": 12}, "share": 0.01, "recovered": True},
        {"fall": 5, "alarms": {"kl_spike": 6}, "share": 0.03, "recovered": False},  # alarm after the fall
        {"fall": None, "alarms": {"answer_drop": 3}, "share": 0.02},  # a false alarm
        {"fall": None, "alarms": {}, "share": 0.02},
    ]
    out = health.summarize(runs)
    assert (out["collapsed_runs"], out["detected_runs"], out["false_alarm_runs"]) == (2, 1, 1)
    assert out["median_lead_steps"] == 3  # 10 - 7
    assert out["leads"] == {"entropy_high": [3], "kl_spike": [-2, -1]}
    assert (out["rollback_recovered_runs"], out["rollback_runs"]) == (1, 2)
    assert abs(out["monitor_share"] - 0.02) < 1e-12


def test_smoke_runs_end_to_end() -> None:
    out = health.main(["--smoke"])
    assert out["smoke"] and out["steps"] == 3
    assert [r["arm"] for r in out["runs"]] == list(health.SMOKE_ARMS)
    for key in ("collapsed_runs", "detected_runs", "median_lead_steps", "false_alarm_runs",
                "rollback_recovered_runs", "monitor_share"):  # fmt: skip
        assert key in out
    assert 0 < out["monitor_share"] < 0.5
