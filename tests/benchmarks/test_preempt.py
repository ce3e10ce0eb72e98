"""benchmarks/preempt.py --tiny: two runs stopped by SIGTERM, each resumed into the uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import preempt


@pytest.mark.slow  # ~30 s: five tiny train runs in subprocesses
def test_tiny_mode_resumes_every_stopped_run_identically(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    figures = preempt.main(["--tiny", "--out", str(tmp_path)])
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == figures
    assert figures["runs"] == 2 and figures["resumed_identical"] == 2 and figures["lost_steps"] == 0
    assert 0 < figures["max_stop_s"] <= figures["grace_s"]
    assert figures["command"] == "python -m benchmarks.preempt --tiny"
