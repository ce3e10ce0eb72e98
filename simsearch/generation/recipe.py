"""The generation sections of a recipe: the engine and its model, and how one call samples.

`GENERATION_KINDS` names the engine kinds a recipe may pick; `factory.build.GENERATION_ENGINES` holds
one builder for each (a test keeps the two equal). Adding an engine kind is its name here and its
builder there. Torch-free: `import simsearch.config` (and so `simsearch --help`) loads this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from simsearch.checks import check_choice, check_positive, check_range, setting, user_key
from simsearch.errors import RecipeError

GENERATION_KINDS = ("hf", "openai", "vllm")
"""The generation engine kinds (`GenerationConfig.kind`); each is built by `factory.build.GENERATION_ENGINES`."""


@dataclass
class ModelConfig:
    """A Hugging Face causal LM."""

    path: str = setting("", "local directory or hub name; required wherever the model is used")
    adapter: str | None = setting(None, "optional PEFT adapter directory loaded on top")
    dtype: str = setting("auto", "auto | float32 | bfloat16 | float16")
    device: str = setting("cpu", "cpu | cuda | cuda:N")

    def check(self, key: str) -> None:
        check_choice(f"{key}.dtype", self.dtype, ("auto", "float32", "bfloat16", "float16"))


@dataclass
class GenerationConfig:
    """A text-generation engine: transformers in-process, an OpenAI-compatible server, or vLLM."""

    kind: str = setting("hf", "a name in generation.recipe.GENERATION_KINDS (hf: transformers in process)")
    model: ModelConfig = setting(
        default_factory=ModelConfig,
        help="the model: the weights hf and vllm load (openai: the tokenizer, where one is needed)",
    )
    batch_size: int = setting(64, "hf: prompts per forward batch")
    compile: bool = setting(
        False,
        "hf: decode over a static KV cache under torch.compile (CUDA graphs; docs/performance.md)",
    )
    base_urls: list[str] = setting(default_factory=list, help="openai: server URLs (load balanced)")
    served_model_name: str = setting("", "openai: the model name the server expects")
    api_key_env: str | None = setting(None, "openai: environment variable holding the API key")
    chat: bool = setting(False, "openai: use /v1/chat/completions (needed by chat-template prompts)")
    timeout_s: float = setting(120.0, "openai: per-request timeout")
    max_retries: int = setting(3, "openai: bounded retries before a clear error")
    backoff_s: float = setting(1.0, "openai: first backoff, doubled each retry")
    max_concurrency: int = setting(8, "openai: requests in flight at once")
    gpu_memory_utilization: float = setting(0.5, "vllm: share of GPU memory for weights + KV cache")
    tensor_parallel_size: int = setting(1, "vllm: GPUs per engine")
    enable_sleep_mode: bool = setting(False, "vllm: free GPU memory between rollouts (colocated training)")
    max_model_len: int = setting(0, "vllm: context length (0 = the model's)")
    max_num_batched_tokens: int = setting(
        4096,
        "vllm: most tokens per scheduler step; vLLM profiles its memory with a batch this large, so it bounds what the "
        "profile takes from the KV cache (TRL's 4096; 0 = vLLM's own, up to 16384)",
    )
    max_num_seqs: int = setting(256, "vllm: most sequences decoded at once (0 = vLLM's own, up to 1024)")
    sleep_level: int = setting(
        2,
        "vllm, with enable_sleep_mode: 2 drops the weights while asleep (the sync after each update rewrites every "
        "one), 1 copies them to the CPU and back",
    )

    def check(self, key: str) -> None:
        check_choice(f"{key}.kind", self.kind, GENERATION_KINDS)
        check_positive(f"{key}.batch_size", self.batch_size)
        if self.compile and self.kind != "hf":
            raise RecipeError(f"{key}.compile=true is an option of kind=hf; {self.kind} has its own (remove it)")
        if self.kind == "openai" and not self.base_urls:
            raise RecipeError(f"{key}.kind=openai needs {key}.base_urls, e.g. [http://127.0.0.1:8000]")
        if self.kind in ("hf", "vllm") and not self.model.path:
            raise RecipeError(f"{key}.kind={self.kind} needs {key}.model.path (a local directory or hub name)")
        self.model.check(f"{key}.model")
        if self.kind == "vllm":  # vLLM's own bounds, checked before any GPU work starts
            if not 0 < self.gpu_memory_utilization <= 1:
                raise RecipeError(
                    f"{key}.gpu_memory_utilization={self.gpu_memory_utilization} must lie in (0, 1]; colocated "
                    "with training, leave room for the trainer (e.g. 0.3)"
                )
            check_positive(f"{key}.tensor_parallel_size", self.tensor_parallel_size)
            if self.max_model_len < 0:
                raise RecipeError(f"{key}.max_model_len={self.max_model_len} must be >= 0 (0 = the model's)")
            self._check_vllm_scheduler(key)

    def _check_vllm_scheduler(self, key: str) -> None:
        """vLLM's scheduler bounds and sleep level, refused here rather than when vLLM starts on a GPU."""
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            value = getattr(self, name)
            if value < 0:
                raise RecipeError(f"{key}.{name}={value} must be >= 0 (0 = vLLM's own default)")
        tokens, seqs = self.max_num_batched_tokens, self.max_num_seqs
        if tokens and seqs and tokens < seqs:
            raise RecipeError(
                f"{key}.max_num_batched_tokens={tokens} must be >= {key}.max_num_seqs={seqs} (vLLM refuses "
                "fewer tokens per step than sequences): raise the one or lower the other"
            )
        if self.sleep_level not in (1, 2):
            raise RecipeError(
                f"{key}.sleep_level={self.sleep_level} must be 1 (weights copied to the CPU while asleep) "
                "or 2 (weights dropped; the sync after each update rewrites them)"
            )


@dataclass
class SamplingConfig:
    """Sampling for one generation call."""

    temperature: float = setting(1.0, "0 = greedy")
    top_p: float = setting(
        1.0, "nucleus sampling: only the most likely tokens whose probabilities sum to top_p (1 = off)"
    )
    max_new_tokens: int = setting(500, "per turn for the policy; per call for the simulator")

    def check(self, key: str) -> None:
        # The bounds of vLLM's SamplingParams (0.32-0.33) for every engine, so a recipe samples
        # the same distribution whichever engine runs it.
        self.check_temperature(f"{key}.temperature", self.temperature)
        check_range(f"{key}.top_p", self.top_p, 1e-6, 1.0)
        check_positive(f"{key}.max_new_tokens", self.max_new_tokens)

    @staticmethod
    def check_temperature(key: str, value: float) -> None:
        """Refuses a temperature an engine would refuse or change: it must be 0 (greedy) or in [0.01, 2].

        vLLM's `SamplingParams` rejects values above 2 (so does the OpenAI API) and raises values
        below 0.01 to 0.01; the transformers engine would sample with them as given.
        """
        if value != 0 and not 0.01 <= value <= 2.0:  # NaN fails too
            raise RecipeError(
                f"{user_key(key)}={value} must be 0 (greedy) or lie in [0.01, 2] (vLLM's bounds: it refuses "
                "more than 2 and raises less than 0.01 to 0.01)"
            )
