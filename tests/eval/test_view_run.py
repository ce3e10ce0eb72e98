"""The run panel of a train run's page (`simsearch view`): health signals over steps and the monitor's alarms.

The run directory is hand-written: `trajectories.jsonl` and `metrics.jsonl` through `RunLogger`
(as `simsearch train` writes them), `health.jsonl` from the monitor's own `Alarm.row()`. The
browser test needs Chromium and skips without it, like tests/commands/test_view.py's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from simsearch.errors import DataError
from simsearch.eval import view
from simsearch.training.health import Alarm, Reading
from simsearch.training.runlog import RunLogger
from tests.commands.test_view import _chromium, _visible_text, needs_chromium

METRICS = {
    1: {"reward/mean": 0.5, "health/entropy": 1.25, "health/search_share": 1.0, "rollout/answer_rate": 1.0,
        "losses/kl": 0.0, "optim/grad_norm": 2.0, "losses/policy": 0.3},
    2: {"reward/mean": 0.25, "health/entropy": float("nan"), "health/search_share": 0.5, "rollout/answer_rate": 0.75,
        "losses/kl": 0.01, "optim/grad_norm": 40.0, "losses/policy": 0.2},
    3: {"reward/mean": 0.0, "health/entropy": 0.125, "health/search_share": 0.0, "rollout/answer_rate": 0.5,
        "losses/kl": 0.02, "optim/grad_norm": 3.0},
}  # fmt: skip
SIGNALS = {
    "reward/mean": [[1, 0.5], [2, 0.25], [3, 0.0]],
    "health/entropy": [[1, 1.25], [3, 0.125]],  # step 2's NaN was logged as null: a gap
    "health/search_share": [[1, 1.0], [2, 0.5], [3, 0.0]],
    "rollout/answer_rate": [[1, 1.0], [2, 0.75], [3, 0.5]],
    "losses/kl": [[1, 0.0], [2, 0.01], [3, 0.02]],
    "optim/grad_norm": [[1, 2.0], [2, 40.0], [3, 3.0]],
}
ALARMS = [
    {**Alarm(2, "grad_norm_spike", Reading("optim/grad_norm", 40.0, 20.0, ">", "10 x running median 2")).row(),
     "action": "rollback"},
    {**Alarm(3, "search_stopped", Reading("health/search_share", 0.05, 0.1, "<", "search_floor, baseline 1")).row(),
     "action": "rollback"},
    {"step": 3, "action": "rolled_back", "to_step": 0, "lr_scale": 0.5, "line": "health: rolled back to step 0"},
]  # fmt: skip


def _train_run(run: Path, metrics: bool = True) -> Path:
    """A train run of 3 steps: one sampled rollout at step 1, METRICS, and ALARMS in health.jsonl."""
    logger = RunLogger(run)
    row = {"id": "q1", "question": "Where is X?", "golden_answers": ["Paris"], "group": 0, "sample": 0,
           "reward": 1.0, "answer": "Paris", "num_searches": 0, "finish": "answer",
           "scores": {"substring_em": 1.0}, "turns": []}  # fmt: skip
    logger.log_trajectories(1, [row])
    if metrics:
        for step, values in METRICS.items():
            logger.log(step, values)
    logger.close()
    if not metrics:
        (run / "metrics.jsonl").unlink()
    (run / "health.jsonl").write_text("".join(json.dumps(a) + "\n" for a in ALARMS))
    return run


def test_run_panel_holds_signals_and_alarms(tmp_path):
    data = view.page_data(_train_run(tmp_path))
    assert data["kind"] == "train" and data["run"]["signals"] == SIGNALS
    # The panel's order; keys no row holds (health/ratio_mean, ...) and others (losses/policy) left out.
    assert list(data["run"]["signals"]) == [
        "reward/mean", "health/entropy", "health/search_share", "rollout/answer_rate", "losses/kl", "optim/grad_norm",
    ]  # fmt: skip
    assert data["run"]["alarms"] == ALARMS
    assert data["run"]["alarms"][0]["signal"] == "optim/grad_norm" and data["run"]["alarms"][0]["threshold"] == 20.0
    (tmp_path / "health.jsonl").unlink()  # a run the monitor never alarmed
    assert view.page_data(tmp_path)["run"] == {"signals": SIGNALS, "alarms": []}


def test_no_metrics_no_panel(tmp_path):
    data = view.page_data(_train_run(tmp_path, metrics=False))
    assert data["kind"] == "train" and len(data["items"]) == 1 and "run" not in data


@pytest.mark.parametrize("bad", ['{"step": 3, "rule"', "[3]"])
def test_malformed_health_line_is_a_data_error(tmp_path, bad):
    run = _train_run(tmp_path)
    lines = [json.dumps(ALARMS[0]), bad, json.dumps(ALARMS[1])]
    (run / "health.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"health\.jsonl: line 2 is not a JSON object"):
        view.page_data(run)
    (run / "metrics.jsonl").write_text('{"step": 1}\n' + bad + "\n")
    with pytest.raises(DataError, match=r"metrics\.jsonl: line 2 is not a JSON object"):
        view.run_panel_data(run)


def test_a_line_still_being_written_is_left_out(tmp_path):
    run = _train_run(tmp_path)
    (run / "health.jsonl").write_text(json.dumps(ALARMS[0]) + '\n{"step": 3, "ru')  # no newline yet
    assert view.page_data(run)["run"]["alarms"] == ALARMS[:1]


# --------------------------------------------------------------------------- in a browser


def _figures(dom: str) -> dict[str, str]:
    return dict(re.findall(r'<figure class="chart" data-signal="([^"]+)">(.*?)</figure>', dom, flags=re.S))


@needs_chromium
def test_panel_in_chromium_draws_a_chart_per_signal_and_the_alarms(tmp_path):
    run = _train_run(tmp_path / "run")
    odd = {**ALARMS[0], "step": 3, "rule": "<b>odd</b>", "signal": "health/entropy"}  # text, never markup
    with (run / "health.jsonl").open("a") as handle:
        handle.write(json.dumps(odd) + "\n")
    dom = _chromium("--dump-dom", view.write_page(run).as_uri())
    figures = _figures(dom)
    assert list(figures) == list(SIGNALS)
    assert all(body.count("<svg") == 1 for body in figures.values())
    # Steps 1..3 across x 40..242, values max..min across y 6..88.
    assert 'points="40,6 141,47 242,88"' in figures["reward/mean"]
    assert 'class="alarm" data-rule="grad_norm_spike"' in figures["optim/grad_norm"]
    assert 'x1="141"' in figures["optim/grad_norm"] and ">2 grad_norm_spike</text>" in figures["optim/grad_norm"]
    assert ">3 search_stopped</text>" in figures["health/search_share"]
    assert 'class="alarm"' not in figures["reward/mean"] + figures["losses/kl"]
    assert "3 &lt;b&gt;odd&lt;/b&gt;</text>" in figures["health/entropy"] and "<b>" not in dom
    rows = re.findall(r'<tr class="alarm-row"[^>]*>(.*?)</tr>', dom, flags=re.S)
    cells = [re.findall(r"<td>(.*?)</td>", row) for row in rows]
    assert cells == [
        ["2", "grad_norm_spike", "optim/grad_norm", "40", "&gt; 20", "rollback"],
        ["3", "search_stopped", "health/search_share", "0.05", "&lt; 0.1", "rollback"],
        ["3", "", "", "", "", "rolled back to step 0, lr x0.5"],
        ["3", "&lt;b&gt;odd&lt;/b&gt;", "health/entropy", "40", "&gt; 20", "rollback"],
    ]
    text = _visible_text(dom)
    assert "Training health: 6 signals, 3 alarms" in text and "1 of 1 questions" in text  # the rest still works


@needs_chromium
def test_page_without_metrics_has_no_panel_in_chromium(tmp_path):
    dom = _chromium("--dump-dom", view.write_page(_train_run(tmp_path / "run", metrics=False)).as_uri())
    assert re.search(r'<section id="run" hidden=""', dom) and "<figure" not in dom and "<svg" not in dom
    assert "1 of 1 questions" in _visible_text(dom)
