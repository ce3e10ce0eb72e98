"""In-process vLLM generation on GPU, with weight sync from a trainer.

`VLLMEngine` keeps `GenerationEngine`'s `Completion` contract. With a seed, each prompt gets
its own seed drawn from `random.Random(seed)`. After each optimizer step a trainer calls
`sync_weights(trained_params_for_vllm(...))`; a colocated trainer calls `sleep()` before its
update (`generate` and `sync_weights` wake what they need). vLLM is optional
(`pip install 'simsearch[vllm]'`, needs a CUDA GPU).
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import nullcontext
from typing import Any, Protocol

import torch

from simsearch.generation.base import prompt_token_ids
from simsearch.types import Completion, FinishReason, SamplingParams

VLLM_MISSING = "vLLM is not installed: pip install 'simsearch[vllm]' (needs a CUDA GPU)"

SLEEP_TAGS = frozenset({"weights", "kv_cache"})  # what vLLM's sleep mode frees


class VLLMNotInstalledError(ImportError):
    """Raised when a vLLM engine is requested but `import vllm` fails."""


class VLLMOutputError(RuntimeError):
    """vLLM returned something the `Completion` contract cannot represent (e.g. an abort)."""


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
        # 0 = no alternatives: just the sampled token's logprob.
        "logprobs": 0 if params.logprobs else None,
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
    """`llm.generate`'s outputs flattened prompt-major; raises `VLLMOutputError` unless each has n samples."""
    completions: list[Completion] = []
    for i, request in enumerate(outputs):
        samples = sorted(request.outputs, key=lambda o: o.index)
        if [o.index for o in samples] != list(range(n)):
            raise VLLMOutputError(
                f"vLLM returned samples {[o.index for o in samples]} for prompt {i}; expected indices 0..{n - 1}"
            )
        completions.extend(
            completion_from_output(o, want_logprobs=want_logprobs, token_text=token_text) for o in samples
        )
    return completions


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

    The adapter stays merged until the iteration ends: consume (or clone) each tensor before asking
    for the next. With `zero3`, collective: every rank must iterate to the end.
    """
    gather: Any = nullcontext()
    if zero3:
        import deepspeed

        gather = deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)
    with gather:
        model.merge_adapter()
        try:
            for name, param in model.named_parameters():
                vllm_name = vllm_param_name(name)
                if vllm_name is not None:
                    yield vllm_name, param.detach()
        finally:
            model.unmerge_adapter()


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

    Sets, unless set, `VLLM_ENABLE_V1_MULTIPROCESSING=0` (one GPU or the external launcher) and
    `VLLM_ALLOW_INSECURE_SERIALIZATION=1`.

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
    ) -> None:
        try:
            import vllm
            from vllm.inputs import TokensPrompt
        except ImportError as err:
            raise VLLMNotInstalledError(VLLM_MISSING) from err
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization={gpu_memory_utilization} must be in (0, 1]; colocated "
                "with training, leave room for the trainer (e.g. 0.3)"
            )
        if tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size={tensor_parallel_size} must be >= 1")
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        if tensor_parallel_size == 1 or distributed_executor_backend == "external_launcher":
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # Read once, as vLLM reads it when the engine starts (and forces it to 0 for the launcher).
        multiprocessing = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0"
        self.in_process = not multiprocessing or distributed_executor_backend == "external_launcher"
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

        Resets the prefix cache. Raises `ValueError` on no pairs, `RuntimeError` when vLLM refuses
        the cache reset or cannot receive pickles.
        """
        if not self.in_process and os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION") != "1":
            raise RuntimeError(
                "sync_weights with vLLM's engine core in another process (tensor_parallel_size > 1) "
                "sends a pickled loader, which vLLM refuses unless VLLM_ALLOW_INSECURE_SERIALIZATION=1: "
                "unset it (VLLMEngine then sets it) or export it as 1"
            )
        if "weights" in self._asleep:
            self.llm.wake_up(tags=["weights"])
            self._asleep = self._asleep - {"weights"}
        count = 0
        for name, tensor in named_params:
            # Out of process, a CUDA tensor would be unpickled onto a GPU of the engine-core process.
            sent = tensor if self.in_process else tensor.detach().to("cpu")
            self.llm.apply_model(_LoadWeights([(name, sent)]))
            count += 1
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

    def sleep(self, level: int = 1) -> None:
        """Frees GPU memory: level 1 moves the weights to CPU, level 2 drops them.

        Raises:
            RuntimeError: the engine was built without `enable_sleep_mode=True`.
            ValueError: a level other than 1 or 2.
        """
        if not self.enable_sleep_mode:
            raise RuntimeError("VLLMEngine.sleep needs VLLMEngine(..., enable_sleep_mode=True) (CUDA only)")
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
