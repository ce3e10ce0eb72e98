"""In-process vLLM generation on GPU, with weight sync from a trainer.

`VLLMEngine` keeps `GenerationEngine`'s `Completion` contract. With a seed, each prompt gets
its own seed drawn from `random.Random(seed)`. After each optimizer step a trainer calls
`sync_weights(trained_params_for_vllm(...))`; a colocated trainer calls `sleep()` before its
update (`generate` and `sync_weights` wake what they need). vLLM is optional
(`pip install 'simsearch[vllm]'`, needs a CUDA GPU).

What the GPU path relies on (docs/scaling.md, "Risks fixed on CPU"):
- PyTorch's cached CUDA blocks are released before every `wake_up` (vLLM's sleep allocator
  cannot map memory PyTorch's cache holds; TRL and verl do the same).
- `max_num_batched_tokens` and `max_num_seqs` bound vLLM's memory profiling, so a small
  `gpu_memory_utilization` still leaves room for a KV cache.
- Weights go to the model by reference only where vLLM's model lives in this process (one worker
  in process, or one engine per launcher process); anywhere else as CPU copies in chunks of
  `sync_chunk_bytes`, one `apply_model` call per chunk (never a pickled CUDA tensor).
- `sleep()` defaults to level 2: the weights are dropped, not copied to the CPU and back, since
  the sync after the update overwrites every one of them.
- Non-finite logits end generation with `NonFiniteError`, as under `HFEngine`: every request
  asks vLLM for the sampled token's log-probability, which is inf or nan exactly then.
- A LoRA policy is merged out of place in float32: the base weights are never written.
"""

from __future__ import annotations

import math
import os
import random
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import nullcontext
from typing import Any, Protocol, cast

import torch

from simsearch.errors import NonFiniteError, SimsearchError
from simsearch.generation.base import prompt_token_ids
from simsearch.types import Completion, FinishReason, SamplingParams

VLLM_MISSING = "vLLM is not installed: pip install 'simsearch[vllm]' (needs a CUDA GPU)"

SLEEP_TAGS = frozenset({"weights", "kv_cache"})  # what vLLM's sleep mode frees

SYNC_CHUNK_BYTES = 256 << 20
"""Most bytes of CPU copies one `apply_model` call carries when vLLM's workers are in other processes."""


class VLLMNotInstalledError(ImportError):
    """Raised when a vLLM engine is requested but `import vllm` fails."""


class VLLMOutputError(RuntimeError):
    """vLLM returned something the `Completion` contract cannot represent (e.g. an abort)."""


class VLLMWeightTransferError(SimsearchError, RuntimeError):
    """The trained weights cannot reach vLLM's workers the way the engine was set up (one line: what to change)."""


# ------------------------------------------------------------------ vLLM outputs -> Completion


class LogprobLike(Protocol):
    logprob: float


class CompletionOutputLike(Protocol):
    index: int
    text: str
    token_ids: Sequence[int]
    finish_reason: str | None
    stop_reason: int | str | None
    logprobs: Sequence[dict[int, LogprobLike]] | None


class RequestOutputLike(Protocol):
    outputs: Sequence[CompletionOutputLike]


def sampling_kwargs(params: SamplingParams, *, seed: int | None) -> dict[str, Any]:
    """The keyword arguments of `vllm.SamplingParams` for one prompt; `seed` is this prompt's (or None)."""
    return {
        "n": params.n,
        "temperature": params.temperature,  # vLLM: 0 is greedy, as ours
        "top_p": params.top_p,
        "max_tokens": params.max_new_tokens,
        "stop": list(params.stop) or None,
        "include_stop_str_in_output": True,  # our contract keeps the stop string in the text
        "seed": seed,
        # 0 = no alternatives: just the sampled token's logprob. Asked for always (vLLM computes
        # it from the raw logits it samples from): it is inf or nan exactly when they are, which
        # is how non-finite logits become `NonFiniteError` as under HFEngine.
        "logprobs": 0,
        # HFEngine keeps special tokens in the text (tags may be special tokens), and a fast
        # tokenizer's decode puts no spaces between them.
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
    }


def prompt_seeds(seed: int | None, count: int) -> list[int | None]:
    """`count` seeds below 2**62 drawn from `random.Random(seed)`, one per prompt; Nones when `seed` is None."""
    if seed is None:
        return [None] * count
    rng = random.Random(seed)
    return [rng.getrandbits(62) for _ in range(count)]


