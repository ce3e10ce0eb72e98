"""In-process vLLM generation on GPU, with weight sync from a trainer.

`VLLMEngine` is a `GenerationEngine` over `vllm.LLM` for policy rollouts and evaluation: token-id
prompts go in as `TokensPrompt`s, one `llm.generate` call per `generate`, and each vLLM
`CompletionOutput` becomes a `Completion` with the same contract as `HFEngine`:

- a stop string stays at the end of `text` (`include_stop_str_in_output=True`), and `token_ids`
  run up to and including the token that completed it (vLLM trims the text, never the ids);
- an end-of-sequence or stop token ends a sequence with `finish_reason="stop"`, `stop=None`; it
  is kept in `token_ids` and left out of `text`;
- logprobs are the sampled tokens' log-probabilities under the model's raw distribution
  (`logprobs_mode="raw_logprobs"`: before temperature and top-p), as HFEngine returns them;
- with `n > 1` a prompt's samples are consecutive; with a seed, prompt i is sampled with its own
  seed drawn from `random.Random(seed)` (vLLM then seeds sample j with that seed + j), so two
  equal contexts in one batch do not get equal samples.

Special tokens are kept in the text (`skip_special_tokens=False`), as HFEngine keeps them, so a
tag that a tokenizer makes a special token can still match a stop string.

Weight sync: after each optimizer step a trainer calls `sync_weights(pairs)` with
`(name, tensor)` pairs in Hugging Face naming; the helpers below produce them from a plain model
(`named_params_for_vllm`), a DeepSpeed ZeRO-3 model (`zero3_named_params_for_vllm`, gathering one
module at a time) and a PEFT LoRA model (`peft_named_params_for_vllm`: merge, export with the
base model's names, unmerge); `trained_params_for_vllm` picks the one that fits (`simsearch
train` calls it after every update). Each pair is handed to the model's own `load_weights` inside the
vLLM worker through `LLM.apply_model`, the API current vLLM documents for running a function on
the model in every worker (it replaced reaching into
`llm.llm_engine.model_executor.driver_worker.model_runner.model`, which only ever worked with
the engine in this process); then the prefix cache is reset, since cached KV blocks were computed
with the old weights.

Colocated training (policy and vLLM on the same GPUs) frees memory between rollouts:

    engine = VLLMEngine(path, gpu_memory_utilization=0.3, tensor_parallel_size=1,
                        enable_sleep_mode=True)
    for step in ...:
        completions = engine.generate(prompts, params)   # wakes whatever sleeps
        engine.sleep()                                   # level 1: weights to CPU, KV dropped
        ... forward / backward / optimizer step ...
        engine.sync_weights(named_params_for_vllm(model))  # wakes the weights only, loads

`sleep(level=2)` drops the weights instead of copying them to CPU (less host memory); the next
`sync_weights` must then load every parameter, and `generate` refuses to run before it (vLLM
would otherwise generate from uninitialised memory: vllm-project/vllm#29341).

Unverified on a GPU: tested on CPU against a fake `vllm` only (docs/scaling.md, "Verified where").

Where this departs from the published systems: Search-R1 and ZeroSearch run vLLM 0.6.3 inside
verl (whose sharding manager writes into vLLM's internal model object) and recompute the old
log-probs with the trainer; this engine targets current vLLM (the V1 engine) through its public
API, and returns the rollout's own log-probs so that a trainer can measure and correct the
engine / trainer mismatch (`simsearch.policy.offpolicy.truncated_is_weights`).

vLLM is an optional dependency (`pip install 'simsearch[vllm]'`) because it needs a CUDA GPU.
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
    """vLLM's `Logprob`: one token's log-probability (plus rank and decoded text)."""

    logprob: float


class CompletionOutputLike(Protocol):
    """The fields of vLLM's `CompletionOutput` this module reads."""

    index: int
    text: str
    token_ids: Sequence[int]
    finish_reason: str | None
    stop_reason: int | str | None
    logprobs: Sequence[dict[int, LogprobLike]] | None


class RequestOutputLike(Protocol):
    """The fields of vLLM's `RequestOutput` this module reads."""

    outputs: Sequence[CompletionOutputLike]


