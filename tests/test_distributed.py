"""What the training commands share: process setup, all-reduces, the DeepSpeed config, LoRA
wrapping and resuming, weight export helpers, and the DeepSpeed state directories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from simsearch.errors import RecipeError
from simsearch.generation.recipe import ModelConfig
from simsearch.models import build_tiny_model, load_model, save_tiny, train_tokenizer
from simsearch.training.checkpoint import checkpoint_dir
from simsearch.training.distributed import (
    BatchShape,
    adapter_dir,
    all_reduce_max,
    all_reduce_sum,
    apply_lora,
    backward,
    deepspeed_config,
    deepspeed_state_dir,
    gathered_state_dict,
    init_distributed,
    load_for_training,
    mean_over_ranks,
    prune_deepspeed_dirs,
)
from simsearch.training.recipe import DeepSpeedConfig, LoraConfig
from tests.servers import free_port


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(["Query: capital of france\nResults:\nDoc 1(Title: Paris) Paris."] * 10, vocab_size=300)


def _tiny(tokenizer):
    return build_tiny_model(tokenizer, hidden=32, layers=1, heads=2, kv_heads=1, ffn=64, seed=0)


ONE = BatchShape(micro=1, accum=1, world=1)


def test_deepspeed_config() -> None:
    zero3 = DeepSpeedConfig(stage=3, offload_optimizer=True, offload_params=True)
    config = deepspeed_config(zero3, BatchShape(micro=2, accum=4, world=8), grad_clip=1.0, bf16=False)
    assert config["train_batch_size"] == 64
    assert config["zero_optimization"] == {
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "offload_param": {"device": "cpu"},
    }
    with pytest.raises(ValueError, match="offload_params needs"):
        deepspeed_config(DeepSpeedConfig(stage=2, offload_params=True), ONE, grad_clip=1.0, bf16=False)


def test_deepspeed_config_zero2_and_a_bad_stage() -> None:
    config = deepspeed_config(DeepSpeedConfig(stage=2), BatchShape(micro=3, accum=2, world=1), grad_clip=0.5, bf16=True)
    assert config["zero_optimization"] == {"stage": 2}
    assert (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]) == (3, 2)
    assert config["train_batch_size"] == 6  # 3 * 2 * 1
    assert config["gradient_clipping"] == 0.5 and config["bf16"] == {"enabled": True}
    assert "optimizer" not in config and "scheduler" not in config  # ours, passed as objects
    with pytest.raises(ValueError, match="stage=1 must be 2 or 3"):
        deepspeed_config(DeepSpeedConfig(stage=1), ONE, grad_clip=1.0, bf16=False)


def test_init_distributed_without_deepspeed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_distributed(False, task="training") == (0, 1)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(RecipeError, match=r"launched as 4 processes but deepspeed.stage=0: multi-process fine-tuning"):
        init_distributed(False, task="fine-tuning")


def test_one_process_all_reduces_are_identities() -> None:
    values = torch.tensor([1.5, 2.0], dtype=torch.float64)
    assert all_reduce_sum(values, 1) is values and values.tolist() == [1.5, 2.0]
    assert mean_over_ranks({"a": 1.0, "b": 3.0}, 1) == {"a": 1.0, "b": 3.0}


RANK_SCRIPT = """
import json, sys
import torch.distributed as dist
from simsearch.training.distributed import mean_over_ranks

dist.init_process_group("gloo")
rank = dist.get_rank()
# Keys in different orders on the two ranks: the helper must line them up by name.
if rank == 0:
    metrics = {"loss": 1.0 + 2 * rank, "reward": 10.0 * rank}
else:
    metrics = {"reward": 10.0 * rank, "loss": 1.0 + 2 * rank}
