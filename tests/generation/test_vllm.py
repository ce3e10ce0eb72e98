"""VLLMEngine on CPU: the missing-vLLM error, the output mapping, the engine's bookkeeping against
a fake `vllm` module shaped like vLLM's documented API, and the weight-sync helpers on real tiny
models (plain, PEFT LoRA, DeepSpeed ZeRO-3 in one gloo process).

What these tests cannot show: that real vLLM behaves as its documentation says. That needs a GPU
(benchmarks/gpu_check.sh, docs/scaling.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import socket
import subprocess
import sys
import textwrap
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from simsearch.config import EvalRecipe, load_recipe
from simsearch.errors import NonFiniteError, RecipeError, SimsearchError
from simsearch.factory.build import build_generation_engine
from simsearch.generation.recipe import GenerationConfig, ModelConfig
from simsearch.generation.vllm import (
    VLLMEngine,
    VLLMNotInstalledError,
    VLLMOutputError,
    VLLMWeightTransferError,
    _LoadWeights,
    completion_from_output,
    completions_from_request_outputs,
    first_non_finite,
    named_params_for_vllm,
    peft_named_params_for_vllm,
    prompt_seeds,
    sampling_kwargs,
    trained_params_for_vllm,
    vllm_param_name,
    zero3_named_params_for_vllm,
)
from simsearch.models import build_tiny_model, train_tokenizer
from simsearch.types import Completion, SamplingParams

ROOT = Path(__file__).resolve().parents[2]
MISSING = "vLLM is not installed: pip install 'simsearch[vllm]' (needs a CUDA GPU)"
EOS = 1


# --------------------------------------------------------------------------- vLLM missing


def test_missing_vllm_raises_an_import_error_saying_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(VLLMNotInstalledError) as info:
        VLLMEngine("models/tiny", gpu_memory_utilization=0.5, tensor_parallel_size=1)
    assert isinstance(info.value, ImportError)
    assert str(info.value) == MISSING


def test_build_generation_engine_kind_vllm_without_vllm_is_the_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    cfg = GenerationConfig(kind="vllm", model=ModelConfig(path="models/tiny"))
    with pytest.raises(VLLMNotInstalledError, match=r"pip install 'simsearch\[vllm\]'"):
        build_generation_engine(cfg)
    # A shipped recipe whose policy runs on vLLM fails the same way, at setup.
    recipe = load_recipe(EvalRecipe, ROOT / "recipes/eval/zerosearch_google_qwen2.5-3b.yaml")
    assert recipe.policy.kind == "vllm"
    with pytest.raises(VLLMNotInstalledError, match="needs a CUDA GPU"):
        build_generation_engine(recipe.policy)


# --------------------------------------------------------------------------- vLLM's bounds in recipe checks

EVAL_ON_VLLM = ROOT / "recipes/eval/zerosearch_google_qwen2.5-3b.yaml"  # policy.kind: vllm


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("sampling.temperature=2.5", r"sampling.temperature=2.5 must be 0 \(greedy\) or lie in \[0.01, 2\]"),
        ("sampling.temperature=0.005", r"sampling.temperature=0.005 must be 0"),
        ("sampling.temperature=-1", r"sampling.temperature=-1.0 must be 0"),
        ("sampling.top_p=0", r"sampling.top_p=0.0 must lie in"),
        ("sampling.max_new_tokens=0", r"sampling.max_new_tokens=0 must be > 0"),
        ("policy.gpu_memory_utilization=1.5", r"policy.gpu_memory_utilization=1.5 must lie in \(0, 1\]"),
        ("policy.tensor_parallel_size=0", r"policy.tensor_parallel_size=0 must be > 0"),
        ("policy.max_model_len=-1", r"policy.max_model_len=-1 must be >= 0"),
    ],
)
def test_a_vllm_recipe_outside_vllms_bounds_is_refused_when_loaded(override, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe(EvalRecipe, EVAL_ON_VLLM, [override])


@pytest.mark.parametrize("temperature", [-0.5, 0.0, 0.005, 0.01, 0.7, 2.0, 2.01, float("nan")])
def test_recipe_temperature_bounds_are_exactly_what_vllm_samples_unchanged(temperature):
    try:
        params = FakeSamplingParams(**sampling_kwargs(SamplingParams(temperature=temperature), seed=None))
        vllm_unchanged = params.values["temperature"] == temperature
    except VLLMValidationError:
        vllm_unchanged = False
    try:
        load_recipe(EvalRecipe, EVAL_ON_VLLM, [f"sampling.temperature={temperature}"])
        recipe_ok = True
    except RecipeError:
        recipe_ok = False
    assert recipe_ok == vllm_unchanged
    assert recipe_ok == (temperature in (0.0, 0.01, 0.7, 2.0))  # hand-listed


def test_the_fake_sampling_params_refuses_what_vllm_refuses():
    ok = sampling_kwargs(SamplingParams(temperature=0.7, n=4, stop=["</search>"], logprobs=True), seed=3)
    assert FakeSamplingParams(**ok).values["logprobs"] == 0
    refused = {
        "temperature above 2": {**ok, "temperature": 2.5},
        "empty stop string": {**ok, "stop": ["</search>", ""]},
        "greedy with n > 1": {**ok, "temperature": 0.0},
        "top_p of 0": {**ok, "top_p": 0.0},
        "no new token": {**ok, "max_tokens": 0},
        "top_k below -1": {**ok, "top_k": -2},
    }
    for what, kwargs in refused.items():
        with pytest.raises(VLLMValidationError):
            FakeSamplingParams(**kwargs)
            pytest.fail(what)
    with pytest.raises(TypeError, match="Unexpected keyword argument 'max_new_tokens'"):
        FakeSamplingParams(max_new_tokens=3)
    # Greedy resets the filters, as vLLM does.
    greedy = FakeSamplingParams(**{**ok, "temperature": 0.0, "n": 1, "top_p": 0.5}).values
    assert (greedy["top_p"], greedy["top_k"], greedy["min_p"]) == (1.0, 0, 0.0)


# --------------------------------------------------------------------------- fakes of vLLM's objects


@dataclass
class Logprob:
    logprob: float


@dataclass
class Out:
    """Shaped like vLLM's CompletionOutput (the fields we read)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None = None
    logprobs: list[dict[int, Logprob]] | None = None


