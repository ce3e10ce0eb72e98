"""Stopping a run at a step boundary on SIGTERM or SIGINT (preemption on Slurm and Kubernetes).

The first signal only sets a flag. The command finishes the step (or eval chunk) in flight,
writes its checkpoint, prints one line naming it and the command that resumes, and exits with
`STOP_STATUS`. Under DeepSpeed the processes agree on the step each step (`Stop.agreed`: the
maximum of their flags), so all of them stop after the same one.

A step that cannot finish in the grace period is abandoned instead (`Stop.abandon_at_turn`, asked
by `train`'s rollout at each turn boundary, single-process runs only): the command then saves the
last finished step and exits, and a resume replays the abandoned one from its start.

A second signal (not a repeat of the first: `_same_request`) or the grace period running out
(a timer thread: it fires inside a long forward pass too) stops the process at once with
`os._exit`, writing nothing, so the last finished checkpoint stays the last good one.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from simsearch.training.checkpoint import latest_checkpoint
from simsearch.training.distributed import all_reduce_max

FIRST_STEP_SHARE = 0.5
"""Before any step finished in this process, a step is taken to need this share of the grace period."""

STOP_STATUS = 143
"""Exit status of a run stopped by a signal: 128 + SIGTERM, what Slurm and Kubernetes expect."""

SIGNALS = (signal.SIGTERM, signal.SIGINT)

REPEAT_WINDOW_S = 1.0
"""A repeat of the first signal within this many seconds is the same request delivered twice (Slurm
signals every process of a job step, and a launcher may forward the same signal to its workers)."""


class Stop:
    """What the signal handlers record; the command's loop asks it at each step boundary.

    Attributes:
        grace_s: Seconds from the first signal until the process stops at once (0 = no limit).
        last_good: Says, at any moment, where the last good checkpoint or result is (for the
            line printed on an immediate stop).
        prog: The command's name as its lines start ("simsearch train").
        signal_name: The first signal received ("SIGTERM"), or None.
        received_at: `time.monotonic()` when it came.
        step_s: Seconds the last finished step took (the loop sets it), or None before the first.
    """

    def __init__(self, grace_s: float, last_good: Callable[[], str], prog: str) -> None:
        self.grace_s = grace_s
        self.last_good = last_good
        self.prog = prog
        self.signal_name: str | None = None
        self.received_at = 0.0
        self.step_s: float | None = None
        self._timer: threading.Timer | None = None

    @property
    def requested(self) -> bool:
        """A signal came to this process."""
        return self.signal_name is not None

    def agreed(self, world: int) -> bool:
        """Whether any process was signalled; every process must call it at the same point of each step."""
        flag = torch.tensor([1.0 if self.requested else 0.0])
        agreed = bool(all_reduce_max(flag, world).item() > 0)
        if agreed and not self.requested:  # another process was signalled: stop with it
            self.signal_name, self.received_at = "a signal to another process", time.monotonic()
        return agreed

    def abandon_at_turn(self) -> bool:
        """At a turn boundary: whether to abandon the step in flight rather than finish it.

        True once a signal came and the rest of the grace period is shorter than a step
        (`step_estimate_s`); never without a signal or a grace period.
        """
        if not self.requested or self.grace_s <= 0:
            return False
        return self.grace_s - self.seconds() < self.step_estimate_s()

    def step_estimate_s(self) -> float:
        """What a step takes: the last finished one, or `FIRST_STEP_SHARE` of the grace period before one."""
        return self.step_s if self.step_s is not None else FIRST_STEP_SHARE * self.grace_s

    def handle(self, signum: int, frame: FrameType | None = None) -> None:
        """The handler of both signals: the first asks for a stop, the second stops at once."""
        name = signal.Signals(signum).name
        if self.requested and self._same_request(name):
            print(f"{self.prog}: {name} again, the same request delivered twice: still finishing the step in flight",
                  file=sys.stderr, flush=True)  # fmt: skip
            return
        if self.requested:
            self.stop_now(f"a second {name}")
        self.signal_name, self.received_at = name, time.monotonic()
        print(f"{self.prog}: {name} received: finishing the step in flight, then a checkpoint and exit "
              f"(at once on a second signal{self._grace_note()})", file=sys.stderr, flush=True)  # fmt: skip
        if self.grace_s > 0:
            self._timer = threading.Timer(self.grace_s, self.stop_now, args=(f"the {self.grace_s:g} s grace period",))
            self._timer.daemon = True
            self._timer.start()

    def _same_request(self, name: str) -> bool:
        """A repeat of the first signal soon after it, or any repeated SIGTERM under torchrun (which forwards
        the SIGTERM it gets to workers that Slurm has already signalled)."""
        if name != self.signal_name:
            return False
        torchrun = name == "SIGTERM" and "TORCHELASTIC_RUN_ID" in os.environ
        return torchrun or time.monotonic() - self.received_at < REPEAT_WINDOW_S

    def stop_now(self, why: str) -> None:
        """Exits with `STOP_STATUS` without writing anything; the line names the last good checkpoint."""
        print(f"{self.prog}: stopped at once by {why}; the step in flight is lost; {self.last_good()}",
              file=sys.stderr, flush=True)  # fmt: skip
        os._exit(STOP_STATUS)

    def cancel(self) -> None:
        """Stops the grace timer (the stop is done, or the handlers are removed)."""
        if self._timer is not None:
            self._timer.cancel()

    def seconds(self) -> float:
        """Seconds since the first signal."""
        return time.monotonic() - self.received_at if self.requested else 0.0

    def _grace_note(self) -> str:
        return f" or after {self.grace_s:g} s" if self.grace_s > 0 else ""


@contextmanager
def stop_on_signals(grace_s: float, last_good: Callable[[], str], prog: str) -> Iterator[Stop]:
    """SIGTERM and SIGINT handled by a `Stop` for the duration; the previous handlers put back after.

    Outside the main thread (where Python cannot install handlers) the `Stop` never fires.
    """
    stop = Stop(grace_s, last_good, prog)
    installed: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        installed = {sig: signal.signal(sig, stop.handle) for sig in SIGNALS}
    try:
        yield stop
    finally:
        stop.cancel()
        for sig, previous in installed.items():
            signal.signal(sig, previous)


def last_checkpoint_line(run_dir: Path) -> str:
    """'the last good checkpoint is DIR' or 'no checkpoint was written yet'."""
    kept = latest_checkpoint(run_dir)
    return f"the last good checkpoint is {kept}" if kept is not None else "no checkpoint was written yet"


def resume_command(command: str, run_dir: Path, *, resume_false: bool, world: int) -> str:
    """The command that resumes a run from its directory: its saved recipe (and `resume=true` if it was false)."""
    line = f"simsearch {command} {run_dir / 'recipe.yaml'}" + (" resume=true" if resume_false else "")
    return line + (f" (under the same launcher, {world} processes)" if world > 1 else "")


def exit_stopped(stop: Stop, what: str, resume: str, *, rank: int = 0) -> None:
    """Prints the stop line on process 0 ('stopped by SIGTERM after ...; resume: ...'); exits with `STOP_STATUS`."""
    stop.cancel()
    if rank == 0:
        print(f"{stop.prog}: stopped by {stop.signal_name} {what} ({stop.seconds():.1f} s after it); "
              f"resume: {resume}", file=sys.stderr, flush=True)  # fmt: skip
    raise SystemExit(STOP_STATUS)