print(json.dumps(mean_over_ranks(metrics, dist.get_world_size())))
dist.destroy_process_group()
"""


def _two_gloo_processes(script_text: str, tmp_path: Path, timeout: float = 60) -> list[object]:
    """Runs `script_text` as ranks 0 and 1 of a gloo process group; each rank's printed JSON (its last line)."""
    script = tmp_path / "rank.py"
    script.write_text(script_text)
    port = str(free_port())
    base = {**os.environ, "OMP_NUM_THREADS": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    procs = [
        subprocess.Popen([sys.executable, str(script)], env={**base, "RANK": str(r)}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for r in range(2)
    ]  # fmt: skip
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:  # a rank left waiting in a collective: end both, then fail
            p.kill()
            p.communicate()
        raise
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]  # libraries may print before it


def test_mean_over_ranks_in_two_gloo_processes(tmp_path: Path) -> None:
    # loss: (1 + 3) / 2 = 2; reward: (0 + 10) / 2 = 5; every rank gets the same means.
    assert _two_gloo_processes(RANK_SCRIPT, tmp_path) == [{"loss": 2.0, "reward": 5.0}] * 2


MAX_SCRIPT = """
import json
import torch
import torch.distributed as dist
from simsearch.training.distributed import all_reduce_max

dist.init_process_group("gloo")
rank = dist.get_rank()
values = torch.tensor([3, 1, 0]) if rank == 0 else torch.tensor([2, 4, 0])
print(json.dumps(all_reduce_max(values, dist.get_world_size()).tolist()))
dist.destroy_process_group()
"""


def test_all_reduce_max_in_two_gloo_processes(tmp_path: Path) -> None:
    # element-wise: max(3, 2), max(1, 4), max(0, 0); a sum would give [5, 5, 0]
    assert _two_gloo_processes(MAX_SCRIPT, tmp_path) == [[3, 4, 0]] * 2
    one = torch.tensor([7, 1])
    assert all_reduce_max(one, 1) is one and one.tolist() == [7, 1]


class FakeEngine:
    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        self.calls.append(("boundary", is_boundary))

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool) -> None:
        self.calls.append(("backward", scale_wrt_gas))

    def step(self) -> None:
        self.calls.append(("step", None))


def test_backward_plain_and_through_an_engine() -> None:
    weight = torch.nn.Parameter(torch.tensor([2.0]))
    backward((3.0 * weight).sum(), None)
    assert weight.grad.tolist() == [3.0]
    engine = FakeEngine()
    backward((3.0 * weight).sum(), engine)
    # The loss is already normalized, so the engine must not divide it again; then it may step.
    assert engine.calls == [("backward", False), ("step", None)]
    assert weight.grad.tolist() == [3.0]  # the engine, not torch, did the backward
    # An explicit boundary is set before the backward, whose reduction depends on it.
    engine.calls.clear()
    backward((3.0 * weight).sum(), engine, boundary=False)
    backward((3.0 * weight).sum(), engine, boundary=True)
    assert engine.calls == [
        ("boundary", False),
        ("backward", False),
        ("step", None),
        ("boundary", True),
        ("backward", False),
        ("step", None),
    ]


LORA = LoraConfig(r=2, alpha=4, dropout=0.0, target_modules=["q_proj", "v_proj"])
NO_LORA = LoraConfig(r=0, alpha=4, dropout=0.0, target_modules=["q_proj", "v_proj"])


@pytest.fixture(scope="module")
def base(tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(_tiny(tokenizer), tokenizer, tmp_path_factory.mktemp("base") / "model")


def _base_model(base: Path) -> ModelConfig:
    return ModelConfig(path=str(base), dtype="float32")


def _lora_weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_apply_lora_trains_the_adapter_only_and_resumes_its_weights(tokenizer, tmp_path: Path) -> None:
    model = apply_lora(_tiny(tokenizer), LORA, adapter=None)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".")[-3] for n in trainable} == {"lora_A", "lora_B"}  # ...q_proj.lora_A.default.weight
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.fill_(0.25)  # lora_B starts at 0: make the saved adapter differ from a fresh one
    model.save_pretrained(tmp_path / "checkpoint" / "model")
    assert adapter_dir(tmp_path / "checkpoint") == tmp_path / "checkpoint" / "model"
    resumed = apply_lora(_tiny(tokenizer), LORA, adapter=adapter_dir(tmp_path / "checkpoint"))
    saved = _lora_weights(model)
    assert saved.keys() == _lora_weights(resumed).keys()
    for name, param in _lora_weights(resumed).items():
        assert torch.equal(param, saved[name]), name