@dataclass
class Req:
    """Shaped like vLLM's RequestOutput."""

    outputs: list[Out]


def token_text(token_id: int) -> str:
    return "<eos>" if token_id == EOS else chr(token_id)


def complete(out: Out, want_logprobs: bool = False) -> Completion:
    return completion_from_output(out, want_logprobs=want_logprobs, token_text=token_text)


# --------------------------------------------------------------------------- pure mapping


def test_sampling_kwargs_follow_our_contract():
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=33, stop=["</search>"], n=3, logprobs=True)
    assert sampling_kwargs(params, seed=11) == {
        "n": 3,
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 33,
        "stop": ["</search>"],
        "include_stop_str_in_output": True,
        "seed": 11,
        "logprobs": 0,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
    }
    plain = sampling_kwargs(SamplingParams(), seed=None)
    # The sampled token's logprob is asked for even when not wanted: non-finite logits show in it.
    assert plain["stop"] is None and plain["logprobs"] == 0 and plain["seed"] is None


def test_prompt_seeds_are_reproducible_distinct_and_leave_room_for_sample_offsets():
    assert prompt_seeds(None, 3) == [None, None, None]
    seeds = prompt_seeds(7, 50)
    assert seeds == prompt_seeds(7, 50)
    assert len(set(seeds)) == 50
    assert all(0 <= s < 2**62 for s in seeds)
    assert prompt_seeds(8, 50) != seeds
    # The first prompts' seeds do not depend on how many prompts share the call.
    assert prompt_seeds(7, 3) == seeds[:3]


def test_a_matched_stop_string_stays_in_the_text_and_every_token_id_is_kept():
    out = Out(0, "go</search>", [103, 104, 105], "stop", stop_reason="</search>")
    assert complete(out) == Completion([103, 104, 105], "go</search>", "stop", "</search>", None)


def test_an_end_token_is_kept_in_the_ids_and_taken_out_of_the_text():
    eos = complete(Out(0, "ab<eos>", [97, 98, EOS], "stop", stop_reason=None))
    assert eos == Completion([97, 98, EOS], "ab", "stop", None, None)
    # A stop token id (vLLM reports it as an int, e.g. a chat model's end-of-turn token).
    stop_token = complete(Out(0, "ab<eos>", [97, 98, EOS], "stop", stop_reason=EOS))
    assert stop_token == Completion([97, 98, EOS], "ab", "stop", None, None)
    # A tokenizer that skipped the token's text: nothing to take off.
    skipped = complete(Out(0, "ab", [97, 98, EOS], "stop", stop_reason=None))
    assert skipped.text == "ab"


def test_length_keeps_text_and_ids_as_they_are():
    out = complete(Out(0, "ab<eos>", [97, 98, EOS], "length"))
    assert out == Completion([97, 98, EOS], "ab<eos>", "length", None, None)


def test_logprobs_are_the_sampled_tokens_not_the_most_likely_ones():
    steps = [
        {97: Logprob(-2.5), 120: Logprob(-0.1)},  # sampled 97, although 120 was likelier
        {98: Logprob(-0.75)},
        {EOS: Logprob(-0.125)},
    ]
    out = complete(Out(0, "ab<eos>", [97, 98, EOS], "stop", logprobs=steps), want_logprobs=True)
    assert out.logprobs == [-2.5, -0.75, -0.125]


def test_outputs_that_break_the_contract_are_clear_errors():
    with pytest.raises(VLLMOutputError, match="finish_reason='abort'"):
        complete(Out(0, "a", [97], "abort"))
    with pytest.raises(VLLMOutputError, match="include_stop_str_in_output"):
        complete(Out(0, "go", [103, 104], "stop", stop_reason="</search>"))
    with pytest.raises(VLLMOutputError, match="logprobs for None of 1"):
        complete(Out(0, "a", [97], "length"), want_logprobs=True)
    with pytest.raises(VLLMOutputError, match="logprobs for 1 of 2"):
        complete(Out(0, "ab", [97, 98], "length", logprobs=[{97: Logprob(-1.0)}]), want_logprobs=True)


def test_request_outputs_flatten_prompt_major_sorted_by_sample_index():
    outputs = [
        Req([Out(1, "b", [98], "length"), Out(0, "a", [97], "length")]),
        Req([Out(0, "c", [99], "length"), Out(1, "d", [100], "length")]),
    ]
    flat = completions_from_request_outputs(outputs, n=2, want_logprobs=False, token_text=token_text)
    assert [c.text for c in flat] == ["a", "b", "c", "d"]
    with pytest.raises(VLLMOutputError, match="samples \\[0\\] for prompt 0"):
        completions_from_request_outputs(
            [Req([Out(0, "a", [97], "length")])], n=2, want_logprobs=False, token_text=token_text
        )


# --------------------------------------------------------------------------- the engine on a fake vllm


class FakeTokenizer:
    def __call__(self, texts: list[str]) -> dict[str, list[list[int]]]:
        return {"input_ids": [[ord(c) for c in t] for t in texts]}

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        assert skip_special_tokens is False
        return "".join(token_text(i) for i in ids)


class VLLMValidationError(Exception):
    """vLLM's own error for invalid request values (not a ValueError)."""


