"""`simsearch train` stopped by SIGTERM mid-run, then resumed: the same metrics, trajectories and weights
as a run never stopped (the stop writes its own checkpoint: `save_every=0`); GRPO with dynamic sampling, and PPO
(its critic and both optimizers). Also when the step in flight cannot finish in the grace period and is
abandoned at a turn boundary of its rollout, then replayed on resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from simsearch.training.checkpoint import latest_checkpoint, load_state
from simsearch.training.preempt import STOP_STATUS
from simsearch.training.runlog import read_metrics
from tests.commands.test_train import RESUME_SETTINGS, _overrides, _weights, world  # noqa: F401  (the fixture)

STEPS = 4
VARYING = ("time/", "perf/")  # wall-clock figures (and latencies): never equal between two runs


def _command(world: Path, run: Path, recipe: Path, **extra: object) -> list[str]:  # noqa: F811
    args = _overrides(world, run, **RESUME_SETTINGS, steps=STEPS, trajectory_every=1, **extra)
    return [sys.executable, "-m", "simsearch.cli", "train", str(recipe), *args]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _stop_after(command: list[str], run: Path, rows: int) -> tuple[int, str]:
    """Runs `command`, sends SIGTERM once `rows` steps are logged; (exit status, stderr)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env())
    deadline = time.monotonic() + 180
    while process.poll() is None and time.monotonic() < deadline:
        if (run / "metrics.jsonl").is_file() and len(read_metrics(run)) >= rows:
            break
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    return process.returncode, stderr


def _comparable(run: Path) -> list[dict]:
    return [
        {k: v for k, v in row.items() if not k.startswith(VARYING) and "latency" not in k} for row in read_metrics(run)
    ]


def _trajectories(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]