def test_adapter_dir_prefers_the_adapter_kept_beside_merged_weights(tmp_path: Path) -> None:
    (tmp_path / "model" / "adapter").mkdir(parents=True)
    assert adapter_dir(tmp_path) == tmp_path / "model" / "adapter"


def test_load_for_training_resumes_full_weights_unless_deepspeed_restores_them(
    tokenizer,
    base: Path,
    tmp_path: Path,
) -> None:
    checkpoint = tmp_path / "step_0000001"
    trained = build_tiny_model(tokenizer, hidden=32, layers=1, heads=2, kv_heads=1, ffn=64, seed=1)
    save_tiny(trained, tokenizer, checkpoint / "model")
    model = _base_model(base)
    common = {"checkpoint": checkpoint, "gradient_checkpointing": False}
    start, _ = load_model(base, dtype="float32")
    assert not all(torch.equal(v, start.state_dict()[k]) for k, v in trained.state_dict().items())  # seeds differ
    resumed, _ = load_for_training(model, NO_LORA, deepspeed=False, **common)
    assert all(torch.equal(v, trained.state_dict()[k]) for k, v in resumed.state_dict().items())
    # Under DeepSpeed the base model loads; the engine's load_checkpoint brings the trained weights.
    fresh, _ = load_for_training(model, NO_LORA, deepspeed=True, **common)
    assert all(torch.equal(v, start.state_dict()[k]) for k, v in fresh.state_dict().items())


def test_load_for_training_resumes_the_lora_adapter_unless_deepspeed_restores_it(
    tokenizer,
    base: Path,
    tmp_path: Path,
) -> None:
    checkpoint = tmp_path / "step_0000001"
    saved = apply_lora(_tiny(tokenizer), LORA, adapter=None)
    with torch.no_grad():
        for name, param in saved.named_parameters():
            if "lora_B" in name:
                param.fill_(0.25)
    saved.save_pretrained(checkpoint / "model" / "adapter")  # as merge_on_save keeps it
    model = _base_model(base)
    common = {"checkpoint": checkpoint, "gradient_checkpointing": False}
    resumed, _ = load_for_training(model, LORA, deepspeed=False, **common)
    assert _lora_weights(resumed).keys() == _lora_weights(saved).keys()
    assert all(torch.equal(v, _lora_weights(saved)[k]) for k, v in _lora_weights(resumed).items())
    fresh, _ = load_for_training(model, LORA, deepspeed=True, **common)
    fresh_b = [v for k, v in _lora_weights(fresh).items() if "lora_B" in k]
    assert fresh_b and all(not v.any() for v in fresh_b)  # a fresh adapter: lora_B starts at 0


def test_gradient_checkpointing_with_lora_still_reaches_the_adapter(base: Path) -> None:
    model, _ = load_for_training(
        ModelConfig(path=str(base), dtype="float32"),
        LORA,
        checkpoint=None,
        deepspeed=False,
        gradient_checkpointing=True,
    )
    assert model.is_gradient_checkpointing
    model.train()
    ids = torch.tensor([[5, 6, 7, 8]])
    model(input_ids=ids, labels=ids).loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if "lora_B" in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


def test_gathered_state_dict_without_zero3_is_a_cpu_copy_on_rank_0(tokenizer) -> None:
    model = _tiny(tokenizer)
    weights = gathered_state_dict(model, zero3=False, rank=0)
    assert weights is not None and set(weights) == set(model.state_dict())
    name = next(iter(weights))
    with torch.no_grad():
        weights[name].add_(1.0)  # a copy: the model is untouched
    assert not torch.equal(weights[name], model.state_dict()[name])
    assert gathered_state_dict(model, zero3=False, rank=1) is None