def completion_from_output(
    output: CompletionOutputLike,
    *,
    want_logprobs: bool,
    token_text: Callable[[int], str],
) -> Completion:
    """Maps one vLLM `CompletionOutput` onto a `Completion`.

    Args:
        token_text: Decodes one token id as vLLM did (to take an end token's text off `text`).

    Raises:
        VLLMOutputError: an aborted request, a reported stop string the text does not end with, or
            missing logprobs.
    """
    if output.finish_reason not in ("stop", "length"):
        raise VLLMOutputError(
            f"vLLM finished sample {output.index} with finish_reason={output.finish_reason!r} "
            "(expected 'stop' or 'length'): the request was aborted or is still running"
        )
    finish_reason: FinishReason = "length" if output.finish_reason == "length" else "stop"
    token_ids = [int(t) for t in output.token_ids]
    text = output.text
    stop: str | None = None
    if finish_reason == "stop":
        if isinstance(output.stop_reason, str):
            stop = output.stop_reason
            if not text.endswith(stop):
                raise VLLMOutputError(
                    f"vLLM reported stop string {stop!r} but the text does not end with it "
                    f"(...{text[-40:]!r}): include_stop_str_in_output was not honoured"
                )
        elif token_ids:
            # An end token ended it; with include_stop_str_in_output vLLM decoded it into the
            # text (an empty string when the tokenizer skips it), so take it off again.
            tail = token_text(token_ids[-1])
            if tail and text.endswith(tail):
                text = text[: -len(tail)]
    logprobs: list[float] | None = None
    if want_logprobs:
        if output.logprobs is None or len(output.logprobs) != len(token_ids):
            got = None if output.logprobs is None else len(output.logprobs)
            raise VLLMOutputError(
                f"vLLM returned logprobs for {got} of {len(token_ids)} tokens of sample "
                f"{output.index}; expected one per generated token"
            )
        logprobs = [float(step[t].logprob) for step, t in zip(output.logprobs, token_ids)]
    return Completion(token_ids, text, finish_reason, stop, logprobs)


def completions_from_request_outputs(
    outputs: Sequence[RequestOutputLike],
    *,
    n: int,
    want_logprobs: bool,
    token_text: Callable[[int], str],
) -> list[Completion]:
    """`llm.generate`'s outputs flattened prompt-major.

    Raises:
        VLLMOutputError: a prompt without exactly n samples (see also `completion_from_output`).
        NonFiniteError: a sampled token's log-probability is inf or nan: the logits vLLM sampled
            from were (names every such row and the first such generated token).
    """
    completions: list[Completion] = []
    non_finite: list[tuple[int, int]] = []  # (output row, generated token index)
    for i, request in enumerate(outputs):
        samples = sorted(request.outputs, key=lambda o: o.index)
        if [o.index for o in samples] != list(range(n)):
            raise VLLMOutputError(
                f"vLLM returned samples {[o.index for o in samples]} for prompt {i}; expected indices 0..{n - 1}"
            )
        for o in samples:
            bad = first_non_finite(o)
            if bad is not None:
                non_finite.append((i * n + o.index, bad))
        if not non_finite:
            completions.extend(
                completion_from_output(o, want_logprobs=want_logprobs, token_text=token_text) for o in samples
            )
    if non_finite:
        rows = [row for row, _ in non_finite]
        raise NonFiniteError(non_finite_message(rows, n, non_finite[0][1]), rows)
    return completions


def first_non_finite(output: CompletionOutputLike) -> int | None:
    """The index of the first generated token whose reported log-probability is inf or nan, or None.

    None too when vLLM reported no log-probabilities (nothing to tell from).
    """
    if output.logprobs is None:
        return None
    for k, (step, token) in enumerate(zip(output.logprobs, output.token_ids)):
        entry = step.get(int(token)) if step is not None else None
        if entry is not None and not math.isfinite(float(entry.logprob)):
            return k
    return None


def non_finite_message(rows: list[int], n: int, token_index: int) -> str:
    """What `NonFiniteError` says under vLLM: the output rows (prompt, sample), the generated token, what to do."""
    named = ", ".join(f"prompt {row // n} sample {row % n}" for row in rows[:8])
    more = f" and {len(rows) - 8} more" if len(rows) > 8 else ""
    return (
        f"the model's next-token logits are inf or nan for {len(rows)} row(s) ({named}{more}) at generated token "
        f"{token_index + 1} (vLLM reported a non-finite log-probability for the token it sampled; the outputs "
        "are discarded). The weights or activations overflowed or diverged: in bfloat16 or float16 try "
        "model.dtype=float32 to check, lower the learning rate, or resume from the last checkpoint"
    )


