"""Weight sync on CPU: the HFEngine's unpartitioned ZeRO-3 copy is filled a module at a time, and the
vLLM engine gets the trained pairs. DeepSpeed is replaced by a recorder of what each gather holds;
the real ZeRO-3 gathers in one and two gloo processes are in tests/generation/test_vllm.py and
tests/test_distributed.py.
"""

from __future__ import annotations

import copy
import sys
import types
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from simsearch.models import build_tiny_model, train_tokenizer
from simsearch.policy.sync import RolloutWeights, sync_rollout_weights, trainable_zero3_params


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(["the cat sat on the mat; <search> q </search>"] * 20, vocab_size=300)


def tiny(tokenizer):
    return build_tiny_model(tokenizer, hidden=16, layers=2, heads=2, kv_heads=1, ffn=32, seed=0)


class GatherRecorder:
    """Stands for `deepspeed`: records the bytes each `GatheredParameters` holds and the most held at once."""

    def __init__(self) -> None:
        self.held = 0
        self.peak = 0
        self.gathers: list[int] = []

    @contextmanager
    def gathered(self, params: list[torch.Tensor], modifier_rank: Any = None):
        assert modifier_rank is None  # read only: nothing broadcast back
        size = sum(p.numel() * p.element_size() for p in params)
        self.gathers.append(size)
        self.held += size
        self.peak = max(self.peak, self.held)
        try:
            yield
        finally:
            self.held -= size


@pytest.fixture
def fake_deepspeed(monkeypatch):
    recorder = GatherRecorder()
    module = types.ModuleType("deepspeed")
    module.zero = types.SimpleNamespace(GatheredParameters=recorder.gathered)
    monkeypatch.setitem(sys.modules, "deepspeed", module)
    return recorder


class ResetRecorder:
    def __init__(self) -> None:
        self.resets = 0

    def reset_prefix_cache(self) -> None:
        self.resets += 1


def test_the_zero3_rollout_copy_is_filled_one_module_at_a_time(tokenizer, fake_deepspeed):
    trained, rollout_copy = tiny(tokenizer), tiny(tokenizer)
    with torch.no_grad():
        for param in trained.parameters():
            param.add_(1.0)  # the update
    trained.model.embed_tokens.weight.requires_grad_(False)  # frozen: never changes, never gathered
    engine = ResetRecorder()
    sync_rollout_weights(RolloutWeights(engine, trained, vllm=False, lora=False, zero3=True, copy=rollout_copy))
    assert engine.resets == 1
    for (name, got), (_, want) in zip(rollout_copy.named_parameters(), trained.named_parameters()):
        assert torch.equal(got, want) != (name == "model.embed_tokens.weight"), name
    # The peak is one module's parameters, not the whole model's (a second full copy per sync).
    largest = max(
        sum(p.numel() * p.element_size() for p in m.parameters(recurse=False) if p.requires_grad)
        for m in trained.modules()
    )
    trainable = sum(p.numel() * p.element_size() for p in trained.parameters() if p.requires_grad)
    assert fake_deepspeed.peak == largest < trainable / 4
    assert sum(fake_deepspeed.gathers) == trainable  # each trainable parameter gathered once


def test_trainable_zero3_params_name_each_trainable_parameter_once_as_the_model_does(tokenizer, fake_deepspeed):
    model = tiny(tokenizer)
    model.model.norm.weight.requires_grad_(False)
    pairs = list(trainable_zero3_params(model))
    assert [n for n, _ in pairs] == [n for n, p in model.named_parameters() if p.requires_grad]


def test_the_vllm_engine_gets_every_trained_pair_without_zero3(tokenizer):
    class Engine:
        def sync_weights(self, pairs):
            self.names = [n for n, _ in pairs]
            return len(self.names)

    trained, engine = tiny(tokenizer), Engine()
    sync_rollout_weights(RolloutWeights(engine, trained, vllm=True, lora=False, zero3=False))
    assert engine.names == [n for n, _ in trained.named_parameters()]


def test_without_a_copy_the_hf_engine_only_drops_its_prefix_cache(tokenizer, fake_deepspeed):
    engine = ResetRecorder()
    model = tiny(tokenizer)
    before = copy.deepcopy(model.state_dict())
    sync_rollout_weights(RolloutWeights(engine, model, vllm=False, lora=False, zero3=False))
    assert engine.resets == 1 and fake_deepspeed.gathers == []
    assert all(torch.equal(t, before[k]) for k, t in model.state_dict().items())
