"""`simsearch train` on CPU DeepSpeed when rows without signal skip the update (1 and 2 processes).

GRPO without KL loss or entropy bonus skips the forward/backward of rows whose advantages are all
zero (groups of 2 whose answers score alike). DeepSpeed must still take one optimizer step per
minibatch, and the weights must be those of the same update run on every row: skipped rows have
gradient 0. Each launch trains one step twice, once skipping and once with `rows_with_signal`
forced to keep every row, and counts DeepSpeed's optimizer steps in each.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.commands import test_train
from tests.commands.test_train import _overrides, _weights

# The module-scoped fixture of test_train.py: QA files, a corpus, a tiny policy that searches.
world = test_train.world

LAUNCHER = """
import json, sys
import deepspeed
import torch

deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # gloo does the collectives
from deepspeed.runtime.engine import DeepSpeedEngine

import simsearch.commands.train as train
import simsearch.policy.update as update_module
from simsearch.config import TrainRecipe, load_recipe

steps = []
take_step = DeepSpeedEngine._take_model_step


def counted(self, *args, **kwargs):
    steps.append(1)
    return take_step(self, *args, **kwargs)


DeepSpeedEngine._take_model_step = counted
out_file, overrides = sys.argv[1], sys.argv[2:]
results = {}
for name in ("skip", "every_row"):
    if name == "every_row":
        update_module.rows_with_signal = lambda advantages: torch.ones(advantages.shape[0], dtype=torch.bool)
    steps.clear()
    metrics = train.main(load_recipe(TrainRecipe, None, overrides + [f"run_dir={out_file}.{name}"]))
    results[name] = {"steps": len(steps), "skipped": metrics["perf/skipped_row_share"]}
rank = torch.distributed.get_rank()
with open(f"{out_file}.rank{rank}.json", "w") as f:
    json.dump(results, f)
# Left alive at exit, gloo's threads can abort the process ("terminate called without an active exception").
torch.distributed.barrier()
torch.distributed.destroy_process_group()
"""

# 8 questions x 2 rollouts; 2 minibatches x 2 epochs = 4 optimizer steps; micro-batches of 2 rows.
SETTINGS = {
    "steps": 1, "prompts_per_step": 8, "rollout.group_size": 2, "micro_batch_size": 2,
    "algorithm.minibatch_size": 8, "algorithm.ppo_epochs": 2, "algorithm.kl_coef": 0,
    "algorithm.estimator": "grpo", "optim.lr": 1e-2,
}  # fmt: skip
OPTIMIZER_STEPS = 4


@pytest.mark.slow  # ~30-90 s a launch: each process imports DeepSpeed and trains twice
@pytest.mark.parametrize(("processes", "stage"), [(1, 2), (2, 3)])
def test_skipped_rows_neither_move_nor_drop_deepspeed_steps(
    world: Path, tmp_path: Path, processes: int, stage: int
) -> None:
    out = tmp_path / "run"
    args = _overrides(world, out, **SETTINGS, **{"deepspeed.stage": stage})
    args = [a for a in args if not a.startswith("run_dir=")]
    (tmp_path / "launch.py").write_text(LAUNCHER)
    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_addr",
         "127.0.0.1", "--master_port", port, str(tmp_path / "launch.py"), str(out), *args],
        capture_output=True, text=True, timeout=480, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]

    for rank in range(processes):
        results = json.loads(Path(f"{out}.rank{rank}.json").read_text())
        assert results["skip"]["steps"] == OPTIMIZER_STEPS
        assert results["every_row"]["steps"] == OPTIMIZER_STEPS
        assert results["skip"]["skipped"] > 0, "no row was skipped: the test proves nothing"
        assert results["every_row"]["skipped"] == 0
    start = _weights(world / "policy")
    skipped = _weights(Path(f"{out}.skip") / "checkpoints" / "step_0000001" / "model")
    every_row = _weights(Path(f"{out}.every_row") / "checkpoints" / "step_0000001" / "model")
    gap = sum(float((skipped[k] - every_row[k]).norm() ** 2) for k in start) ** 0.5
    moved = sum(float((every_row[k] - start[k]).norm() ** 2) for k in start) ** 0.5
    assert moved > 0
    assert gap < 1e-3 * moved  # the same Adam steps, up to float round-off