# ------------------------------------------------------------------ trainer weights -> vLLM names

_LORA_SEGMENT = re.compile(r"(^|\.)lora_")  # lora_A, lora_B, lora_embedding_A, lora_magnitude_vector
_MODULES_TO_SAVE = re.compile(r"\.modules_to_save\.[^.]+\.")


def vllm_param_name(name: str) -> str | None:
    """The Hugging Face name vLLM expects for a trainer parameter (PEFT wrappers removed), or None to skip it."""
    if _LORA_SEGMENT.search(name) or ".original_module." in name:
        return None
    name = name.removeprefix("base_model.model.")
    name = name.replace(".base_layer.", ".")
    return _MODULES_TO_SAVE.sub(".", name)


def named_params_for_vllm(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of a plain (not partitioned, not PEFT) model, tied weights once."""
    for name, param in model.named_parameters():
        yield name, param.detach()


def zero3_named_params_for_vllm(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) pairs of a ZeRO-3 model; each tensor is valid until the next is requested.

    Collective: every rank must iterate to the end.
    """
    import deepspeed

    seen: set[int] = set()
    for module_name, module in model.named_modules():
        own = [(n, p) for n, p in module.named_parameters(recurse=False) if id(p) not in seen]
        if not own:
            continue
        seen.update(id(p) for _, p in own)
        # modifier_rank=None: we only read, so nothing is broadcast back on exit.
        with deepspeed.zero.GatheredParameters([p for _, p in own], modifier_rank=None):
            for name, param in own:
                yield (f"{module_name}.{name}" if module_name else name), param.detach()


def peft_named_params_for_vllm(model: Any, *, zero3: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, merged tensor) pairs of a PEFT LoRA model, in the base model's naming.

    Each LoRA layer's weight is merged out of place in float32, `W + scale * B @ A` rounded once
    to W's dtype: the base weights are never written (an in-place merge and unmerge in bfloat16
    leaves them a rounding off after every sync, and the error grows step after step). The merged
    tensors are new; the others are the model's own (under ZeRO-3 gathered one layer at a time,
    valid until the next pair is requested). With `zero3`, collective: every rank must iterate
    to the end.

    Raises:
        ValueError: an adapter this merge does not cover (DoRA, a LoRA bias).
    """
    from peft.tuners.lora import LoraLayer

    gather = _gatherer(zero3)
    seen: set[int] = set()
    inside: list[str] = []  # the LoRA layers' prefixes: their sub-modules are done with them
    for module_name, module in model.named_modules():
        if any(module_name.startswith(prefix) for prefix in inside):
            continue
        if isinstance(module, LoraLayer):
            inside.append(f"{module_name}.")
            params = list(cast(torch.nn.Module, module).named_parameters())
            seen.update(id(p) for _, p in params)
            with gather([p for _, p in params]):
                base_weight = module.get_base_layer().weight
                merged = merged_lora_weight(module)
                for name, param in params:
                    vllm_name = vllm_param_name(f"{module_name}.{name}")
                    if vllm_name is not None:
                        yield vllm_name, merged if param is base_weight else param.detach()
            continue
        own = [(n, p) for n, p in module.named_parameters(recurse=False) if id(p) not in seen]
        if not own:
            continue
        seen.update(id(p) for _, p in own)
        with gather([p for _, p in own]):
            for name, param in own:
                vllm_name = vllm_param_name(f"{module_name}.{name}" if module_name else name)
                if vllm_name is not None:
                    yield vllm_name, param.detach()


def merged_lora_weight(layer: Any) -> torch.Tensor:
    """A PEFT LoRA layer's base weight plus its active adapters, computed in float32, in the weight's dtype.

    A new tensor: the layer is not changed. An adapter already merged into the weight (or switched
    off) adds nothing.
    """
    weight = layer.get_base_layer().weight
    if layer.merged or layer.disable_adapters:
        return weight.detach()
    total = weight.detach().to(torch.float32, copy=True)
    for adapter in layer.active_adapters:
        if layer.use_dora.get(adapter, False) or getattr(layer, "lora_bias", {}).get(adapter, False):
            raise ValueError(
                f"LoRA adapter {adapter!r} uses DoRA or a LoRA bias, which the vLLM weight sync does not "
                "merge: train a plain LoRA adapter (lora.* in the recipe) or use policy.kind=hf"
            )
        scale = layer.scaling[adapter]
        if adapter in layer.lora_A and isinstance(layer.lora_A[adapter], torch.nn.Linear):
            delta = layer.lora_B[adapter].weight.float() @ layer.lora_A[adapter].weight.float()
            total += (delta.T if getattr(layer, "fan_in_fan_out", False) else delta) * scale
        elif adapter in layer.lora_embedding_A:
            delta = layer.lora_embedding_B[adapter].float() @ layer.lora_embedding_A[adapter].float()
            total += delta.T * scale
        elif adapter in layer.lora_A:  # other layer kinds (convolutions): PEFT's delta, out of place
            total += layer.get_delta_weight(adapter).float()
    return total.to(weight.dtype)


def _gatherer(zero3: bool) -> Callable[[list[torch.Tensor]], Any]:
    """A context factory that gathers ZeRO-3 parameters for reading (nothing to do without ZeRO-3)."""
    if not zero3:
        return lambda params: nullcontext()
    import deepspeed

    # modifier_rank=None: we only read, so nothing is broadcast back on exit.
    return lambda params: deepspeed.zero.GatheredParameters(params, modifier_rank=None)


def trained_params_for_vllm(model: Any, *, lora: bool, zero3: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs for `sync_weights` of a plain, PEFT LoRA and/or ZeRO-3 model."""
    if lora:
        return peft_named_params_for_vllm(model, zero3=zero3)
    if zero3:
        return zero3_named_params_for_vllm(model)
    return named_params_for_vllm(model)


