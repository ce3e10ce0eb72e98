"""benchmarks/health.py: its pure parts by hand, and `--smoke` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import health
from simsearch.training.health import HealthConfig


def _rows(ems: list[float | None]) -> list[dict]:
    return [{"step": i, "val/em": em} for i, em in enumerate(ems, 1)]


def test_em_fall_step_is_the_first_validation_under_half_the_best_before_it() -> None:
    # best so far 0.75 at step 2; half is 0.375: step 5 (0.5) holds, step 6 (0.25) falls
    assert health.em_fall_step(_rows([0.5, 0.75, 0.5, 0.5, 0.5, 0.25, 0.0])) == 6
    assert health.em_fall_step(_rows([0.2, None, 0.5, 0.3, 0.2])) == 5  # steps without validation skipped
    assert health.em_fall_step(_rows([0.1, 0.3, 0.6, 0.9])) is None  # a rising run never falls
    assert health.em_fall_step(_rows([0.08, 0.0, 0.0, 0.0])) is None  # a best under MIN_BEST: nothing to fall from


def test_first_alarms_replays_the_rules_over_metrics_rows() -> None:
    cfg = HealthConfig(rules=["no_signal", "answer_drop"], baseline_steps=2, window=2, flat_window=2)
    rows = [{"step": s, "sampling/flat_share": f, "rollout/answer_rate": a}
            for s, f, a in [(1, 0.5, 1.0), (2, 0.5, 1.0), (3, 1.0, 1.0), (4, 1.0, 0.2), (5, 1.0, 0.2)]]  # fmt: skip
    # no_signal: window means step 3 0.75, step 4 1.0 >= 0.95; answer_drop: step 5 (0.2+0.2)/2 < 0.5 x 1.0
    assert health.first_alarms(rows, cfg) == {"no_signal": 4, "answer_drop": 5}


def test_judge_reads_the_fall_the_alarms_and_the_rollbacks_outcome() -> None:
    cfg = HealthConfig(rules=["no_signal"], baseline_steps=1, window=1, flat_window=1)
    rows = [{"step": s, "val/em": em, "sampling/flat_share": f, "time/step_s": 1.0, "time/health_s": 0.01}
            for s, em, f in [(1, 0.4, 0.5), (2, None, 1.0), (3, 0.1, 1.0)]]  # fmt: skip
    back = {"rows": [{"step": 3, "val/em": 0.3}], "alarms": [{"step": 2, "action": "rolled_back"}]}
    judged = health._judge({"world": 0, "arm": "lr_x10", "rows": rows, "rollback": back}, cfg)
    assert (judged["fall"], judged["alarms"], judged["recovered"]) == (3, {"no_signal": 2}, True)  # 0.3 >= 0.2
    assert judged["share"] == pytest.approx(0.01)
    stuck = {"rows": [{"step": 3, "val/em": 0.1}], "alarms": [{"step": 2, "action": "rolled_back"}]}
    assert health._judge({"world": 0, "arm": "x", "rows": rows, "rollback": stuck}, cfg)["recovered"] is False
    # stopped (by its last rollback) before the run's budget, step 3: not recovered, however good its last EM
    short = {"rows": [{"step": 2, "val/em": 0.4}], "alarms": [{"step": 2, "action": "rolled_back"}]}
    assert health._judge({"world": 0, "arm": "x", "rows": rows, "rollback": short}, cfg)["recovered"] is False
    never = {"rows": [{"step": 3, "val/em": 0.4}], "alarms": []}  # no rollback: counted in neither
    assert health._judge({"world": 0, "arm": "x", "rows": rows, "rollback": never}, cfg)["recovered"] is None


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


def test_a_bad_health_setting_is_refused_before_any_run(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        health.main(["--smoke", "--health", "entropy_lo=0.1"])
    assert refused.value.code == 2 and "--health entropy_lo=0.1" in capsys.readouterr().err


def test_aggregate_replays_finished_records_into_the_page_and_plots_beside_it(tmp_path: Path) -> None:
    rows = [{"step": s, "val/em": em, "sampling/flat_share": 0.5, "time/step_s": 1.0, "time/health_s": 0.001}
            for s, em in [(5, 0.4), (10, 0.1)]]  # fmt: skip
    runs = [{"world": 3, "arm": arm, "rows": rows, "alarms": [], "rollback": None} for arm in health.ARMS]
    record = tmp_path / "runs" / "world_3" / "health.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"seed": 3, "health": [], "runs": runs, "provenance": {"commit": "abc1234"}}))
    out = tmp_path / "pages" / "health.md"
    figures = health.main(["--seeds", "3", "--aggregate", "--run-dir", str(tmp_path / "runs"), "--out", str(out)])
    assert (figures["collapsed_runs"], figures["world_set"], figures["provenance"]["commit"]) == (
        3,
        "development",
        "abc1234",
    )
    page = out.read_text()
    assert "<!-- health-development -->" in page and "<!-- health-results -->" not in page  # not a reporting block
    assert "Worlds 3 (development), health settings replayed: the defaults. Measured at commit abc1234" in page
    assert "| 3 | lr_x10 | 0.400 / 0.100 | 10 | none | - |" in page and "![world_3](health/world_3.png)" in page
    assert (out.parent / "health" / "world_3.png").is_file()  # beside the page, not in docs/


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the quickstart's stages and every arm's runs: many minutes on a busy 2-core machine
def test_smoke_runs_every_arm_on_the_tiny_world_end_to_end(tmp_path: Path) -> None:
    out = health.main(["--smoke", "--run-dir", str(tmp_path)])
    assert out["smoke"] and out["world_set"] == "development"
    assert [r["arm"] for r in out["runs"]] == list(health.ARMS)
    for key in ("collapsed_runs", "detected_runs", "median_lead_steps", "false_alarm_runs",
                "rollback_recovered_runs", "monitor_share"):  # fmt: skip
        assert key in out
    assert 0 < out["monitor_share"] < 0.5
    page = (tmp_path / "health.md").read_text()  # the results block, with the world's plot
    assert all(f"| 0 | {arm} |" in page for arm in health.ARMS) and (tmp_path / "health" / "world_0.png").is_file()
    assert json.loads((tmp_path / "world_0" / "health.json").read_text())["provenance"]["commit"] in page
