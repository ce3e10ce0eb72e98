"""`simsearch train` in two DeepSpeed ZeRO-3 CPU processes, one of them sent SIGTERM mid-run, then resumed: the
same metrics, trajectories and weights as a two-process run never stopped (GRPO with dynamic sampling).

The processes are started as `srun` starts a job's tasks, one per rank with RANK, WORLD_SIZE and the rendezvous in
the environment, so each one's exit status and stderr can be checked. Only rank 1 is signalled: rank 0, which holds
the run log and prints the resume line, learns of the stop through `Stop.agreed` alone, the hardest case for the
agreement (a node preempted alone; when Slurm signals every task, each process has its own flag as well).
The second test launches under torchrun and signals its workers, then torchrun (which forwards SIGTERM to them), as
Slurm signals every process of a `srun torchrun` step: each worker gets SIGTERM twice, one request.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from simsearch.training.checkpoint import latest_checkpoint, load_state
from simsearch.training.preempt import STOP_STATUS
from simsearch.training.runlog import read_metrics
from tests.commands.test_train import LAUNCHER, _weights, world  # noqa: F401  (the fixture)
from tests.commands.test_train_preempt import STEPS, _command, _comparable, _env, _trajectories

PROCESSES = 2
EXTRA = {"deepspeed.stage": 3, "algorithm.estimator": "grpo", "algorithm.dynamic_sampling": "true"}


def _launch(tmp_path: Path, args: list[str], name: str) -> list[subprocess.Popen]:
    """The ranks of `simsearch ARGS` (through LAUNCHER: gloo, no shm allreduce); stderr to NAME.rankR.err."""
    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER)
    ranks = []
    for rank in range(PROCESSES):
        env = {**_env(), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(PROCESSES),
               "LOCAL_WORLD_SIZE": str(PROCESSES), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}  # fmt: skip
        with open(tmp_path / f"{name}.rank{rank}.err", "w") as err:
            command = [sys.executable, str(launcher), *args]
            ranks.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env=env))
    return ranks


def _finish(ranks: list[subprocess.Popen]) -> list[int]:
    """The ranks' exit statuses; a rank still running after 240 s (its peer gone, it waits on gloo) is killed."""
    try:
        return [process.wait(timeout=240) for process in ranks]
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()


def _stderr(tmp_path: Path, name: str) -> list[str]:
    return [(tmp_path / f"{name}.rank{rank}.err").read_text() for rank in range(PROCESSES)]


@pytest.mark.slow  # ~100 s on 2 cores: three launches of two processes, each importing DeepSpeed
@pytest.mark.timeout(900)
def test_sigterm_to_one_rank_then_resume_replays_the_uninterrupted_run(world: Path, tmp_path: Path) -> None:  # noqa: F811
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("seed: 0\n")  # everything else comes as overrides
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    args = _command(world, whole, recipe, **EXTRA)[3:]  # after `python -m simsearch.cli`
    assert _finish(_launch(tmp_path, args, "whole")) == [0] * PROCESSES, _stderr(tmp_path, "whole")

    ranks = _launch(tmp_path, _command(world, stopped, recipe, **EXTRA)[3:], "stopped")
    deadline = time.monotonic() + 240
    while not (stopped / "metrics.jsonl").is_file() or not read_metrics(stopped):  # step 1 logged (by rank 0)
        assert all(p.poll() is None for p in ranks) and time.monotonic() < deadline, _stderr(tmp_path, "stopped")
        time.sleep(0.02)
    ranks[1].send_signal(signal.SIGTERM)
    statuses, stderr = _finish(ranks), _stderr(tmp_path, "stopped")
    assert statuses == [STOP_STATUS] * PROCESSES, [text[-3000:] for text in stderr]
    assert "SIGTERM received" in stderr[1] and "SIGTERM received" not in stderr[0]
    lines = [[line for line in text.splitlines() if "stopped by" in line] for text in stderr]
    assert len(lines[0]) == 1 and not lines[1], stderr  # the resume line once, from rank 0
    assert f"resume: simsearch train {stopped / 'recipe.yaml'}" in lines[0][0]
    assert f"(under the same launcher, {PROCESSES} processes)" in lines[0][0]
    stopped_at = load_state(latest_checkpoint(stopped))["step"]
    assert 1 <= stopped_at < STEPS and f"after step {stopped_at}/{STEPS}" in lines[0][0]
    assert [r["step"] for r in read_metrics(stopped)] == list(range(1, stopped_at + 1))  # no step lost

    resumed = _launch(tmp_path, ["train", str(stopped / "recipe.yaml")], "resumed")  # the printed recipe
    assert _finish(resumed) == [0] * PROCESSES, _stderr(tmp_path, "resumed")
    for a, b in zip(_comparable(stopped), _comparable(whole)):
        assert a == b, {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    assert len(_comparable(stopped)) == len(_comparable(whole)) == STEPS
    assert _trajectories(stopped) == _trajectories(whole)
    final = f"checkpoints/step_{STEPS:07d}"
    mine, theirs = _weights(stopped / final / "model"), _weights(whole / final / "model")
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.slow  # ~30 s: one launch under torchrun
@pytest.mark.timeout(600)
def test_sigterm_to_torchrun_and_its_workers_as_slurm_sends_it_stops_after_a_step(world: Path, tmp_path: Path) -> None:  # noqa: F811
    recipe, run = tmp_path / "recipe.yaml", tmp_path / "run"
    recipe.write_text("seed: 0\n")
    (tmp_path / "launch.py").write_text(LAUNCHER)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    args = _command(world, run, recipe, **EXTRA)[3:]
    with open(tmp_path / "err", "w") as err:
        torchrun = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(PROCESSES), "--master_addr",
             "127.0.0.1", "--master_port", port, str(tmp_path / "launch.py"), *args],
            stdout=subprocess.DEVNULL, stderr=err, env=_env(),
        )  # fmt: skip
    try:
        while not (run / "metrics.jsonl").is_file() or not read_metrics(run):
            assert torchrun.poll() is None, (tmp_path / "err").read_text()[-3000:]
            time.sleep(0.02)
        workers = subprocess.run(["pgrep", "-P", str(torchrun.pid)], capture_output=True, text=True).stdout.split()
        for pid in map(int, workers):  # Slurm (proctrack/cgroup) signals every process of the step; the order of
            os.kill(pid, signal.SIGTERM)  # arrival varies: here the workers' first, so the race cannot hide the bug
        while (tmp_path / "err").read_text().count("SIGTERM received") < PROCESSES and torchrun.poll() is None:
            time.sleep(0.02)
        torchrun.send_signal(signal.SIGTERM)  # torchrun forwards it to its workers
        torchrun.wait(timeout=240)
    finally:
        if torchrun.poll() is None:
            torchrun.kill()
    stderr = (tmp_path / "err").read_text()
    assert "stopped at once" not in stderr, stderr[-3000:]
    assert latest_checkpoint(run) is not None and "resume: simsearch train" in stderr