class FakeSamplingParams:
    """vLLM's `SamplingParams`, for the keywords simsearch sends, validated as vLLM 0.33 does.

    The checks and adjustments follow `SamplingParams.__post_init__`, `_verify_args` and
    `_verify_greedy_sampling` (vllm/sampling_params.py, 0.32 and 0.33 alike). `kwargs` keeps what
    the caller passed, `values` what vLLM would sample with.
    """

    DEFAULTS: ClassVar[dict[str, Any]] = {
        "n": 1,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "seed": None,
        "stop": None,
        "include_stop_str_in_output": False,
        "max_tokens": 16,
        "logprobs": None,
        "detokenize": True,
        "skip_special_tokens": True,
        "spaces_between_special_tokens": True,
    }

    def __init__(self, **kwargs: Any) -> None:
        for name in kwargs:
            if name not in self.DEFAULTS:  # a msgspec.Struct's error for an unknown keyword
                raise TypeError(f"Unexpected keyword argument {name!r}")
        self.kwargs = kwargs
        v = self.values = {**self.DEFAULTS, **kwargs}
        if 0 < v["temperature"] < 1e-2:
            v["temperature"] = 1e-2  # vLLM raises tiny temperatures (with a warning)
        v["stop"] = [] if v["stop"] is None else [v["stop"]] if isinstance(v["stop"], str) else v["stop"]
        if v["logprobs"] is True:
            v["logprobs"] = 1
        self._verify(v)
        if v["temperature"] < 1e-5:  # greedy
            v.update(top_p=1.0, top_k=0, min_p=0.0)
            if v["n"] > 1:
                raise VLLMValidationError(f"n must be 1 when using greedy sampling, got {v['n']}.")

    @staticmethod
    def _verify(v: dict[str, Any]) -> None:
        problems = [
            (not isinstance(v["n"], int) or not 1 <= v["n"] <= 16384, "n must be in [1, 16384]"),
            (not -2.0 <= v["presence_penalty"] <= 2.0, "presence_penalty must be in [-2, 2]"),
            (not -2.0 <= v["frequency_penalty"] <= 2.0, "frequency_penalty must be in [-2, 2]"),
            (
                not (math.isfinite(v["repetition_penalty"]) and v["repetition_penalty"] > 0),
                "repetition_penalty must be a finite number greater than zero",
            ),
            (not math.isfinite(v["temperature"]), "temperature must be a finite number"),
            (v["temperature"] < 0.0, "temperature must be non-negative"),
            (v["temperature"] > 2.0, "temperature must be in [0, 2]"),
            (not 0.0 < v["top_p"] <= 1.0, "top_p must be in (0, 1]"),
            (not isinstance(v["top_k"], int) or v["top_k"] < -1, "top_k must be 0 (disable), or at least 1"),
            (not 0.0 <= v["min_p"] <= 1.0, "min_p must be in [0, 1]"),
            (v["max_tokens"] is not None and v["max_tokens"] < 1, "max_tokens must be at least 1"),
            (
                v["logprobs"] is not None and v["logprobs"] != -1 and v["logprobs"] < 0,
                "logprobs must be non-negative or -1",
            ),
            (any(not stop for stop in v["stop"]), "stop cannot contain an empty string."),
            (bool(v["stop"]) and not v["detokenize"], "stop strings are only supported when detokenize is True."),
        ]
        for failed, message in problems:
            if failed:
                raise VLLMValidationError(message)


def vllm_engine_core_receives(obj: Any) -> Any:
    """What vLLM's engine-core process receives for `obj` sent as a utility-call argument.

    Emulates vLLM 0.32-0.33 (`v1/serial_utils.py`): `MsgpackEncoder` lets msgspec encode the
    types msgspec supports natively (None, bool, int, float, str, bytes, lists, tuples, dicts,
    dataclasses as maps) and hands anything else to its `enc_hook`: a tensor becomes (dtype,
    shape, bytes); with VLLM_ALLOW_INSECURE_SERIALIZATION=1 any other object is pickled
    (cloudpickled if a plain function), otherwise it is a TypeError. The engine core decodes a utility
    call's arguments without a type, so a map arrives as a dict, a tuple as a list.
    """
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return obj
    if isinstance(obj, (list, tuple)):
        return [vllm_engine_core_receives(x) for x in obj]
    if isinstance(obj, dict):
        return {k: vllm_engine_core_receives(x) for k, x in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: vllm_engine_core_receives(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, torch.Tensor):
        return [str(obj.dtype).removeprefix("torch."), list(obj.shape), obj.numpy().tobytes()]
    if os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION") != "1":
        raise TypeError(f"Object of type {type(obj)} is not serializable")
    # vLLM cloudpickles plain functions; pickle does the same for the module-level ones used here.
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def deliver_to_workers(func: Any, llm_kwargs: dict[str, Any]) -> list[Any]:
    """The copy of an `apply_model` function each vLLM worker runs, as vLLM 0.32-0.33 routes it.

    `LLM.apply_model(f)` is `collective_rpc("apply_model", args=(f,))`. Out of process
    (VLLM_ENABLE_V1_MULTIPROCESSING unset or 1; vLLM sets it to 0 for the external launcher) the
    arguments cross to the engine core as `vllm_engine_core_receives` shows. With tensor
    parallelism and vLLM's own worker processes, the multiprocessing executor then pickles them
    to each worker through its shared-memory queue; one worker in process gets them as they are.
    """
    launcher = llm_kwargs.get("distributed_executor_backend") == "external_launcher"
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0" and not launcher:
        func = vllm_engine_core_receives(func)
    workers = 1 if launcher else llm_kwargs.get("tensor_parallel_size", 1)
    if workers == 1:
        return [func]
    return [pickle.loads(pickle.dumps(func, protocol=pickle.HIGHEST_PROTOCOL)) for _ in range(workers)]


@dataclass
class FakeModel:
    loaded: list[tuple[str, torch.Tensor]] = field(default_factory=list)

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        self.loaded.extend(weights)


class FakeLLM:
    """Records every call; generate answers sample j of a prompt with [100 + j, EOS].

    `apply_model` delivers its function to one `FakeModel` per tensor-parallel worker as vLLM
    would (`deliver_to_workers`); `model` is worker 0's.
    """

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.calls: list[tuple[Any, ...]] = []
        self.workers = [FakeModel() for _ in range(kwargs["tensor_parallel_size"])]
        self.model = self.workers[0]
        self.reset_result: bool | None = True
        self.non_finite: dict[tuple[int, int], int] = {}  # (prompt, sample) -> generated token with a nan logprob

    def get_tokenizer(self) -> FakeTokenizer:
        return FakeTokenizer()

    def generate(self, prompts: list[dict], sampling_params: list[FakeSamplingParams], use_tqdm: bool) -> list[Req]:
        self.calls.append(("generate", prompts, [p.kwargs for p in sampling_params], use_tqdm))
        results = []
        for i, params in enumerate(sampling_params):
            kw = params.kwargs
            samples = []
            for j in reversed(range(kw["n"])):  # out of order on purpose
                ids = [100 + j, EOS]
                steps = None if kw["logprobs"] is None else [{100 + j: Logprob(-0.5 - j)}, {EOS: Logprob(-0.25)}]
                if steps is not None and (i, j) in self.non_finite:  # raw logprobs of nan logits are nan
                    k = self.non_finite[(i, j)]
                    steps[k] = {ids[k]: Logprob(float("nan"))}
                samples.append(Out(j, chr(100 + j) + "<eos>", ids, "stop", None, steps))
            results.append(Req(samples))
        return results

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tags))

    def apply_model(self, func: Any) -> list[Any]:
        self.calls.append(("apply_model",))
        copies = deliver_to_workers(func, self.kwargs)
        return [copy(worker) for copy, worker in zip(copies, self.workers)]

    def reset_prefix_cache(self) -> bool | None:
        self.calls.append(("reset_prefix_cache",))
        return self.reset_result


