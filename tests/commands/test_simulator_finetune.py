"""`simsearch simulator finetune` on a tiny model: the loss falls, checkpoints resume exactly,
LoRA merges, and DeepSpeed ZeRO-3 trains in two CPU processes."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from simsearch.config import FinetuneRecipe, load_recipe
from simsearch.errors import RecipeError
from simsearch.models import build_tiny_model, load_model, save_tiny, train_tokenizer
from simsearch.training.checkpoint import latest_checkpoint, load_state
from simsearch.training.distributed import adapter_dir
from simsearch.training.runlog import read_metrics

PAIR = {
    "prompt": "Act as a search engine.\nQuery: capital of france\nResults:\n",
    "response": "Doc 1(Title: Paris) Paris is the capital of France.\nDoc 2(Title: Lyon) Lyon is a city.",
}

# Runs the CLI under torchrun with DeepSpeed's shared-memory allreduce op switched off: that op is
# a C++ extension compiled on first use (minutes on a fresh machine); gloo does the collectives.
LAUNCHER = """
import sys
import deepspeed

deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
from simsearch.cli import main

sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sft")
    tokenizer = train_tokenizer([PAIR["prompt"] + PAIR["response"]] * 10, vocab_size=300)
    model = build_tiny_model(tokenizer, hidden=32, layers=2, heads=2, kv_heads=1, ffn=64, seed=0)
    save_tiny(model, tokenizer, root / "base")
    (root / "pairs.jsonl").write_text(json.dumps(PAIR) + "\n")
    return root


def _recipe(base: Path, run: Path, **overrides: object) -> FinetuneRecipe:
    recipe = FinetuneRecipe(
        run_dir=str(run),
        train_file=str(base / "pairs.jsonl"),
        val_file=str(base / "pairs.jsonl"),
        steps=3,
        batch_size=2,
        eval_every=1,
    )
    recipe.model.path = str(base / "base")
    recipe.optim.lr = 1e-2
    for key, value in overrides.items():
        section, _, name = key.partition("__")
        setattr(getattr(recipe, section), name, value) if name else setattr(recipe, key, value)
    return recipe


def _weights(path: Path) -> dict[str, torch.Tensor]:
    model, _ = load_model(path)
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_loss_falls_on_a_repeated_batch_and_a_checkpoint_is_written(base: Path, tmp_path: Path) -> None:
    from simsearch.commands.simulator_finetune import main

    final = main(_recipe(base, tmp_path / "run"))
    rows = [r for r in read_metrics(tmp_path / "run") if "losses/train" in r]
    losses = [r["losses/train"] for r in rows]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert losses[0] > losses[1] > losses[2] and all(math.isfinite(x) for x in losses)
    assert all(r["losses/val"] < r["losses/train"] for r in rows)  # val is measured after the step
    assert all(r["perf/tokens_per_s"] > 0 for r in rows)
    assert final == latest_checkpoint(tmp_path / "run") and final.name == "step_0000003"
    assert load_state(final)["step"] == 3
    trained, start = _weights(final / "model"), _weights(base / "base")
    assert any(not torch.equal(trained[k], start[k]) for k in start)
    assert (tmp_path / "run" / "recipe.yaml").is_file()


def test_accumulated_length_sorted_micro_batches_train_like_one_batch(base: Path, tmp_path: Path) -> None:
    from simsearch.commands.simulator_finetune import main

    # Responses of very different lengths, so sorting them into micro-batches changes the padding.
    pairs = [{"prompt": PAIR["prompt"], "response": PAIR["response"][:cut]} for cut in (8, 80, 20, 50, 35, 65)]
    varied = tmp_path / "varied.jsonl"
    varied.write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    runs = {}
    for batch_size, grad_accum in ((6, 1), (2, 3), (1, 6)):
        run = tmp_path / f"b{batch_size}a{grad_accum}"
        recipe = _recipe(base, run, batch_size=batch_size, grad_accum=grad_accum, train_file=str(varied), val_file="")
        weights = _weights(main(recipe) / "model")
        runs[batch_size] = (weights, [r["losses/train"] for r in read_metrics(run) if "losses/train" in r])
    one_batch, one_losses = runs[6]
    for batch_size in (2, 1):
        weights, losses = runs[batch_size]
        assert losses == pytest.approx(one_losses, rel=1e-5)
        # Adam divides by the gradient's own scale, so rounding in near-zero gradients shows up as
        # ~1e-6 differences; a step on other pairs would move weights by ~lr = 1e-2.
        for key, value in one_batch.items():
            torch.testing.assert_close(weights[key], value, rtol=0, atol=2e-5)


def test_resume_continues_exactly(base: Path, tmp_path: Path) -> None:
    from simsearch.commands.simulator_finetune import main

    main(_recipe(base, tmp_path / "straight", steps=4, optim__warmup_steps=2, optim__schedule="linear"))
    main(_recipe(base, tmp_path / "split", steps=2, optim__warmup_steps=2, optim__schedule="linear"))
    # More steps reshape the linear decay: the run directory's recipe would no longer say what ran.
    with pytest.raises(RecipeError, match=r"steps \(2 -> 4\); use a new run_dir, or resume=force"):
        main(_recipe(base, tmp_path / "split", steps=4, optim__warmup_steps=2, optim__schedule="linear"))
    # Forced: picks up at step 2 with optimizer and scheduler state, under the new schedule.
    main(_recipe(base, tmp_path / "split", steps=4, optim__warmup_steps=2, optim__schedule="linear", resume="force"))
    straight = read_metrics(tmp_path / "straight")
    split = read_metrics(tmp_path / "split")
    assert [r["step"] for r in split] == [0, 1, 2, 3, 4]  # no step logged twice
    # The schedule must have been restored too: linear decay over 4 steps depends on total_steps,
    # which changed between the two launches, so only the last two steps are compared for lr.
    assert [r["optim/lr"] for r in split[3:]] == pytest.approx([r["optim/lr"] for r in straight[3:]])
    assert [r["losses/train"] for r in split[3:]] == pytest.approx([r["losses/train"] for r in straight[3:]], rel=1e-5)


