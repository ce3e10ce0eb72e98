"""benchmarks/server_load.py: its 5xx count by hand, and a tiny run with the curriculum arm end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_only_5xx_answers_count_as_server_errors() -> None:
    from benchmarks import server_load

    load = server_load.Load()
    for kind in ("HTTP 503", "HTTP 500", "HTTP 422", "TimeoutError", "HTTP 503"):
        load.error(kind)
    assert (server_load.server_errors(load), load.errors) == (3, 5)


@pytest.mark.slow  # ~30 s: three server processes build BM25 over 1,000 passages and take load
def test_a_tiny_run_measures_both_arms_side_by_side() -> None:
    command = [sys.executable, "-m", "benchmarks.server_load", "--clients", "4", "--duration", "1",
               "--passages", "1000", "--direct-queries", "0", "--arm-rounds", "2", "--arm-duration", "1"]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300, cwd=ROOT).stdout
    figures = json.loads(out.splitlines()[-1])
    assert figures["errors"] == 0 and figures["arm_5xx"] == {"plain": 0, "curriculum": 0}
    assert [len(v) for v in figures["arm_p99_passes_ms"].values()] == [2, 2]
    assert figures["arm_p99_ratio"] > 0 and figures["arm_cpu_ms_per_request"]["curriculum"] > 0
    # The curriculum server moved by the searches it served (200 steps over 200,000 searches): its
    # last one-query request found searches - 1 served, so step (searches - 1) * 200 // 200,000.
    place = figures["arm_curriculum_at"]
    assert place["source"] == "searches" and place["step"] == (place["searches"] - 1) // 1000
    assert "| 5xx plain / with the curriculum | 0 / 0 |" in out