def install_fake_vllm(monkeypatch: pytest.MonkeyPatch, llm: type, sampling_params: type) -> types.ModuleType:
    """Puts a `vllm` module with the given `LLM` and `SamplingParams` classes in sys.modules."""
    vllm = types.ModuleType("vllm")
    vllm.LLM = llm
    vllm.SamplingParams = sampling_params
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda **kwargs: dict(kwargs)  # a TypedDict in vLLM
    vllm.inputs = inputs
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    # The engine sets these with setdefault; restore the environment afterwards.
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    return vllm


@pytest.fixture
def fake_vllm(monkeypatch):
    return install_fake_vllm(monkeypatch, FakeLLM, FakeSamplingParams)


def make_engine(**kwargs: Any) -> VLLMEngine:
    kwargs.setdefault("gpu_memory_utilization", 0.4)
    kwargs.setdefault("tensor_parallel_size", 1)
    return VLLMEngine("models/policy", **kwargs)


def test_engine_passes_its_settings_to_vllm_and_sets_the_in_process_environment(fake_vllm, monkeypatch):
    import os

    engine = make_engine(enable_sleep_mode=True, dtype="bfloat16", seed=3, max_model_len=2048)
    assert engine.llm.kwargs == {
        "model": "models/policy",
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": 0.4,
        "dtype": "bfloat16",
        "seed": 3,
        "max_model_len": 2048,
        "enable_prefix_caching": True,
        "enable_sleep_mode": True,
        "distributed_executor_backend": None,
        "max_num_batched_tokens": None,
        "max_num_seqs": None,
        "logprobs_mode": "raw_logprobs",
    }
    assert isinstance(engine.tokenizer, FakeTokenizer)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
    # A value the user exported wins; tensor parallelism keeps vLLM's worker processes.
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "0")
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    make_engine(tensor_parallel_size=2)
    assert os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
    # One engine per launcher process: in-process again, whatever the tensor parallelism.
    launched = make_engine(tensor_parallel_size=2, distributed_executor_backend="external_launcher")
    assert launched.llm.kwargs["distributed_executor_backend"] == "external_launcher"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=1.5"):
        make_engine(gpu_memory_utilization=1.5)


def test_build_generation_engine_kind_vllm_builds_the_engine_from_the_config(fake_vllm):
    cfg = GenerationConfig(
        kind="vllm", model=ModelConfig(path="models/tiny"), gpu_memory_utilization=0.25, tensor_parallel_size=2
    )
    engine, tokenizer, model = build_generation_engine(cfg)
    assert isinstance(engine, VLLMEngine) and model is None and tokenizer is engine.tokenizer
    assert engine.llm.kwargs["gpu_memory_utilization"] == 0.25
    assert engine.llm.kwargs["tensor_parallel_size"] == 2


def test_generate_sends_token_prompts_with_per_prompt_seeds_and_maps_the_outputs(fake_vllm):
    engine = make_engine()
    params = SamplingParams(max_new_tokens=5, n=2, seed=9, logprobs=True, stop=["</search>"])
    out = engine.generate([[5, 6], [7]], params)
    name, prompts, per_prompt, use_tqdm = engine.llm.calls[-1]
    assert name == "generate" and use_tqdm is False
    assert prompts == [{"prompt_token_ids": [5, 6]}, {"prompt_token_ids": [7]}]
    assert [kw["seed"] for kw in per_prompt] == prompt_seeds(9, 2)
    assert all(kw == sampling_kwargs(params, seed=kw["seed"]) for kw in per_prompt)
    # prompt-major, samples in index order, eos kept in ids and out of the text
    assert [(c.token_ids, c.text, c.finish_reason, c.stop) for c in out] == [
        ([100, EOS], "d", "stop", None),
        ([101, EOS], "e", "stop", None),
    ] * 2
    assert [c.logprobs for c in out[:2]] == [[-0.5, -0.25], [-1.5, -0.25]]


def test_generate_tokenizes_strings_and_rejects_empty_prompts(fake_vllm):
    engine = make_engine()
    engine.generate(["hi"], SamplingParams())
    assert engine.llm.calls[-1][1] == [{"prompt_token_ids": [ord("h"), ord("i")]}]
    assert engine.generate([], SamplingParams()) == []
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[3], []], SamplingParams())


