"""`training.preempt` in a child process: a signal only asks; a second signal or the grace period stops at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from simsearch.training.preempt import STOP_STATUS, resume_command

CHILD = """
import sys, time
from simsearch.training.preempt import exit_stopped, stop_on_signals

grace, checks = float(sys.argv[1]), sys.argv[2] == "checks"
with stop_on_signals(grace, lambda: "the last good checkpoint is X", "simsearch test") as stop:
    print("ready", flush=True)
    for step in range(600):
        time.sleep(0.05)  # a step that ends every 50 ms, or never asks (checks=False)
        if checks and stop.agreed(1):
            exit_stopped(stop, f"after step {step + 1}", "simsearch test again")
print("finished", flush=True)
"""


def _signalled(grace: float, checks: bool, signals: int) -> tuple[int, str, float]:
    """(exit status, stderr, seconds from the first signal to the exit) of CHILD sent `signals` SIGTERMs."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(grace), "checks" if checks else "no"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    began = time.monotonic()
    for _ in range(signals):
        child.send_signal(signal.SIGTERM)
        time.sleep(0.01)
    _, stderr = child.communicate(timeout=60)
    return child.returncode, stderr, time.monotonic() - began


def test_the_first_signal_lets_the_step_finish_then_exits_with_143() -> None:
    status, stderr, _ = _signalled(grace=30.0, checks=True, signals=1)
    assert status == STOP_STATUS
    assert "SIGTERM received: finishing the step in flight" in stderr
    assert "simsearch test: stopped by SIGTERM after step 1 (" in stderr and "resume: simsearch test again" in stderr


def test_a_second_signal_stops_at_once() -> None:
    status, stderr, seconds = _signalled(grace=0.0, checks=False, signals=2)
    assert status == STOP_STATUS and seconds < 10
    assert "stopped at once by a second SIGTERM; the step in flight is lost; the last good checkpoint is X" in stderr


def test_the_grace_period_stops_a_step_that_does_not_end() -> None:
    status, stderr, seconds = _signalled(grace=0.5, checks=False, signals=1)
    assert status == STOP_STATUS and 0.5 <= seconds < 10
    assert "stopped at once by the 0.5 s grace period" in stderr


def test_the_resume_command_names_the_saved_recipe() -> None:
    from pathlib import Path

    assert resume_command("train", Path("runs/a"), resume_false=False, world=1) == "simsearch train runs/a/recipe.yaml"
    assert resume_command("train", Path("runs/a"), resume_false=True, world=2) == (
        "simsearch train runs/a/recipe.yaml resume=true (under the same launcher, 2 processes)"
    )
