"""benchmarks/quickstart.py: the figures it reports from the runs' report.json (no run here)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import quickstart


def _report(base: float, rl: float, wall_s: float, rss: float) -> dict[str, Any]:
    em = {
        "base": {"simulator": 1.0, "bm25": base, "dense": base, "none": 0.0},
        "rl_search": {"simulator": 2.0, "bm25": rl, "dense": rl - 5, "none": 0.0},
        "rl_nosearch": {"none": 3.0},
    }
    return {"em": em, "wall_s": wall_s, "peak_rss_gb": rss, "stage_s": {"world": 30.0, "train": wall_s - 30},
            "base_reading": {}, "query_naming": {}, "machine": {}}  # fmt: skip


def test_the_first_seeds_run_gives_wall_time_memory_and_stage_times_and_the_targets_judge_the_slowest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    reports = {7: _report(10.0, 70.0, 300.0, 1.5), 8: _report(20.0, 50.0, 500.0, 1.0)}
    figures = quickstart.summary([7, 8], reports, None, None)
    assert (figures["wall_s"], figures["peak_rss_gb"]) == (300.0, 1.5)
    assert figures["stage_s"] == {"world": 30.0, "train": 270.0}
    assert (figures["wall_s_max"], figures["peak_rss_gb_max"]) == (500.0, 1.5)
    assert figures["gain_bm25_by_seed"] == [60.0, 30.0] and figures["over_nosearch_bm25_min"] == 47.0
    quickstart.print_targets(figures, None)
    rows = {line.split(" | ")[0].strip("| "): line for line in capsys.readouterr().out.splitlines() if "|" in line}
    assert rows["wall_s_max (idle)"].endswith("| 500 | <= 480 | NO |")
    assert rows["peak_rss_gb_max"].endswith("| 1.5 | <= 2 | yes |")
    assert rows["rerun_max_abs_diff"].endswith("| None | <= 1.0 | not run |")  # --no-rerun: not judged