class _LoadWeights:
    """Loads (name, tensor) pairs inside each vLLM worker (a plain class: it travels pickled)."""

    def __init__(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        self.weights = weights

    def __call__(self, model: Any) -> None:  # a vLLM model class: they all have load_weights
        model.load_weights(self.weights)


# ------------------------------------------------------------------ the engine


class VLLMEngine:
    """A `GenerationEngine` on in-process vLLM, with weight sync and sleep mode.

    Args:
        model_path: A Hugging Face model directory or hub name.
        gpu_memory_utilization: Share of each GPU's memory vLLM takes.
        tensor_parallel_size: GPUs the model is sharded over.
        enable_sleep_mode: Allow `sleep()` / `wake_up()` (CUDA only).
        max_model_len: Context length (prompt + generation); None = the model config's.
        distributed_executor_backend: "external_launcher" when every process of a `torchrun` /
            `deepspeed` launch runs its own engine; None for vLLM's default.
        max_num_batched_tokens: Most tokens one scheduler step processes; vLLM profiles its
            memory with a batch this large, so it bounds what the profile takes from the KV cache
            (None: vLLM's default, up to 16,384 on a large GPU).
        max_num_seqs: Most sequences decoded at once (None: vLLM's default, up to 1,024).
        sleep_level: What `sleep()` does by default: 2 drops the weights (the colocated trainer
            syncs every weight after its update), 1 keeps a CPU copy.
        sync_chunk_bytes: Most bytes of CPU copies one `apply_model` call carries when the
            workers are in other processes.

    Sets, unless set, `VLLM_ENABLE_V1_MULTIPROCESSING=0` (one GPU or the external launcher) and
    `VLLM_ALLOW_INSECURE_SERIALIZATION=1`.

    Attributes:
        in_process: vLLM's model lives in this process (one worker, or one engine per launcher
            process): `sync_weights` hands it the tensors themselves.
        engine_core_in_process: vLLM's engine core runs in this process (multiprocessing off):
            what `apply_model` sends is not encoded for another process on the way to the executor.

    Raises:
        VLLMNotInstalledError: vLLM cannot be imported.
    """

    def __init__(
        self,
        model_path: str,
        *,
        gpu_memory_utilization: float,
        tensor_parallel_size: int,
        enable_sleep_mode: bool = False,
        dtype: str = "auto",
        seed: int = 0,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
        distributed_executor_backend: str | None = None,
        max_num_batched_tokens: int | None = None,
        max_num_seqs: int | None = None,
        sleep_level: int = 2,
        sync_chunk_bytes: int = SYNC_CHUNK_BYTES,
    ) -> None:
        try:
            import vllm
            from vllm.inputs import TokensPrompt
        except ImportError as err:
            raise VLLMNotInstalledError(VLLM_MISSING) from err
        _check_engine_arguments(
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            sleep_level=sleep_level,
            sync_chunk_bytes=sync_chunk_bytes,
        )
        layout = _process_layout(tensor_parallel_size, distributed_executor_backend)
        self.engine_core_in_process, self.in_process = layout
        self.sleep_level = sleep_level
        self.sync_chunk_bytes = sync_chunk_bytes
        self._sampling_params_cls = vllm.SamplingParams
        self._tokens_prompt = TokensPrompt
        self.enable_sleep_mode = enable_sleep_mode
        self.llm = vllm.LLM(
            model=model_path,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            enable_sleep_mode=enable_sleep_mode,
            distributed_executor_backend=distributed_executor_backend,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            # Log-probs of the model's own distribution (before temperature / top-p), the ones
            # HFEngine returns and the RL losses compare with the trainer's.
            logprobs_mode="raw_logprobs",
        )
        self.tokenizer = self.llm.get_tokenizer()
        self._asleep: frozenset[str] = frozenset()
        self._weights_discarded = False

    def generate(self, prompts: list[list[int]] | list[str], params: SamplingParams) -> list[Completion]:
        """Generates `params.n` completions per prompt, prompt-major; wakes the engine if it sleeps.

        Raises:
            RuntimeError: after `sleep(level=2)` without a `sync_weights` since.
            ValueError: an empty prompt.
            VLLMOutputError: see `completion_from_output`.
        """
        if not prompts:
            return []
        self._wake_for_generation()
        prompt_ids = prompt_token_ids(self.tokenizer, prompts)
        per_prompt = [
            self._sampling_params_cls(**sampling_kwargs(params, seed=seed))
            for seed in prompt_seeds(params.seed, len(prompt_ids))
        ]
        outputs = self.llm.generate(
            [self._tokens_prompt(prompt_token_ids=ids) for ids in prompt_ids],
            sampling_params=per_prompt,
            use_tqdm=False,
        )
        if len(outputs) != len(prompt_ids):
            raise VLLMOutputError(f"vLLM returned {len(outputs)} outputs for {len(prompt_ids)} prompts")
        return completions_from_request_outputs(
            outputs, n=params.n, want_logprobs=params.logprobs, token_text=self._token_text
        )

    def sync_weights(self, named_params: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Loads the full set of (name, tensor) pairs (Hugging Face naming); returns how many.

        In process the model gets each tensor itself, one `apply_model` call per tensor (a
        function call here; the producers' tensors may be valid only until the next is
        requested, so none is held). Otherwise each crosses as a CPU copy, batched into one
        call per `sync_chunk_bytes`. Resets the prefix cache.

        Raises:
            ValueError: no pairs.
            VLLMWeightTransferError: the engine core is in another process and vLLM refuses pickles.
            RuntimeError: vLLM refuses the prefix-cache reset.
        """
        if not self.engine_core_in_process and os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION") != "1":
            raise VLLMWeightTransferError(
                "sync_weights with vLLM's engine core in another process (tensor_parallel_size > 1) sends a "
                "pickled loader, which vLLM refuses unless VLLM_ALLOW_INSECURE_SERIALIZATION=1: unset it "
                "(VLLMEngine then sets it) or export it as 1"
            )
        if "weights" in self._asleep:
            release_cached_cuda_memory()
            self.llm.wake_up(tags=["weights"])
            self._asleep = self._asleep - {"weights"}
        count = 0
        chunk: list[tuple[str, torch.Tensor]] = []
        chunk_bytes = 0
        for name, tensor in named_params:
            count += 1
            if self.in_process:
                self.llm.apply_model(_LoadWeights([(name, tensor)]))
                continue
            # A copy on the CPU: what crosses to the workers' processes is never a CUDA tensor.
            copy = tensor.detach().to("cpu", copy=True)
            chunk.append((name, copy))
            chunk_bytes += copy.numel() * copy.element_size()
            if chunk_bytes >= self.sync_chunk_bytes:
                self.llm.apply_model(_LoadWeights(chunk))
                chunk, chunk_bytes = [], 0
        if chunk:
            self.llm.apply_model(_LoadWeights(chunk))
        if count == 0:
            raise ValueError(
                "sync_weights got no parameters: pass named_params_for_vllm(model) (or the ZeRO-3 "
                "/ PEFT variant) on every process that owns an engine"
            )
        self._weights_discarded = False
        if self.llm.reset_prefix_cache() is False:  # older vLLM returns None
            raise RuntimeError(
                "vLLM could not reset its prefix cache (requests still running); KV blocks "
                "computed with the old weights would be reused"
            )
        return count

    def sleep(self, level: int | None = None) -> None:
        """Frees GPU memory: level 1 moves the weights to CPU, level 2 drops them (None: `sleep_level`).

        After level 2 only `sync_weights` with every weight brings the engine back (vLLM keeps
        the model's buffers, e.g. rotary tables, across it): what the colocated trainer does after
        each update, without the copy to the CPU and back that level 1 makes every step.

        Raises:
            RuntimeError: the engine was built without `enable_sleep_mode=True`.
            ValueError: a level other than 1 or 2.
        """
        if not self.enable_sleep_mode:
            raise RuntimeError("VLLMEngine.sleep needs VLLMEngine(..., enable_sleep_mode=True) (CUDA only)")
        level = self.sleep_level if level is None else level
        if level not in (1, 2):
            raise ValueError(f"sleep level={level} must be 1 (weights to CPU) or 2 (weights dropped)")
        self.llm.sleep(level=level)
        self._asleep = SLEEP_TAGS
        self._weights_discarded = level == 2

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Reallocates what `sleep` freed: `tags` among "weights", "kv_cache"; None for both."""
        wanted = SLEEP_TAGS if tags is None else frozenset(tags)
        if not wanted <= SLEEP_TAGS:
            raise ValueError(f"wake_up tags {sorted(wanted)} must be among {sorted(SLEEP_TAGS)}")
        to_wake = wanted & self._asleep
        if not to_wake:
            return
        release_cached_cuda_memory()
        self.llm.wake_up(tags=sorted(to_wake))
        self._asleep = self._asleep - to_wake

    def _wake_for_generation(self) -> None:
        if self._weights_discarded:
            raise RuntimeError(
                "VLLMEngine.sleep(level=2) discarded the weights: call sync_weights(...) before "
                "generate (vLLM would generate from uninitialised memory), or sleep with level=1"
            )
        self.wake_up()

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


def release_cached_cuda_memory() -> None:
    """Hands the blocks PyTorch's CUDA allocator caches back to the driver (nothing to do without CUDA).

    Called before every vLLM `wake_up`: vLLM's sleep allocator maps fresh device memory, which
    blocks cached by PyTorch (the trainer's freed activations and gradients) would keep from it.
    """
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _check_engine_arguments(
    *,
    gpu_memory_utilization: float,
    tensor_parallel_size: int,
    max_num_batched_tokens: int | None,
    max_num_seqs: int | None,
    sleep_level: int,
    sync_chunk_bytes: int,
) -> None:
    """Raises `ValueError` on a `VLLMEngine` argument outside its bounds, naming it."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(
            f"gpu_memory_utilization={gpu_memory_utilization} must be in (0, 1]; colocated "
            "with training, leave room for the trainer (e.g. 0.3)"
        )
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size={tensor_parallel_size} must be >= 1")
    for name, value in (("max_num_batched_tokens", max_num_batched_tokens), ("max_num_seqs", max_num_seqs)):
        if value is not None and value < 1:
            raise ValueError(f"{name}={value} must be >= 1 (or None for vLLM's default)")
    if sleep_level not in (1, 2):
        raise ValueError(f"sleep_level={sleep_level} must be 1 (weights to CPU) or 2 (weights dropped)")
    if sync_chunk_bytes < 1:
        raise ValueError(f"sync_chunk_bytes={sync_chunk_bytes} must be >= 1")


def _process_layout(tensor_parallel_size: int, backend: str | None) -> tuple[bool, bool]:
    """(vLLM's engine core runs here, vLLM's model runs here); sets vLLM's environment unless set.

    With tensor parallelism and no launcher, vLLM's executor starts a process per worker even
    when its engine core runs here: the model is then not in this process, and a CUDA tensor
    handed to apply_model would be pickled to them (onto this process's GPU).
    """
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    launcher = backend == "external_launcher"
    if tensor_parallel_size == 1 or launcher:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # Read once, as vLLM reads it when the engine starts (and forces it to 0 for the launcher).
    multiprocessing = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0"
    engine_core_here = not multiprocessing or launcher
    return engine_core_here, engine_core_here and (tensor_parallel_size == 1 or launcher)