def test_sync_weights_loads_every_pair_in_the_worker_then_resets_the_prefix_cache(fake_vllm):
    engine = make_engine()
    pairs = [("model.embed_tokens.weight", torch.ones(2, 2)), ("lm_head.weight", torch.zeros(2, 2))]
    assert engine.sync_weights(iter(pairs)) == 2
    assert [name for name, _ in engine.llm.model.loaded] == ["model.embed_tokens.weight", "lm_head.weight"]
    assert engine.llm.model.loaded[0][1] is pairs[0][1]  # by reference, no copy
    assert [c[0] for c in engine.llm.calls] == ["apply_model", "apply_model", "reset_prefix_cache"]
    with pytest.raises(ValueError, match="no parameters"):
        engine.sync_weights([])
    engine.llm.reset_result = False
    with pytest.raises(RuntimeError, match="prefix cache"):
        engine.sync_weights(pairs)


@dataclass
class DataclassLoader:
    """The loader simsearch sent before: a dataclass, which vLLM's msgspec encodes as a map."""

    weights: list[tuple[str, torch.Tensor]]

    def __call__(self, model: FakeModel) -> None:
        model.load_weights(self.weights)


def test_vllm_transport_turns_a_dataclass_into_a_map_and_keeps_a_plain_object(monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    weights = [("w", torch.tensor([1.5, -2.0]))]
    # A dataclass is encoded field by field, and a tensor as (dtype, shape, bytes): what the
    # first sync of a tensor-parallel engine used to receive.
    received = vllm_engine_core_receives(DataclassLoader(weights))
    assert received == {"weights": [["w", ["float32", [2], torch.tensor([1.5, -2.0]).numpy().tobytes()]]]}
    with pytest.raises(TypeError, match="'dict' object is not callable"):
        received(FakeModel())
    loader = vllm_engine_core_receives(_LoadWeights(weights))
    model = FakeModel()
    assert loader(model) is None  # nothing travels back from the workers
    assert model.loaded[0][0] == "w" and model.loaded[0][1].tolist() == [1.5, -2.0]
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "0")
    with pytest.raises(TypeError, match="not serializable"):
        vllm_engine_core_receives(_LoadWeights(weights))


def test_tensor_parallel_sync_out_of_process_reaches_every_worker_with_cpu_copies(fake_vllm):
    engine = make_engine(tensor_parallel_size=2)  # vLLM's engine core in its own process
    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") is None
    pairs = [("model.embed_tokens.weight", torch.ones(2, 2)), ("lm_head.weight", torch.zeros(2, 2))]
    assert engine.sync_weights(pairs) == 2
    for worker in engine.llm.workers:
        assert [name for name, _ in worker.loaded] == ["model.embed_tokens.weight", "lm_head.weight"]
        assert worker.loaded[0][1] is not pairs[0][1]  # a copy crossed the process boundary
        assert torch.equal(worker.loaded[0][1], pairs[0][1]) and worker.loaded[0][1].device.type == "cpu"
    # The same loader as a dataclass fails in the first sync, as it did on vLLM.
    with pytest.raises(TypeError, match="'dict' object is not callable"):
        engine.llm.apply_model(DataclassLoader(pairs))


def test_out_of_process_sync_refuses_without_pickles_and_says_which_variable(fake_vllm, monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "0")
    engine = make_engine(tensor_parallel_size=2)
    with pytest.raises(RuntimeError, match="VLLM_ALLOW_INSECURE_SERIALIZATION=1"):
        engine.sync_weights([("w", torch.ones(1))])
    assert not [c for c in engine.llm.calls if c[0] == "apply_model"]
    # One engine per launcher process runs in process: no pickle needed.
    launched = make_engine(tensor_parallel_size=2, distributed_executor_backend="external_launcher")
    assert launched.sync_weights([("w", torch.ones(1))]) == 1


def test_colocated_cycle_wakes_weights_for_the_sync_and_the_kv_cache_for_generation(fake_vllm):
    engine = make_engine(enable_sleep_mode=True)
    engine.sleep()  # level 2 by default: the sync rewrites every weight
    engine.sync_weights([("w", torch.ones(1))])
    engine.generate([[5]], SamplingParams())
    engine.generate([[5]], SamplingParams())  # awake: no wake_up call
    assert [c[:2] for c in engine.llm.calls] == [
        ("sleep", 2),
        ("wake_up", ["weights"]),
        ("apply_model",),
        ("reset_prefix_cache",),
        ("wake_up", ["kv_cache"]),
        ("generate", [{"prompt_token_ids": [5]}]),
        ("generate", [{"prompt_token_ids": [5]}]),
    ]


def test_level_1_sleep_wakes_everything_for_generation(fake_vllm):
    engine = make_engine(enable_sleep_mode=True)
    engine.sleep(level=1)
    engine.generate([[5]], SamplingParams())
    assert engine.llm.calls[1] == ("wake_up", ["kv_cache", "weights"])
    engine.wake_up()  # nothing asleep: no call
    assert len(engine.llm.calls) == 3


def test_level_2_sleep_refuses_to_generate_until_the_weights_are_synced(fake_vllm):
    engine = make_engine(enable_sleep_mode=True)
    engine.sleep(level=2)
    with pytest.raises(RuntimeError, match="call sync_weights"):
        engine.generate([[5]], SamplingParams())
    engine.sync_weights([("w", torch.ones(1))])
    assert len(engine.generate([[5]], SamplingParams())) == 1


def test_sleep_needs_sleep_mode_and_valid_arguments(fake_vllm):
    with pytest.raises(RuntimeError, match="enable_sleep_mode=True"):
        make_engine().sleep()
    engine = make_engine(enable_sleep_mode=True)
    with pytest.raises(ValueError, match="level=3"):
        engine.sleep(level=3)
    with pytest.raises(ValueError, match="wake_up tags"):
        engine.wake_up(["optimizer"])