def test_warmup_ratio_sets_the_warmup_as_a_share_of_steps(base: Path, tmp_path: Path) -> None:
    from simsearch.commands.simulator_finetune import main

    main(_recipe(base, tmp_path / "run", steps=4, val_file="", optim__warmup_ratio=0.75))
    # int(0.75 x 4) = 3 warm-up steps, factor (s + 1) / 3; the lr is logged after the scheduler's
    # step, so steps 1..4 show factors 2/3, 1, 1, 1 of lr = 1e-2. Ignoring the ratio logs 1e-2 throughout.
    lrs = [r["optim/lr"] for r in read_metrics(tmp_path / "run") if "optim/lr" in r]
    assert lrs == pytest.approx([1e-2 * 2 / 3, 1e-2, 1e-2, 1e-2], rel=1e-12)


def test_lora_merge_on_save_writes_a_full_model_and_the_adapter(base: Path, tmp_path: Path) -> None:
    from simsearch.commands.simulator_finetune import main

    final = main(_recipe(base, tmp_path / "lora", steps=2, lora__r=4, lora__merge_on_save=True, val_file=""))
    assert (final / "model" / "config.json").is_file()
    assert (adapter_dir(final) / "adapter_config.json").is_file()
    merged, start = _weights(final / "model"), _weights(base / "base")
    assert set(merged) == set(start)  # plain weights, no lora_A / lora_B left
    assert any(not torch.equal(merged[k], start[k]) for k in start)
    # Resuming LoRA reloads the adapter: one more step runs from step 2.
    main(_recipe(base, tmp_path / "lora", steps=3, lora__r=4, lora__merge_on_save=True, val_file=""))
    assert [r["step"] for r in read_metrics(tmp_path / "lora")][-1] == 3


def test_recipe_round_trip_in_the_run_dir(base: Path, tmp_path: Path) -> None:
    from simsearch.commands.simulator_finetune import main

    main(_recipe(base, tmp_path / "run", steps=1, val_file=""))
    reloaded = load_recipe(FinetuneRecipe, tmp_path / "run" / "recipe.yaml")
    assert reloaded.steps == 1 and reloaded.optim.lr == 1e-2


@pytest.mark.slow  # 20-40 s: two processes each import DeepSpeed and transformers
def test_deepspeed_zero3_two_cpu_processes(base: Path, tmp_path: Path) -> None:
    recipe = {
        "run_dir": str(tmp_path / "ds"),
        "train_file": str(base / "pairs.jsonl"),
        "model": {"path": str(base / "base")},
        "steps": 2,
        "batch_size": 1,
        "optim": {"lr": 1e-2},
        "deepspeed": {"stage": 3},
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    (tmp_path / "launch.py").write_text(LAUNCHER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with socket.socket() as probe:  # a free port for the rendezvous (port 0 is not shared by ranks)
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            port,
            str(tmp_path / "launch.py"),
            "simulator",
            "finetune",
            str(tmp_path / "recipe.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [r for r in read_metrics(tmp_path / "ds") if "losses/train" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["losses/train"]) for r in rows)
    final = latest_checkpoint(tmp_path / "ds")
    trained, start = _weights(final / "model"), _weights(base / "base")
    assert set(trained) == set(start)
    assert any(not torch.equal(trained[k], start[k]) for k in start)
    assert Path(load_state(final)["deepspeed_dir"]).is_dir()


def test_a_sigterm_mid_run_saves_the_step_and_the_resume_replays_the_run(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import signal

    import simsearch.commands.simulator_finetune as finetune
    from simsearch.training.preempt import STOP_STATUS

    finetune.main(_recipe(base, tmp_path / "straight", steps=4))
    real_step = finetune._step

    def step_then_sigterm(sft, train, lengths, step):  # the signal comes while step 2 is in flight
        metrics = real_step(sft, train, lengths, step)
        if step == 1:
            signal.raise_signal(signal.SIGTERM)
        return metrics

    monkeypatch.setattr(finetune, "_step", step_then_sigterm)
    run = tmp_path / "stopped"
    with pytest.raises(SystemExit) as stopped:
        finetune.main(_recipe(base, run, steps=4))
    assert stopped.value.code == STOP_STATUS
    line = [x for x in capsys.readouterr().err.splitlines() if "stopped by SIGTERM" in x]
    assert len(line) == 1 and "after step 2/4" in line[0] and f"simulator finetune {run / 'recipe.yaml'}" in line[0]
    assert load_state(latest_checkpoint(run))["step"] == 2  # save_every=0: the stop wrote it

    monkeypatch.setattr(finetune, "_step", real_step)
    finetune.main(_recipe(base, run, steps=4))
    resumed, straight = read_metrics(run), read_metrics(tmp_path / "straight")
    keys = ("losses/train", "losses/val", "optim/lr")
    assert [[r.get(k) for k in keys] for r in resumed] == [[r.get(k) for k in keys] for r in straight]
    mine, theirs = (
        _weights(run / "checkpoints/step_0000004/model"),
        _weights(tmp_path / "straight/checkpoints/step_0000004/model"),
    )
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
