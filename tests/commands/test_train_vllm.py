"""`simsearch train` with `policy.kind=vllm`, on CPU against a fake `vllm` module.

The fake `vllm.LLM` loads the policy directory into a transformers model of its own and generates
with an HFEngine over it, answering in vLLM's output shapes; the real `VLLMEngine` runs on top.
Its `load_weights` copies each synced pair into that model by name. So rollouts really come from
the engine's own copy of the weights, and each recorded sync is compared with the weights the
trainer wrote in that step's checkpoint: a skipped sync, or one with stale or wrong tensors, fails.

What these tests cannot show: that real vLLM accepts these calls, names and sleep cycles. That
needs a GPU (docs/scaling.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

import simsearch.policy.update as update_module
import simsearch.training.session as session
from simsearch.commands import train
from simsearch.errors import RecipeError
from simsearch.generation.hf import HFEngine
from simsearch.models import load_model
from simsearch.training.checkpoint import checkpoint_dir
from simsearch.training.runlog import read_metrics
from simsearch.types import Completion, SamplingParams
from tests.commands import test_train
from tests.commands.test_train import _finite_losses, _recipe, _weights
from tests.generation.test_vllm import (  # fakes of vLLM's objects, its transport and its checks
    FakeModel,
    FakeSamplingParams,
    Logprob,
    Out,
    Req,
    deliver_to_workers,
    install_fake_vllm,
)

# The module-scoped fixture of test_train.py: QA files, a corpus, a tiny policy that searches.
world = test_train.world

VLLM = {"policy.kind": "vllm", "save_every": 1}


def _as_vllm(index: int, completion: Completion) -> Out:
    # HFEngine already follows the engine contract: the stop string stays, the end token's text
    # is left out (as a tokenizer that skips it would give).
    steps = None
    if completion.logprobs is not None:
        steps = [{t: Logprob(lp)} for t, lp in zip(completion.token_ids, completion.logprobs)]
    return Out(
        index,
        completion.text,
        completion.token_ids,
        completion.finish_reason,
        completion.stop,
        steps,
    )


class FakeLLM:
    """vLLM's `LLM` over an in-process transformers copy of the model; records every call."""

    built: ClassVar[list[FakeLLM]] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.model, self.tokenizer = load_model(kwargs["model"])
        self.engine = HFEngine(self.model, self.tokenizer)
        self.events: list[tuple[Any, ...]] = []
        self.syncs: list[dict[str, torch.Tensor]] = []  # one dict per sync_weights
        self._loading: dict[str, torch.Tensor] = {}
        FakeLLM.built.append(self)

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def generate(
        self,
        prompts: list[dict],
        sampling_params: list[FakeSamplingParams],
        use_tqdm: bool,
    ) -> list[Req]:
        self.events.append(("generate",))
        outputs = []
        for prompt, params in zip(prompts, sampling_params):
            kw = params.values  # as vLLM validated and adjusted them
            ours = SamplingParams(
                temperature=kw["temperature"],
                top_p=kw["top_p"],
                max_new_tokens=kw["max_tokens"],
                stop=kw["stop"] or [],
                n=kw["n"],
                seed=kw["seed"],
                logprobs=kw["logprobs"] is not None,
            )
            completions = self.engine.generate([prompt["prompt_token_ids"]], ours)
            outputs.append(Req([_as_vllm(j, c) for j, c in enumerate(completions)]))
        return outputs

    def apply_model(self, func: Any) -> list[Any]:
        self.events.append(("apply_model",))
        # Delivered as vLLM would (serialized when the engine core runs in another process);
        # worker 0 loads into this copy of the model, the other shards are only recorded.
        first, *others = deliver_to_workers(func, self.kwargs)
        return [first(self), *(copy(FakeModel()) for copy in others)]

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in weights:
                assert name not in self._loading, f"{name} loaded twice in one sync"
                # A name the model lacks is a KeyError, a wrong shape an AssertionError.
                assert tensor.shape == params[name].shape, name
                params[name].copy_(tensor)
                self._loading[name] = tensor.detach().clone()

    def reset_prefix_cache(self) -> bool:
        self.events.append(("reset_prefix_cache",))
        self.engine.reset_prefix_cache()
        if self._loading:
            self.syncs.append(self._loading)
            self._loading = {}
        return True

    def sleep(self, level: int) -> None:
        self.events.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.events.append(("wake_up", tags))


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> list[FakeLLM]:
    """Installs the fake `vllm`; returns the list of engines built while it is in place."""
    install_fake_vllm(monkeypatch, FakeLLM, FakeSamplingParams)
    monkeypatch.setattr(FakeLLM, "built", [])
    return FakeLLM.built