# --------------------------------------------------------------------------- risks of the GPU path (issue 56)


def test_pytorchs_cuda_cache_is_emptied_before_every_wake_up(fake_vllm, monkeypatch):
    engine = make_engine(enable_sleep_mode=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: engine.llm.calls.append(("empty_cache",)))
    engine.sleep()
    engine.sync_weights([("w", torch.ones(1))])  # wakes the weights
    engine.generate([[5]], SamplingParams())  # wakes the KV cache
    engine.sleep(level=1)
    engine.wake_up()
    assert [c[0] for c in engine.llm.calls if c[0] in ("empty_cache", "wake_up")] == ["empty_cache", "wake_up"] * 3
    # Without CUDA nothing is called (a CPU-only torch).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    engine.sleep()
    engine.sync_weights([("w", torch.ones(1))])
    assert engine.llm.calls[-4:-2] == [("sleep", 2), ("wake_up", ["weights"])]


def test_the_recipe_bounds_vllms_scheduler_so_profiling_leaves_a_kv_cache(fake_vllm):
    cfg = GenerationConfig(kind="vllm", model=ModelConfig(path="models/tiny"), gpu_memory_utilization=0.3)
    engine, _, _ = build_generation_engine(cfg)
    assert engine.llm.kwargs["max_num_batched_tokens"] == 4096  # TRL's figure
    assert engine.llm.kwargs["max_num_seqs"] == 256
    assert engine.sleep_level == 2
    # 0 leaves it to vLLM (None: its own default).
    own, _, _ = build_generation_engine(dataclasses.replace(cfg, max_num_batched_tokens=0, max_num_seqs=0))
    assert own.llm.kwargs["max_num_batched_tokens"] is None and own.llm.kwargs["max_num_seqs"] is None
    for wrong, message in (
        (dict(max_num_batched_tokens=-1), r"policy.max_num_batched_tokens=-1 must be >= 0"),
        (dict(max_num_seqs=-2), r"policy.max_num_seqs=-2 must be >= 0"),
        (dict(max_num_batched_tokens=128, max_num_seqs=256), r"max_num_batched_tokens=128 must be >= policy.max_num"),
        (dict(sleep_level=3), r"policy.sleep_level=3 must be 1"),
    ):
        with pytest.raises(RecipeError, match=message):
            dataclasses.replace(cfg, **wrong).check("policy")
    with pytest.raises(ValueError, match="max_num_seqs=0 must be >= 1"):
        make_engine(max_num_seqs=0)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("policy.max_num_batched_tokens=-5", r"policy.max_num_batched_tokens=-5 must be >= 0"),
        ("policy.max_num_seqs=8192", r"policy.max_num_batched_tokens=4096 must be >= policy.max_num_seqs=8192"),
        ("policy.sleep_level=0", r"policy.sleep_level=0 must be 1"),
    ],
)
def test_a_vllm_recipe_with_bad_scheduler_bounds_is_refused_when_loaded(override, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe(EvalRecipe, EVAL_ON_VLLM, [override])


class OnDevice(torch.Tensor):
    """Stands for a CUDA tensor on a CPU machine: `.to("cpu")` gives a plain tensor, pickling keeps the type."""

    def to(self, *args: Any, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        return self.as_subclass(torch.Tensor).to(*args, **kwargs)


def test_tensor_parallel_workers_in_other_processes_get_cpu_copies_even_with_multiprocessing_off(
    fake_vllm, monkeypatch
):
    # VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps vLLM's engine core here, but with tensor parallelism
    # and no launcher its executor still runs each worker in a process of its own.
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    engine = make_engine(tensor_parallel_size=2)
    assert engine.engine_core_in_process and not engine.in_process
    weight = torch.arange(4.0).as_subclass(OnDevice)
    assert engine.sync_weights([("model.embed_tokens.weight", weight)]) == 1
    for worker in engine.llm.workers:
        ((_, got),) = worker.loaded
        assert type(got) is torch.Tensor and torch.equal(got, torch.arange(4.0))  # never the device tensor
    # One engine per launcher process is in process whatever the tensor parallelism: by reference.
    launched = make_engine(tensor_parallel_size=2, distributed_executor_backend="external_launcher")
    assert launched.in_process
    launched.sync_weights([("w", weight)])
    assert launched.llm.model.loaded[0][1] is weight


@pytest.mark.parametrize("multiprocessing", ["0", None])
def test_out_of_process_sync_sends_one_apply_model_per_chunk_not_per_tensor(fake_vllm, monkeypatch, multiprocessing):
    if multiprocessing is not None:
        monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", multiprocessing)
    engine = make_engine(tensor_parallel_size=2)
    pairs = [(f"model.layers.{i}.mlp.up_proj.weight", torch.full((4, 4), float(i))) for i in range(5)]
    assert engine.sync_weights(iter(pairs)) == 5
    assert [c[0] for c in engine.llm.calls] == ["apply_model", "reset_prefix_cache"]
    for worker in engine.llm.workers:
        assert [n for n, _ in worker.loaded] == [n for n, _ in pairs]
        assert all(torch.equal(got, sent) for (_, got), (_, sent) in zip(worker.loaded, pairs))
    # Bounded chunks: 64 bytes a tensor, chunks closed at 128 bytes -> 2 + 2 + 1.
    chunked = make_engine(tensor_parallel_size=2, sync_chunk_bytes=128)
    chunked.sync_weights(pairs)
    assert [c[0] for c in chunked.llm.calls] == ["apply_model"] * 3 + ["reset_prefix_cache"]
    assert [n for n, _ in chunked.llm.model.loaded] == [n for n, _ in pairs]


def test_a_refused_out_of_process_transfer_is_a_one_line_simsearch_error(fake_vllm, monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "0")
    engine = make_engine(tensor_parallel_size=2)
    with pytest.raises(VLLMWeightTransferError) as info:
        engine.sync_weights([("w", torch.ones(1))])
    assert isinstance(info.value, SimsearchError) and "\n" not in str(info.value)


def test_sleep_defaults_to_level_2_and_level_1_stays_available(fake_vllm):
    engine = make_engine(enable_sleep_mode=True)
    engine.sleep()
    assert engine.llm.calls[-1] == ("sleep", 2)
    with pytest.raises(RuntimeError, match="call sync_weights"):
        engine.generate([[5]], SamplingParams())
    kept = make_engine(enable_sleep_mode=True, sleep_level=1)
    kept.sleep()
    assert kept.llm.calls[-1] == ("sleep", 1)
    assert len(kept.generate([[5]], SamplingParams())) == 1  # level 1 kept the weights
    with pytest.raises(ValueError, match="sleep_level=3"):
        make_engine(sleep_level=3)


def test_non_finite_logits_under_vllm_raise_the_error_hf_raises(fake_vllm):
    engine = make_engine()
    engine.llm.non_finite = {(1, 0): 1, (1, 1): 0}
    params = SamplingParams(max_new_tokens=5, n=2, seed=0)  # logprobs not asked for: vLLM is asked anyway
    with pytest.raises(
        NonFiniteError, match=r"2 row\(s\) \(prompt 1 sample 0, prompt 1 sample 1\) at generated token 2"
    ) as info:
        engine.generate([[5], [6]], params)
    assert info.value.rows == [2, 3]
    assert "model.dtype=float32" in str(info.value) and "\n" not in str(info.value)
    engine.llm.non_finite = {}
    assert len(engine.generate([[5], [6]], params)) == 4


def test_first_non_finite_reads_the_sampled_tokens_logprob():
    steps = [{97: Logprob(-0.5), 98: Logprob(float("nan"))}, {98: Logprob(float("-inf"))}]
    assert first_non_finite(Out(0, "ab", [97, 98], "length", logprobs=steps)) == 1  # 98 at step 0 was not sampled
    assert first_non_finite(Out(0, "ab", [97, 98], "length", logprobs=None)) is None
    assert first_non_finite(Out(0, "a", [97], "length", logprobs=[{97: Logprob(float("inf"))}])) == 0


# --------------------------------------------------------------------------- weight names and merged LoRA


def test_vllm_param_name_maps_peft_names_onto_the_base_model():
    assert vllm_param_name("model.layers.0.mlp.up_proj.weight") == "model.layers.0.mlp.up_proj.weight"
    assert (
        vllm_param_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight")
        == "model.layers.0.self_attn.q_proj.weight"
    )
    assert vllm_param_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.bias") == (
        "model.layers.0.self_attn.q_proj.bias"
    )
    assert vllm_param_name("base_model.model.lm_head.modules_to_save.default.weight") == "lm_head.weight"
    for skipped in (
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight",
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight",
        "base_model.model.model.embed_tokens.lora_embedding_A.default",
        "base_model.model.lm_head.original_module.weight",
    ):
        assert vllm_param_name(skipped) is None


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(["the cat sat on the mat; <search> q </search>"] * 20, vocab_size=300)


def tiny(tokenizer):
    return build_tiny_model(tokenizer, hidden=16, layers=2, heads=2, kv_heads=1, ffn=32, seed=0)


def test_plain_and_zero3_helpers_name_every_parameter_once_tied_embeddings_included(tokenizer):
    model = tiny(tokenizer)
    plain = list(named_params_for_vllm(model))
    names = [n for n, _ in plain]
    assert names == [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names  # tied to the embedding: vLLM ties it again
    # Without ZeRO the gather is a no-op: the same pairs, one module at a time.
    zero3 = dict(zero3_named_params_for_vllm(model))
    assert sorted(zero3) == sorted(names)
    assert all(torch.equal(zero3[n], t) for n, t in plain)


def test_merged_lora_weights_are_w_plus_scaled_ba_under_base_names_then_unmerged(tokenizer):
    from peft import LoraConfig, get_peft_model

    base = tiny(tokenizer)
    original = {n: p.detach().clone() for n, p in base.named_parameters()}
    model = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name:
                param.fill_(0.5)
            elif "lora_B" in name:
                param.fill_(0.25)  # PEFT initialises B to 0; make the adapter do something
    # Cloned as they come: the pairs share the model's storage, and the unmerge restores it.
    pairs = {name: tensor.clone() for name, tensor in peft_named_params_for_vllm(model)}
    assert sorted(pairs) == sorted(original)  # exactly the base model's names
    # (B A)[i, j] = sum over r=2 of 0.25 * 0.5 = 0.25; scale = alpha / r = 4 / 2 = 2: W + 0.5.
    q = "model.layers.0.self_attn.q_proj.weight"
    torch.testing.assert_close(pairs[q], original[q] + 0.5, rtol=0, atol=1e-6)
    v = "model.layers.1.self_attn.v_proj.weight"
    torch.testing.assert_close(pairs[v], original[v] + 0.5, rtol=0, atol=1e-6)
    for untouched in ("model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.q_proj.bias"):
        assert torch.equal(pairs[untouched], original[untouched])
    # The iteration ended: the adapter is unmerged and the base weights are back.
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert not layer.merged
    torch.testing.assert_close(layer.base_layer.weight, original[q], rtol=0, atol=1e-6)


def test_the_lora_export_never_merges_into_the_model(tokenizer):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny(tokenizer), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    before = layer.base_layer.weight.detach().clone()
    pairs = peft_named_params_for_vllm(model)
    for name, _ in pairs:
        assert not layer.merged  # out of place: the layer is never merged, not even mid-export
        if name == "model.layers.0.self_attn.q_proj.weight":
            break
    pairs.close()
    assert not layer.merged and torch.equal(layer.base_layer.weight, before)


def bf16_lora_model(tokenizer, target_modules=("q_proj", "v_proj")):
    """A bfloat16 tiny model with a LoRA adapter whose B is not zero (PEFT starts it at zero)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        tiny(tokenizer).to(torch.bfloat16), LoraConfig(r=4, lora_alpha=8, target_modules=list(target_modules))
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return model


def test_lora_sync_leaves_bf16_base_weights_bit_identical_after_many_syncs(tokenizer):
    # Merging in place in bf16 and unmerging (PEFT's merge_adapter / unmerge_adapter) rounds W + d - d
    # back to a different W every sync; the export must never write the base weights at all.
    model = bf16_lora_model(tokenizer)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    assert all(p.dtype == torch.bfloat16 for p in base.values())
    first = None
    for _ in range(20):
        merged = {name: tensor.clone() for name, tensor in peft_named_params_for_vllm(model)}
        first = first or merged
        assert all(torch.equal(merged[n], first[n]) for n in first)  # every sync sends the same weights
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if "lora_" not in n)


def test_lora_merge_is_computed_in_float32_and_rounded_once(tokenizer):
    model = bf16_lora_model(tokenizer)
    merged = dict(peft_named_params_for_vllm(model))
    layer = model.base_model.model.model.layers[1].self_attn.v_proj
    a, b = layer.lora_A["default"].weight.float(), layer.lora_B["default"].weight.float()
    expected = (layer.base_layer.weight.float() + (b @ a) * layer.scaling["default"]).to(torch.bfloat16)
    got = merged["model.layers.1.self_attn.v_proj.weight"]
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)
    # PEFT's own bf16 merge (delta rounded to bf16 first, then added in bf16) differs somewhere.
    peft_way = layer.base_layer.weight + layer.get_delta_weight("default")
    assert not torch.equal(got, peft_way)
    # Not a layer with an adapter: the model's tensor itself.
    k = "model.layers.1.self_attn.k_proj.weight"
    assert merged[k].data_ptr() == model.base_model.model.model.layers[1].self_attn.k_proj.weight.data_ptr()


def test_a_disabled_adapter_exports_the_base_weights(tokenizer):
    model = bf16_lora_model(tokenizer, target_modules=("q_proj",))
    with model.disable_adapter():
        merged = dict(peft_named_params_for_vllm(model))
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert torch.equal(merged["model.layers.0.self_attn.q_proj.weight"], layer.base_layer.weight)


def test_trained_params_for_vllm_picks_the_helper_for_how_the_policy_is_held(monkeypatch):
    import simsearch.generation.vllm as vllm_module

    seen: list[tuple[str, object, dict]] = []

    def recorder(kind: str):
        return lambda model, **kwargs: seen.append((kind, model, kwargs)) or iter(())

    monkeypatch.setattr(vllm_module, "named_params_for_vllm", recorder("plain"))
    monkeypatch.setattr(vllm_module, "zero3_named_params_for_vllm", recorder("zero3"))
    monkeypatch.setattr(vllm_module, "peft_named_params_for_vllm", recorder("peft"))
    model = object()
    for lora, zero3 in ((False, False), (False, True), (True, False), (True, True)):
        trained_params_for_vllm(model, lora=lora, zero3=zero3)
    assert seen == [
        ("plain", model, {}),
        ("zero3", model, {}),
        ("peft", model, {"zero3": False}),  # LoRA under ZeRO-3: the PEFT helper gathers
        ("peft", model, {"zero3": True}),
    ]


# --------------------------------------------------------------------------- ZeRO-3, one gloo process

ZERO3_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import deepspeed, torch
    import torch.distributed as dist
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no C++ build; gloo does it
    from peft import LoraConfig, get_peft_model
    from simsearch.generation.vllm import peft_named_params_for_vllm, zero3_named_params_for_vllm
    from simsearch.models import build_tiny_model, train_tokenizer

    dist.init_process_group("gloo", rank=0, world_size=1)
    tok = train_tokenizer(["the cat sat on the mat"] * 20, vocab_size=300)
    config = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1}
    def tiny():
        return build_tiny_model(tok, hidden=16, layers=2, heads=2, kv_heads=1, ffn=32, seed=0)
    reference = {n: p.detach().clone() for n, p in tiny().named_parameters()}

    model = tiny()
    deepspeed.zero.Init(module=model, config_dict_or_path=config)  # partitions the parameters
    partitioned = all(p.data.numel() == 0 for p in model.parameters())
    full = {n: t.clone() for n, t in zero3_named_params_for_vllm(model)}
    plain_ok = sorted(full) == sorted(reference) and all(
        torch.equal(full[n], reference[n]) for n in reference)

    peft = get_peft_model(tiny(), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_A" in n: p.fill_(0.5)
            if "lora_B" in n: p.fill_(0.25)
    deepspeed.zero.Init(module=peft, config_dict_or_path=config)
    merged = {n: t.clone() for n, t in peft_named_params_for_vllm(peft, zero3=True)}
    q = "model.layers.0.self_attn.q_proj.weight"
    peft_delta = (merged[q] - reference[q]).abs().max().item(), (merged[q] - reference[q]).abs().min().item()
    print(json.dumps({"partitioned": partitioned, "plain_ok": plain_ok,
                      "peft_names_ok": sorted(merged) == sorted(reference), "peft_delta": peft_delta,
                      "still_partitioned": all(p.data.numel() == 0 for p in model.parameters())}))
    """
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_zero3_helpers_gather_full_weights_from_a_partitioned_model(tmp_path):
    script = tmp_path / "zero3.py"
    script.write_text(ZERO3_SCRIPT)
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["partitioned"] and result["still_partitioned"]
    assert result["plain_ok"] and result["peft_names_ok"]
    # every element of the merged q_proj is W + 2 * (2 * 0.25 * 0.5) = W + 0.5 (float32 rounding)
    high, low = result["peft_delta"]
    assert abs(high - 0.5) < 1e-6 and abs(low - 0.5) < 1e-6
