"""`simsearch train` end to end on CPU, with a tiny policy taught the tag format in-process.

The fixture writes the toy world of `tests.toy_world` ("What color is item N?", answers red or
blue, and a tiny policy that searches once, then answers either color).
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import simsearch.commands.train as train
import simsearch.factory.train as rl_module
import simsearch.policy.step as step_module
import simsearch.policy.validation as validation
import simsearch.training.distributed as distributed
import simsearch.training.session as session
from simsearch.config import TrainRecipe, load_recipe
from simsearch.curriculum.schedules import exponential
from simsearch.errors import RecipeError, ServiceError
from simsearch.models import load_model
from simsearch.policy.advantages import ESTIMATORS
from simsearch.policy.rewards import score_trajectories
from simsearch.retrieval.bm25 import BM25SearchEngine
from simsearch.retrieval.server import create_app
from simsearch.training.checkpoint import latest_checkpoint, load_state
from simsearch.training.runlog import read_metrics
from tests.servers import serve_in_thread
from tests.toy_world import QUESTIONS, TRAIN_SETTINGS, build_world, item_passage

# DeepSpeed's shared-memory allreduce is a C++ extension compiled on first use (minutes on a fresh
# machine); switched off, gloo does the collectives.
LAUNCHER = """
import sys
import deepspeed

deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
from simsearch.cli import main

sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """QA files, a corpus and a tiny policy that searches once, then answers red or blue."""
    return build_world(tmp_path_factory.mktemp("train_world"))


def _overrides(world: Path, run_dir: Path, **extra: object) -> list[str]:
    base = {
        "run_dir": run_dir,
        "policy.model.path": world / "policy",
        "data.train": f"[{world / 'train.jsonl'}]",
        "search.corpus": world / "corpus.jsonl",
        **TRAIN_SETTINGS,
    }
    base.update(extra)
    return [f"{key}={value}" for key, value in base.items()]


def _recipe(world: Path, run_dir: Path, **extra: object) -> TrainRecipe:
    return load_recipe(TrainRecipe, None, _overrides(world, run_dir, **extra))


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(directory / "model.safetensors")


def _finite_losses(row: dict) -> bool:
    keys = [k for k in row if k.startswith(("losses/", "reward/", "optim/"))]
    return bool(keys) and all(row[k] is not None and math.isfinite(row[k]) for k in keys)


# --------------------------------------------------------------------------- every estimator


ESTIMATOR_STATS = {
    "grpo": "advantages/zero_std_groups",
    "dr_grpo": "advantages/zero_std_groups",
    "reinforce": "advantages/baseline",
    "reinforce_baseline": "advantages/baseline",
    "reinforce_pp": "advantages/returns_mean",
    "rloo": "advantages/zero_std_groups",
    "ppo": "advantages/values_mean",
    "stratified_grpo": "advantages/num_strata",
    "igpo": "advantages/gain_mean",
}


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_each_estimator_trains_two_steps(world: Path, tmp_path: Path, estimator: str) -> None:
    run = tmp_path / "run"
    extra: dict[str, object] = {"algorithm.estimator": estimator, "trajectory_samples": 8}  # a step's every one
    if estimator == "grpo":  # one run also validates and aggregates per sequence
        extra.update(
            {"data.val": f"[{world / 'val.jsonl'}]", "eval_every": 1, "algorithm.loss_agg": "seq-mean-token-mean"}
        )
    if estimator == "reinforce_pp":
        extra.update({"algorithm.kl_in_reward": "true", "algorithm.kl_estimator": "k2"})
    if estimator == "rloo":  # several minibatches and epochs: old log-probs are recomputed; dual clip
        extra.update({"algorithm.ppo_epochs": 2, "algorithm.minibatch_size": 4, "gradient_checkpointing": "true",
                      "algorithm.clip_ratio_c": 3.0})  # fmt: skip
    if estimator == "dr_grpo":
        extra.update({"bf16": "true", "algorithm.loss_agg": "seq-mean-token-sum-norm", "algorithm.entropy_coef": 0.01})
    final = train.main(_recipe(world, run, **extra))

    assert (run / "recipe.yaml").is_file()
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(_finite_losses(r) for r in rows)
    assert ESTIMATOR_STATS[estimator] in rows[0]
    assert all(0.0 <= r["losses/clipfrac_lower"] <= 1.0 for r in rows)
    assert rows[0]["search/calls_per_traj"] > 0.5  # the tiny policy really searches
    # Each step logged its 8 trajectories (2 prompts x 4): a reward is the F1 the evaluation scorer gives the
    # logged answer (the default weights are {f1: 1}), and reward/mean, logged and returned, is their mean.
    logged = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    for row in rows:
        sampled = [t for t in logged if t["step"] == row["step"]]
        assert len(sampled) == 8 and all(t["reward"] == t["scores"]["f1"] for t in sampled)
        assert row["reward/mean"] == pytest.approx(sum(t["reward"] for t in sampled) / 8, abs=1e-12)
    assert final["reward/mean"] == pytest.approx(sum(t["reward"] for t in logged if t["step"] == 2) / 8, abs=1e-12)
    checkpoint = latest_checkpoint(run)
    assert checkpoint is not None and checkpoint.name == "step_0000002"
    trained, start = _weights(checkpoint / "model"), _weights(world / "policy")
    assert any(not torch.equal(trained[k], start[k]) for k in start), "no parameter moved"
    if estimator == "ppo":
        state = load_state(checkpoint)
        assert rows[0]["losses/value"] > 0
        assert float(state["critic"]["head.weight"].abs().sum()) > 0  # the critic's head started at 0
    if estimator == "grpo":
        # greedy answers to val.jsonl's 4 questions: EM is a whole count of 4
        assert rows[0]["val/em"] * 4 == round(rows[0]["val/em"] * 4) and rows[0]["val/calls_per_traj"] > 0.5