def test_deepspeed_states_follow_the_checkpoints(tmp_path: Path) -> None:
    prune_deepspeed_dirs(tmp_path)  # no deepspeed/ yet: nothing to do
    # The state of step 2 sits beside checkpoint step 2 under the same name.
    assert deepspeed_state_dir(tmp_path, 2) == tmp_path / "deepspeed" / "step_0000002"
    assert deepspeed_state_dir(tmp_path, 2).name == checkpoint_dir(tmp_path, 2).name
    for step in (1, 2):
        (deepspeed_state_dir(tmp_path, step) / "state").mkdir(parents=True)
    checkpoint_dir(tmp_path, 2).mkdir(parents=True)  # checkpoint 1 was pruned
    prune_deepspeed_dirs(tmp_path)
    assert sorted(p.name for p in (tmp_path / "deepspeed").iterdir()) == ["step_0000002"]


# --------------------------------------------------------------------------- a failure in a collective export

# Each rank reports how its call ended. A rank that failed stays alive a while afterwards (as one does
# under NCCL until a watchdog fires), so a rank left waiting in a collective shows as an error of the
# process group long after, not as the clear FailedElsewhereError.
OUTCOME = """
def outcome_of(call):
    began = time.time()
    try:
        call()
        outcome = "returned"
    except Exception as err:
        outcome = f"{type(err).__name__}: {err}"
    signal = Path(__file__).parent
    (signal / f"done{rank}").write_text(outcome)
    deadline = time.time() + 20
    while not (signal / f"done{1 - rank}").exists() and time.time() < deadline:
        time.sleep(0.05)
    print(json.dumps({"outcome": outcome, "s": round(time.time() - began, 1)}))
    sys.stdout.flush()
    os._exit(0)
"""

EXPORT_FAILURE_SCRIPT = (
    """
import json, os, sys, time
from pathlib import Path
os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])  # what DeepSpeed reads; torchrun would set it
import deepspeed, torch
import torch.distributed as dist
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no C++ build; gloo does it
from simsearch.models import build_tiny_model, train_tokenizer
from simsearch.policy.sync import RolloutWeights, sync_rollout_weights

dist.init_process_group("gloo")
rank = dist.get_rank()
"""
    + OUTCOME
    + """
tok = train_tokenizer(["the cat sat on the mat"] * 20, vocab_size=300)
model = build_tiny_model(tok, hidden=16, layers=2, heads=2, kv_heads=1, ffn=32, seed=0)
config = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1}
deepspeed.zero.Init(module=model, config_dict_or_path=config)  # partitioned over the two ranks

class Engine:
    def sync_weights(self, pairs):  # rank 1's vLLM refuses the third tensor
        for i, (name, tensor) in enumerate(pairs):
            if rank == 1 and i == 2:
                raise ValueError(f"vLLM refused {name}")

outcome_of(lambda: sync_rollout_weights(RolloutWeights(Engine(), model, vllm=True, lora=False, zero3=True)))
"""
)


def test_a_failed_load_on_one_rank_ends_every_rank_of_the_zero3_export(tmp_path: Path) -> None:
    zero, one = _two_gloo_processes(EXPORT_FAILURE_SCRIPT, tmp_path, timeout=240)  # DeepSpeed imports slowly
    assert one["outcome"] == "ValueError: vLLM refused model.layers.0.self_attn.q_proj.bias"  # its own error
    assert zero["outcome"].startswith("FailedElsewhereError: the weight sync to vLLM failed on another process")
    assert zero["s"] < 15  # told, not left waiting for rank 1


SAVE_FAILURE_SCRIPT = (
    """
import json, os, sys, time
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace
import torch.distributed as dist
from simsearch.training.session import Run

dist.init_process_group("gloo")
rank = dist.get_rank()
"""
    + OUTCOME
    + """
run = Run(rank, 2, Path(__file__).parent / "run", None, None)
model = SimpleNamespace(deepspeed=False, gathered=nullcontext)

def export():
    raise OSError("No space left on device")

outcome_of(lambda: run.save(1, [model], export, None, lambda ds_dir: {}))
"""
)


def test_a_failed_save_on_rank_0_ends_every_rank(tmp_path: Path) -> None:
    zero, one = _two_gloo_processes(SAVE_FAILURE_SCRIPT, tmp_path, timeout=180)
    assert zero["outcome"] == "OSError: No space left on device"
    assert one["outcome"].startswith("FailedElsewhereError: saving the checkpoint of step 1 failed on another process")
    assert one["s"] < 15