def sampling_kwargs(params: SamplingParams, *, seed: int | None) -> dict[str, Any]:
    """The keyword arguments of `vllm.SamplingParams` for one prompt.

    Args:
        params: Our sampling settings.
        seed: This prompt's seed (see `prompt_seeds`), or None for unseeded sampling.

    Returns:
        A dict for `vllm.SamplingParams(**kwargs)`.
    """
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
    """One seed per prompt of a call, all derived from the call's seed.

    vLLM seeds each request, and sample j of a request with n samples gets the request's seed
    + j. One seed for every prompt would make two equal contexts in a batch (two trajectories of
    a group that made the same search) produce equal samples; seeds drawn from
    `random.Random(seed)` make them independent while keeping the call reproducible.

    Args:
        seed: The call's seed (`SamplingParams.seed`), or None.
        count: Number of prompts.

    Returns:
        `count` seeds below 2**62 (so seed + j stays a valid 63-bit seed), or `count` Nones.
    """
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
        output: A sample, generated with `sampling_kwargs` (so a matched stop string is still at
            the end of `output.text`, and an end token's text too when it was not skipped).
        want_logprobs: Whether logprobs were asked for.
        token_text: Decodes one token id as vLLM did (special tokens kept); used to take an end
            token's text off the end of `text`.

    Returns:
        The completion. `stop` is the stop string vLLM matched; None when the sequence ended on
        an end-of-sequence or stop token (vLLM's `stop_reason` None or an int) or on length.

    Raises:
        VLLMOutputError: finish reason other than "stop" / "length" (an aborted request), a
            reported stop string that the text does not end with, or missing logprobs.
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
    """Flattens `llm.generate`'s outputs (one per prompt, in prompt order) prompt-major.

    Args:
        outputs: vLLM's `RequestOutput`s, one per prompt.
        n: Samples per prompt.
        want_logprobs: Whether logprobs were asked for.
        token_text: See `completion_from_output`.

    Returns:
        len(outputs) * n completions: prompt 0's samples (by `index`), then prompt 1's, ...

    Raises:
        VLLMOutputError: a prompt without exactly n samples indexed 0..n-1.
    """
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
    """The Hugging Face name vLLM's `load_weights` expects for a trainer parameter.

    Plain model names pass through. PEFT names lose the wrapper prefix `base_model.model.` and
    the `.base_layer` of wrapped layers; a `modules_to_save` copy takes the original module's
    name. LoRA factors (merged into the base weights beforehand) and the frozen original of a
    `modules_to_save` module have no vLLM counterpart.

    Args:
        name: A `named_parameters()` name of the trained model.

    Returns:
        The vLLM-side name, or None to skip the parameter.
    """
    if _LORA_SEGMENT.search(name) or ".original_module." in name:
        return None
    name = name.removeprefix("base_model.model.")
    name = name.replace(".base_layer.", ".")
    return _MODULES_TO_SAVE.sub(".", name)


def named_params_for_vllm(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of a plain (not partitioned, not PEFT) model, for `sync_weights`.

    Tied weights appear once (`named_parameters` deduplicates; vLLM ties them again itself).
    """
    for name, param in model.named_parameters():
        yield name, param.detach()


def zero3_named_params_for_vllm(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) pairs of a DeepSpeed ZeRO-3 model, gathered one module at a time.

    Each module's own parameters are gathered with `deepspeed.zero.GatheredParameters`, yielded,
    and partitioned again when the next module is requested, so at most one module's full
    weights (the largest is the embedding) are materialised at once. A yielded tensor is only
    valid until the next pair is requested: consume each pair before asking for the next
    (`VLLMEngine.sync_weights` does). Parameters not partitioned by ZeRO pass through (the
    gather is a no-op for them).

    Every rank must iterate to the end, in step: the gathers are collective. A rank without an
    engine (e.g. when only rank 0 serves one) drains the iterator and drops the pairs.

    Yields:
        (name, tensor) in `named_parameters` naming, shared parameters once.
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

    Merges the adapter into the base weights (`merge_adapter`: W + B A · alpha / r), yields the
    base parameters under their base-model names (`vllm_param_name`), and unmerges
    (`unmerge_adapter`) when the iteration ends or is abandoned, so training continues on the
    unmerged factors. Merging and unmerging in floating point can leave the base weights a few
    ulps off (PEFT's own caveat); the adapter itself is untouched.

    Args:
        model: A `peft.PeftModel` with LoRA adapters.
        zero3: The model is partitioned by DeepSpeed ZeRO-3: gather all parameters first
            (merging needs A, B and W together), so every rank holds the full model for the
            duration; every rank must then iterate to the end.

    Yields:
        (name, tensor) pairs sharing the model's storage: the unmerge at the end changes them
        back, so consume each pair before asking for the next (`VLLMEngine.sync_weights` does)
        or clone it.
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
    """The export helper that fits how the trainer holds its policy, for `sync_weights`.

    Args:
        model: The trained module (under DeepSpeed the engine's `.module`, not the engine).
        lora: The module is a PEFT LoRA model: export merged weights under base names.
        zero3: Its parameters are partitioned by DeepSpeed ZeRO-3: gather them (collective:
            every rank must consume the iterator to the end).

    Returns:
        (name, tensor) pairs in Hugging Face naming; see the helper each case uses.
    """
    if lora:
        return peft_named_params_for_vllm(model, zero3=zero3)
    if zero3:
        return zero3_named_params_for_vllm(model)
    return named_params_for_vllm(model)


class _LoadWeights:
    """Runs inside each vLLM worker (via `LLM.apply_model`): loads (name, tensor) pairs.

    Deliberately not a dataclass. Out of process, vLLM's engine-core messaging (msgspec, vLLM
    0.32-0.33 `v1/serial_utils.py`) encodes a dataclass natively, as a plain map, so the worker
    would receive a dict; an instance of a plain class falls through to vLLM's pickle hook
    (allowed by `VLLM_ALLOW_INSECURE_SERIALIZATION=1`) and arrives whole. It returns nothing,
    so nothing large travels back.
    """

    def __init__(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        self.weights = weights

    def __call__(self, model: Any) -> None:  # a vLLM model class: they all have load_weights
        model.load_weights(self.weights)


# ------------------------------------------------------------------ the engine


class VLLMEngine:
    """A `GenerationEngine` on in-process vLLM, with weight sync and sleep mode.

    Args:
        model_path: A model directory in Hugging Face format, or a hub name.
        gpu_memory_utilization: Share of each GPU's memory vLLM takes for weights, activations
            and KV cache (leave the rest to the trainer when colocated).
        tensor_parallel_size: GPUs the model is sharded over.
        enable_sleep_mode: Allow `sleep()` / `wake_up()` (vLLM allocates from a pool it can
            release; CUDA only).
        dtype: "auto" (the checkpoint's), "bfloat16", "float16" or "float32".
        seed: vLLM's engine seed (unseeded requests draw from it).
        max_model_len: Context length (prompt + generation); None = the model config's.
        enable_prefix_caching: Reuse KV blocks of shared prefixes (a group's prompt, a
            trajectory's earlier turns).
        distributed_executor_backend: None for vLLM's default; "external_launcher" when every
            process of a `torchrun` / `deepspeed` launch runs its own engine on its own GPU(s)
            next to the trainer (vLLM then joins the launcher's process group instead of
            spawning workers; TRL's colocate mode). GPU-unverified.

    Environment: with one GPU per engine or the external launcher, the engine runs in this
    process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so `sync_weights` hands tensors to the model by
    reference. With tensor parallelism in one process the engine core runs in its own process:
    `sync_weights` then sends each tensor, copied to CPU memory, inside a pickled loader (vLLM
    accepts pickles only with `VLLM_ALLOW_INSECURE_SERIALIZATION=1`) and every worker loads its
    shard. Both variables are set with `setdefault`, so a value exported before wins.

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
        """Generates `params.n` completions per prompt, prompt-major, in one `llm.generate` call.

        Wakes the engine first if it sleeps.

        Args:
            prompts: Token-id lists, or strings that the engine tokenizes (with the tokenizer's
                own special-token rules, as HFEngine does).
            params: Sampling settings.

        Returns:
            len(prompts) * n completions.

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
        """Loads trainer weights into the running engine, then resets the prefix cache.

        Wakes only the weights if the engine sleeps (the KV cache is allocated by the next
        `generate`, after the trainer has released its memory). Each pair is loaded before the
        next is requested, so an iterator may yield temporarily gathered tensors
        (`zero3_named_params_for_vllm`). Give the full set of parameters: vLLM's `load_weights`
        maps Hugging Face names onto its fused layers (q/k/v, gate/up) and converts dtypes.

        Args:
            named_params: (name, tensor) pairs in Hugging Face naming, on any device.

        Returns:
            The number of pairs loaded.

        Raises:
            ValueError: `named_params` was empty.
            RuntimeError: vLLM refused to reset its prefix cache (requests still running), or
                the engine core runs in another process and pickles are not allowed.
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
        """Frees the engine's GPU memory for training.

        Args:
            level: 1 copies the weights to CPU memory and drops the KV cache; 2 drops both
                (less host memory; the next `sync_weights` must then load every parameter).

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
        """Reallocates what `sleep` freed: `tags` among "weights", "kv_cache"; None for both.

        `generate` and `sync_weights` wake what they need themselves; call this to control when
        memory is taken back.
        """
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