def test_a_policy_that_is_not_in_process_is_refused(world: Path, tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"policy.kind=hf"):  # refused with the recipe, before any work
        _recipe(world, tmp_path / "run", **{"policy.kind": "openai", "policy.base_urls": "[http://127.0.0.1:9]"})


# --------------------------------------------------------------------------- resume


@pytest.fixture(scope="module")
def uninterrupted(world: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    run = tmp_path_factory.mktemp("uninterrupted")
    train.main(_recipe(world, run, **RESUME_SETTINGS, steps=4))
    return read_metrics(run)


# A curriculum over 4 steps whatever `steps` says, so runs of 2 and 4 steps share it.
RESUME_SETTINGS = {"curriculum.total_steps": 4, "curriculum.p_end": 1.0, "algorithm.kl_coef": 0.001}
COMPARED = ("reward/mean", "losses/policy", "losses/kl", "rollout/response_len", "curriculum/p_noise", "data/position")


def test_resume_continues_the_run_exactly(world: Path, tmp_path: Path, uninterrupted: list[dict]) -> None:
    run = tmp_path / "run"
    train.main(_recipe(world, run, **RESUME_SETTINGS, steps=2, save_every=1))
    assert load_state(latest_checkpoint(run))["data_position"] == 4
    train.main(_recipe(world, run, **RESUME_SETTINGS, steps=4, save_every=1))

    resumed = read_metrics(run)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for mine, theirs in zip(resumed, uninterrupted):
        for key in COMPARED:
            assert mine[key] == pytest.approx(theirs[key], rel=1e-6, abs=1e-9), (mine["step"], key)
    state = load_state(latest_checkpoint(run))
    assert (state["step"], state["data_position"]) == (4, 8)


def test_resume_after_a_sigkill(world: Path, tmp_path: Path, uninterrupted: list[dict]) -> None:
    run = tmp_path / "run"
    args = _overrides(world, run, **RESUME_SETTINGS, steps=4, save_every=1)
    (tmp_path / "recipe.yaml").write_text("seed: 0\n")  # everything else comes as overrides
    process = subprocess.Popen(
        [sys.executable, "-m", "simsearch.cli", "train", str(tmp_path / "recipe.yaml"), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    first = run / "checkpoints" / "step_0000001" / "trainer_state.pt"
    deadline = time.monotonic() + 120
    while not first.is_file() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    _, stderr = process.communicate(timeout=30)
    assert first.is_file(), stderr.decode()[-2000:]
    killed_at = load_state(latest_checkpoint(run))["step"]
    assert killed_at < 4, "the run finished before it was killed; the test proves nothing"

    train.main(_recipe(world, run, **RESUME_SETTINGS, steps=4, save_every=1))
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["curriculum/p_noise"] for r in rows] == pytest.approx([exponential(s, 0.0, 1.0, 4) for s in range(4)])
    assert [r["data/position"] for r in rows] == [2, 4, 6, 8]
    # Sampling is seeded per step, so the steps run after the resume match the uninterrupted run
    # in what does not depend on the weights' last bits.
    assert [r["curriculum/p_noise"] for r in rows] == [r["curriculum/p_noise"] for r in uninterrupted]
    state = load_state(latest_checkpoint(run))
    assert (state["step"], state["data_position"]) == (4, 8)


# --------------------------------------------------------------------------- LoRA


def test_lora_trains_the_adapter_only(world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[torch.nn.Module] = []

    def recording_load(*args, **kwargs):
        model, tokenizer = load_model(*args, **kwargs)
        loaded.append(model)
        return model, tokenizer

    monkeypatch.setattr(rl_module, "load_model", recording_load)
    monkeypatch.setattr(distributed, "load_model", recording_load)  # the policy loads through load_for_training
    run = tmp_path / "run"
    overrides = {"lora.r": 4, "lora.target_modules": "[q_proj,v_proj]", "optim.lr": 1e-2, "algorithm.kl_coef": 0.01}
    train.main(_recipe(world, run, **overrides))

    policy = loaded[0]  # the base model get_peft_model wrapped in place
    assert len(loaded) == 1, "with LoRA the reference is the base model itself (adapter disabled)"
    fresh, _ = load_model(world / "policy")
    # LoRA wraps q_proj / v_proj in place: their frozen weights move under `.base_layer`.
    base = {k.replace(".base_layer", ""): v for k, v in policy.state_dict().items() if "lora_" not in k}
    assert base.keys() == fresh.state_dict().keys()
    for key, value in fresh.state_dict().items():
        assert torch.equal(base[key], value), key
    saved = load_file(latest_checkpoint(run) / "model" / "adapter_model.safetensors")
    assert saved and all("lora_" in k for k in saved)
    assert any(float(v.abs().sum()) > 0 for k, v in saved.items() if "lora_B" in k)  # lora_B starts at 0
    rows = read_metrics(run)
    assert rows[0]["losses/kl"] == 0.0  # adapter B = 0: the policy is its own reference
    assert rows[1]["losses/kl"] > 0.0


# --------------------------------------------------------------------------- faults


def test_a_dead_search_server_stops_the_run_with_the_last_checkpoint_intact(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    passages = [item_passage(i, a) for i, (_, a) in enumerate(QUESTIONS)]
    server = serve_in_thread(create_app(BM25SearchEngine.build(passages, show_progress=False), default_top_k=1))
    url = server.__enter__()
    real_save = session.save_checkpoint

    def save_then_kill_server(*args, **kwargs):
        saved = real_save(*args, **kwargs)
        server.__exit__(None, None, None)  # the server dies right after step 1's checkpoint
        return saved

    monkeypatch.setattr(session, "save_checkpoint", save_then_kill_server)
    run = tmp_path / "run"
    recipe = _recipe(
        world, run, steps=3, save_every=1,
        **{"search.kind": "http", "search.url": f"{url}/retrieve", "search.max_retries": 1, "search.backoff_s": 0.01},
    )  # fmt: skip
    with pytest.raises(ServiceError) as error:
        train.main(recipe)

    message = str(error.value)
    assert "step 2/3" in message and "step_0000001 (step 1)" in message and "resume" in message
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_0000001"]
    assert load_state(latest_checkpoint(run))["step"] == 1
    assert [r["step"] for r in read_metrics(run)] == [1]


# --------------------------------------------------------------------------- DeepSpeed


@pytest.mark.slow  # ~40-60 s: two processes each import DeepSpeed and transformers
def test_deepspeed_zero3_ppo_in_two_cpu_processes(world: Path, tmp_path: Path) -> None:
    run = tmp_path / "ds"
    args = _overrides(world, run, **{"deepspeed.stage": 3, "optim.lr": 1e-2, "algorithm.estimator": "ppo"})
    (tmp_path / "recipe.yaml").write_text("seed: 0\n")  # everything else comes as overrides
    (tmp_path / "launch.py").write_text(LAUNCHER)
    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", port, str(tmp_path / "launch.py"), "train", str(tmp_path / "recipe.yaml"), *args],
        capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(_finite_losses(r) for r in rows)
    checkpoint = latest_checkpoint(run)
    trained, start = _weights(checkpoint / "model"), _weights(world / "policy")
    assert set(trained) == set(start)
    assert any(not torch.equal(trained[k], start[k]) for k in start)
    assert rows[0]["losses/value"] > 0  # PPO: the critic is a second DeepSpeed engine
    ds_dir = Path(load_state(checkpoint)["deepspeed_dir"])
    assert (ds_dir / "policy").is_dir() and (ds_dir / "critic").is_dir()


def test_recipes_point_at_their_own_command() -> None:
    for path in sorted(Path(__file__).resolve().parents[2].joinpath("recipes", "train").glob("*.yaml")):
        first = path.read_text().splitlines()[0]
        assert first.startswith("#") and "train" in first and path.name in first, path


@pytest.mark.parametrize("normalization", ["squad", "unicode"])
def test_the_reward_and_validation_score_with_the_recipes_normalization(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, normalization: str
) -> None:
    seen: list[str] = []

    def recording_score(trajectories, weights, *, normalization: str = "unicode"):
        seen.append(normalization)
        return score_trajectories(trajectories, weights, normalization=normalization)

    monkeypatch.setattr(step_module, "score_trajectories", recording_score)
    monkeypatch.setattr(validation, "score_trajectories", recording_score)
    overrides = _overrides(world, tmp_path, steps=1, eval_every=1, **{"reward.normalization": normalization})
    train.main(load_recipe(TrainRecipe, None, [*overrides, f"data.val=[{world / 'val.jsonl'}]"]))
    assert seen == [normalization, normalization]  # the step's reward, then validation