@pytest.mark.slow  # ~30 s: three tiny train runs in subprocesses
@pytest.mark.parametrize("estimator", ["grpo", "ppo"])  # PPO: the critic and its optimizer resume too
def test_sigterm_then_resume_replays_the_uninterrupted_run(world: Path, tmp_path: Path, estimator: str) -> None:  # noqa: F811
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("seed: 0\n")  # everything else comes as overrides
    extra = {"algorithm.estimator": estimator, "algorithm.dynamic_sampling": str(estimator == "grpo").lower()}
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    subprocess.run(_command(world, whole, recipe, **extra), check=True, capture_output=True, env=_env())

    status, stderr = _stop_after(_command(world, stopped, recipe, **extra), stopped, rows=1)
    assert status == STOP_STATUS, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if "stopped by SIGTERM" in line]
    assert len(lines) == 1 and f"resume: simsearch train {stopped / 'recipe.yaml'}" in lines[0], stderr[-3000:]
    stopped_at = load_state(latest_checkpoint(stopped))["step"]
    assert 1 <= stopped_at < STEPS and f"after step {stopped_at}/{STEPS}" in lines[0]
    assert [r["step"] for r in read_metrics(stopped)] == list(range(1, stopped_at + 1))  # no step lost

    resume = [sys.executable, "-m", "simsearch.cli", "train", str(stopped / "recipe.yaml")]  # the printed command
    subprocess.run(resume, check=True, capture_output=True, env=_env())
    for a, b in zip(_comparable(stopped), _comparable(whole)):
        assert a == b, {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    assert len(_comparable(stopped)) == len(_comparable(whole))
    assert _trajectories(stopped) == _trajectories(whole)
    final = f"checkpoints/step_{STEPS:07d}"
    mine, theirs = _weights(stopped / final / "model"), _weights(whole / final / "model")
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


# A train process whose step `target` (0-based) waits, in its rollout's first turn, for the SIGTERM the test
# sends once `marker` exists; no step fits in the grace period (the estimate forced), so the step is
# abandoned at the next turn boundary. Each turn draws from the global RNGs, as a sampler might.
ABANDONING = """
import random, sys, time
import torch
from simsearch import cli
from simsearch.policy import rollout, step as steps
from simsearch.training import preempt

target, marker, received = int(sys.argv[1]), sys.argv[2], []
handle, rollout_round, generate_turn = preempt.Stop.handle, steps.rollout_round, rollout._generate_turn
preempt.Stop.handle = lambda self, signum, frame=None: (handle(self, signum, frame), received.append(signum))
preempt.Stop.step_estimate_s = lambda self: float("inf")
current = []

def tracked(r, p_noise, step, examples, round_, should_stop=None):
    current.append(step)
    return rollout_round(r, p_noise, step, examples, round_, should_stop)

def waiting(*args):
    random.random(), torch.rand(1)
    if current[-1] == target and not received:
        open(marker, "w").close()
        deadline = time.monotonic() + 60
        while not received and time.monotonic() < deadline:
            time.sleep(0.01)
    return generate_turn(*args)

steps.rollout_round, rollout._generate_turn = tracked, waiting
sys.exit(cli.main(sys.argv[3:]))
"""


def _abandon_in(command: list[str], target: int, marker: Path) -> tuple[int, str]:
    """Runs `command` (its `train ...` part) in ABANDONING, SIGTERM in step `target`'s rollout; (status, stderr)."""
    child = [sys.executable, "-c", ABANDONING, str(target), str(marker), *command[3:]]
    process = subprocess.Popen(child, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env())
    deadline = time.monotonic() + 180
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    return process.returncode, stderr


@pytest.mark.slow  # ~30 s: three tiny train runs in subprocesses
@pytest.mark.parametrize(
    ("estimator", "save_every"),
    [("grpo", 0), ("ppo", 2)],  # save_every=0: the stop writes step 2; 2: step 2 is already saved, kept as is
)
def test_a_step_abandoned_at_a_turn_boundary_is_replayed_on_resume(
    world: Path,  # noqa: F811
    tmp_path: Path,
    estimator: str,
    save_every: int,
) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("seed: 0\n")
    extra = {"algorithm.estimator": estimator, "algorithm.dynamic_sampling": str(estimator == "grpo").lower()}
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    whole_command = _command(world, whole, recipe, save_every=2, **extra)  # keeps step 2's checkpoint
    subprocess.run([sys.executable, "-c", ABANDONING, "-1", "", *whole_command[3:]], check=True, env=_env(),
                   capture_output=True)  # fmt: skip

    target = 2  # the third step is abandoned: two finished before it
    command = _command(world, stopped, recipe, save_every=save_every, **extra)
    status, stderr = _abandon_in(command, target, tmp_path / "in_rollout")
    assert status == STOP_STATUS, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if "stopped by SIGTERM" in line]
    kept = stopped / f"checkpoints/step_{target:07d}"
    assert len(lines) == 1, stderr[-3000:]
    assert (
        f"in step {target + 1}/{STEPS}, which could not finish in the grace period: abandoned at a turn boundary"
        in lines[0]
    )
    assert "replayed on resume" in lines[0] and f"checkpoint {kept}" in lines[0]
    assert f"resume: simsearch train {stopped / 'recipe.yaml'}" in lines[0]
    assert latest_checkpoint(stopped) == kept and load_state(kept)["step"] == target  # no finished step lost
    assert [r["step"] for r in read_metrics(stopped)] == list(range(1, target + 1))
    # torch's RNG state saved is the one at the start of the abandoned step, not after its partial rollout
    # (Python's global one is not compared: something draws from it unseeded, so two runs' differ).
    mine_rng, whole_rng = load_state(kept)["rng"], load_state(whole / kept.relative_to(stopped))["rng"]
    assert torch.equal(mine_rng["torch"], whole_rng["torch"])

    subprocess.run([sys.executable, "-m", "simsearch.cli", "train", str(stopped / "recipe.yaml")], check=True,
                   capture_output=True, env=_env())  # fmt: skip
    assert _comparable(stopped) == _comparable(whole)
    assert _trajectories(stopped) == _trajectories(whole)
    final = f"checkpoints/step_{STEPS:07d}"
    mine, theirs = _weights(stopped / final / "model"), _weights(whole / final / "model")
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