def _collapsed(events: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Runs of one event (the generate calls of a rollout, one load per parameter) as one."""
    return [e for i, e in enumerate(events) if i == 0 or e != events[i - 1]]


def _assert_sync_matches(synced: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    for name, tensor in synced.items():
        # Merged LoRA: W + B A s here in place vs. a fresh merge at save; a few ulps apart.
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-6, msg=name)


# --------------------------------------------------------------------------- plain weights


def test_vllm_rollouts_train_and_every_update_is_synced(world: Path, tmp_path: Path, fake_vllm) -> None:
    run = tmp_path / "run"
    train.main(_recipe(world, run, **VLLM))

    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(_finite_losses(r) for r in rows)
    # The engine's copy of the policy searched.
    assert rows[0]["search/calls_per_traj"] > 0.5
    [llm] = fake_vllm
    assert llm.kwargs["model"] == str(world / "policy")
    assert llm.kwargs["seed"] == 0  # recipe seed + rank
    assert llm.kwargs["distributed_executor_backend"] is None  # one process
    assert llm.kwargs["enable_sleep_mode"] is False
    assert llm.kwargs["max_model_len"] is None  # 0 in the recipe: the model's own
    assert not [e for e in llm.events if e[0] in ("sleep", "wake_up")]

    # One sync at setup (a resumed run's weights) and one after each update, each complete.
    fresh, _ = load_model(world / "policy")
    shapes = {n: p.shape for n, p in fresh.named_parameters()}
    assert len(llm.syncs) == 3
    for synced in llm.syncs:
        assert {n: t.shape for n, t in synced.items()} == shapes
    _assert_sync_matches(llm.syncs[0], dict(fresh.named_parameters()))
    for step in (1, 2):
        _assert_sync_matches(llm.syncs[step], _weights(checkpoint_dir(run, step) / "model"))
    moved = [n for n in shapes if not torch.equal(llm.syncs[1][n], llm.syncs[0][n])]
    assert moved, "step 1 changed no synced weight: the comparison above proves nothing"
    assert any(not torch.equal(llm.syncs[2][n], llm.syncs[1][n]) for n in shapes)


def test_a_tensor_parallel_engine_in_one_process_is_synced_through_vllms_transport(
    world: Path, tmp_path: Path, fake_vllm
) -> None:
    # With tensor_parallel_size > 1 vLLM's engine core runs in its own process: every loader
    # crosses vLLM's msgspec transport and reaches two workers (a dataclass loader arrived as a
    # dict and failed the first sync).
    run = tmp_path / "run"
    train.main(_recipe(world, run, steps=1, **VLLM, **{"policy.tensor_parallel_size": 2}))

    [llm] = fake_vllm
    assert llm.kwargs["tensor_parallel_size"] == 2
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ  # left to vLLM: out of process
    assert len(llm.syncs) == 2  # setup, step 1
    _assert_sync_matches(llm.syncs[1], _weights(checkpoint_dir(run, 1) / "model"))
    assert all(t.device.type == "cpu" for t in llm.syncs[1].values())


# --------------------------------------------------------------------------- LoRA


def test_lora_syncs_the_merged_weights_under_base_names(world: Path, tmp_path: Path, fake_vllm) -> None:
    run = tmp_path / "run"
    lora = {
        "lora.r": 4,
        "lora.target_modules": "[q_proj,v_proj]",
        "lora.merge_on_save": "true",
        "optim.lr": 1e-2,
    }
    train.main(_recipe(world, run, **VLLM, **lora))

    [llm] = fake_vllm
    fresh, _ = load_model(world / "policy")
    assert len(llm.syncs) == 3
    assert all(set(synced) == {n for n, _ in fresh.named_parameters()} for synced in llm.syncs)
    # The checkpoint's merged model: base + B A alpha / r, merged afresh from the base.
    for step in (1, 2):
        _assert_sync_matches(llm.syncs[step], _weights(checkpoint_dir(run, step) / "model"))
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(llm.syncs[1][q_proj], llm.syncs[0][q_proj]), "the adapter was not merged in"
    untouched = "model.layers.0.mlp.up_proj.weight"  # no adapter: the base weight
    assert torch.equal(llm.syncs[2][untouched], dict(fresh.named_parameters())[untouched])


# --------------------------------------------------------------------------- sleep mode


def test_sleep_mode_frees_the_engine_for_the_update_and_wakes_it_in_order(
    world: Path,
    tmp_path: Path,
    fake_vllm,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_logprobs = update_module.logprobs_in_micro_batches

    def recording_logprobs(*args: Any, **kwargs: Any) -> torch.Tensor:
        # The reference model's pass (kl_coef > 0): the update phase has begun.
        fake_vllm[0].events.append(("trainer_forward",))
        return real_logprobs(*args, **kwargs)

    monkeypatch.setattr(update_module, "logprobs_in_micro_batches", recording_logprobs)
    train.main(_recipe(world, tmp_path / "run", **VLLM, **{"policy.enable_sleep_mode": "true"}))

    [llm] = fake_vllm
    assert llm.kwargs["enable_sleep_mode"] is True
    update = [
        ("sleep", 2),  # right after the rollout, before the trainer's passes; level 2: the sync rewrites every weight
        ("trainer_forward",),
        ("wake_up", ["weights"]),  # the sync wakes the weights only
        ("apply_model",),
        ("reset_prefix_cache",),
    ]
    assert _collapsed(llm.events) == [
        ("apply_model",),  # setup sync, engine awake
        ("reset_prefix_cache",),
        ("generate",),
        *update,
        ("wake_up", ["kv_cache"]),  # the next rollout takes the KV cache back
        ("generate",),
        *update,
    ]


# --------------------------------------------------------------------------- refused


def test_a_served_policy_is_refused_saying_what_works(world: Path, tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"policy.kind='openai'") as error:
        _recipe(world, tmp_path / "run", **{"policy.kind": "openai", "policy.base_urls": "[http://127.0.0.1:9]"})
    message = str(error.value)
    assert "policy.kind=hf" in message and "policy.kind=vllm" in message
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_a_vllm_context_shorter_than_a_trajectory_is_refused(world: Path, tmp_path: Path) -> None:
    with pytest.raises(
        RecipeError,
        match=r"policy.max_model_len=128 is below rollout.max_context_tokens=256",
    ):
        _recipe(world, tmp_path / "run", **VLLM, **{"policy.max_model_len": 128})
    enough = _recipe(world, tmp_path / "run", **VLLM, **{"policy.max_model_len": 256})
    assert enough.policy.max_model_len == 256
    hf = _recipe(world, tmp_path / "run", **{"policy.max_model_len": 128})
    assert hf.policy.kind == "hf"  # the in-process HF engine has no such limit


def test_tensor_parallelism_is_refused_with_several_processes(
    world: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(session, "init_distributed", lambda *args, **kwargs: (0, 2))
    recipe = _recipe(world, tmp_path / "run", **VLLM, **{"policy.tensor_parallel_size": 2})
    with pytest.raises(RecipeError, match=r"policy.tensor_parallel_size=2 with 2 processes"):
        train.main(recipe)
