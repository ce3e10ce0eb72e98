"""`training.preempt` in a child process: a signal only asks; a second signal or the grace period stops at once.
And when a step in flight is abandoned at a turn boundary (`Stop.abandon_at_turn`, `rollout.RolloutStopped`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from simsearch.policy.rollout import RolloutStopped, generate_trajectories
from simsearch.training.preempt import FIRST_STEP_SHARE, REPEAT_WINDOW_S, STOP_STATUS, Stop, resume_command
from simsearch.types import SamplingParams
from tests.policy.test_rollout import (  # noqa: F401  (tokenizer: the fixture)
    ANSWER_TURN,
    EXAMPLES,
    SEARCH_TURN,
    RecordingSearch,
    ScriptedPolicy,
    by_turn,
    make_settings,
    tokenizer,
)

CHILD = """
import sys, time
from simsearch.training.preempt import exit_stopped, stop_on_signals

grace, checks, step_s = float(sys.argv[1]), sys.argv[2] == "checks", float(sys.argv[3])
with stop_on_signals(grace, lambda: "the last good checkpoint is X", "simsearch test") as stop:
    print("ready", flush=True)
    for step in range(600):
        time.sleep(step_s)  # a step that ends every step_s seconds, or never asks (checks=False)
        if checks and stop.agreed(1):
            exit_stopped(stop, f"after step {step + 1}", "simsearch test again")
print("finished", flush=True)
"""


def _signalled(grace: float, checks: bool, signals: int, gap: float = 0.01, step_s: float = 0.05,
               env: dict[str, str] | None = None) -> tuple[int, str, float]:  # fmt: skip
    """(exit status, stderr, seconds from the first signal to the exit) of CHILD sent `signals` SIGTERMs, `gap` s
    apart, its steps `step_s` long."""
    environment = {key: value for key, value in os.environ.items() if key != "TORCHELASTIC_RUN_ID"}
    environment.update({"OMP_NUM_THREADS": "1", **(env or {})})
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(grace), "checks" if checks else "no", str(step_s)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)  # fmt: skip
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    began = time.monotonic()
    for _ in range(signals):
        child.send_signal(signal.SIGTERM)
        time.sleep(gap)
    _, stderr = child.communicate(timeout=60)
    return child.returncode, stderr, time.monotonic() - began


def test_the_first_signal_lets_the_step_finish_then_exits_with_143() -> None:
    status, stderr, _ = _signalled(grace=30.0, checks=True, signals=1)
    assert status == STOP_STATUS
    assert "SIGTERM received: finishing the step in flight" in stderr
    assert "simsearch test: stopped by SIGTERM after step 1 (" in stderr and "resume: simsearch test again" in stderr


def test_a_second_signal_stops_at_once() -> None:
    status, stderr, seconds = _signalled(grace=0.0, checks=False, signals=2, gap=REPEAT_WINDOW_S + 0.3)
    assert status == STOP_STATUS and seconds < 10
    assert "stopped at once by a second SIGTERM; the step in flight is lost; the last good checkpoint is X" in stderr


def test_the_same_signal_delivered_twice_at_once_is_one_request() -> None:
    # Slurm signals every process of a job step, and a launcher forwards the same SIGTERM: milliseconds apart.
    status, stderr, _ = _signalled(grace=30.0, checks=True, signals=2)
    assert status == STOP_STATUS and "the same request delivered twice" in stderr
    assert "stopped at once" not in stderr and "simsearch test: stopped by SIGTERM after step" in stderr


def test_under_torchrun_a_repeated_sigterm_is_always_the_same_request() -> None:
    status, stderr, _ = _signalled(grace=30.0, checks=True, signals=2, gap=REPEAT_WINDOW_S + 0.3,
                                   step_s=REPEAT_WINDOW_S + 1.0, env={"TORCHELASTIC_RUN_ID": "test"})  # fmt: skip
    assert status == STOP_STATUS and "stopped at once" not in stderr
    assert "simsearch test: stopped by SIGTERM after step" in stderr


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


def _signalled_stop(grace_s: float, seconds_ago: float, step_s: float | None) -> Stop:
    stop = Stop(grace_s, lambda: "", "simsearch test")
    stop.signal_name, stop.received_at, stop.step_s = "SIGTERM", time.monotonic() - seconds_ago, step_s
    return stop


def test_a_step_is_abandoned_when_the_rest_of_the_grace_period_is_shorter_than_a_step() -> None:
    # 10 s of grace, the signal 7 s ago: 3 s left. A step of 5 s cannot finish; one of 2 s can.
    assert _signalled_stop(10.0, 7.0, step_s=5.0).abandon_at_turn()
    assert not _signalled_stop(10.0, 7.0, step_s=2.0).abandon_at_turn()
    # No step finished yet: a step is taken as FIRST_STEP_SHARE (half) of the grace, 5 s > 3 s left.
    assert FIRST_STEP_SHARE == 0.5 and _signalled_stop(10.0, 7.0, step_s=None).abandon_at_turn()
    assert not _signalled_stop(10.0, 4.0, step_s=None).abandon_at_turn()  # 6 s left > 5 s
    # Never without a signal, nor without a grace period (0: the step always finishes).
    assert not Stop(10.0, lambda: "", "simsearch test").abandon_at_turn()
    assert not _signalled_stop(0.0, 100.0, step_s=5.0).abandon_at_turn()


def _rollout(tokenizer, should_stop):  # noqa: F811
    """(result, policy, search) of one question that searches, then answers (two turns)."""
    policy, search = ScriptedPolicy(tokenizer, by_turn(SEARCH_TURN, ANSWER_TURN)), RecordingSearch()
    result = generate_trajectories(
        EXAMPLES[:1], policy=policy, tokenizer=tokenizer, search=search, settings=make_settings(top_k=1),
        sampling=SamplingParams(temperature=0.0, max_new_tokens=200), should_stop=should_stop,
    )  # fmt: skip
    return result, policy, search


def test_the_rollout_stops_at_the_first_turn_boundary_should_stop_says(tokenizer) -> None:  # noqa: F811
    policy, search = ScriptedPolicy(tokenizer, by_turn(SEARCH_TURN, ANSWER_TURN)), RecordingSearch()
    asked: list[int] = []

    def after_the_first_turn() -> bool:
        asked.append(len(policy.calls))  # generate calls made so far
        return len(asked) > 1

    with pytest.raises(RolloutStopped) as stopped:
        generate_trajectories(
            EXAMPLES[:1], policy=policy, tokenizer=tokenizer, search=search, settings=make_settings(top_k=1),
            sampling=SamplingParams(temperature=0.0, max_new_tokens=200), should_stop=after_the_first_turn,
        )  # fmt: skip
    # Asked before turn 0 (no call yet) and before turn 1: turn 0 ran, its search answered; turn 1 never started.
    assert stopped.value.turn == 1 and asked == [0, 1]
    assert (len(policy.calls), len(search.calls)) == (1, 1)


def test_a_rollout_never_told_to_stop_is_the_same_as_one_not_asked(tokenizer) -> None:  # noqa: F811
    asked, _, _ = _rollout(tokenizer, lambda: False)
    plain, _, _ = _rollout(tokenizer, None)
    assert asked.trajectories == plain.trajectories and asked.metrics == plain.metrics
