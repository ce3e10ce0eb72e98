"""Typed recipes: one dataclass tree per command, loaded from YAML with OmegaConf.

A recipe file maps 1:1 onto these dataclasses. `load_recipe` merges the YAML and `key=value`
overrides onto the schema, so an unknown key, a wrong type or a missing required value fails
before any work starts, with the file, the key and a fix in the message. Invariants that span
fields are checked in `__post_init__`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import yaml
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from simsearch.curriculum.schedules import GRANULARITIES, SCHEDULE_KINDS
from simsearch.data.rendering import RENDER_STYLES, VERBATIM_STYLE
from simsearch.data.templates import TEMPLATE_NAMES
from simsearch.errors import RecipeError
from simsearch.eval.metrics import NORMALIZATIONS
from simsearch.policy.rewards import REWARD_NAMES
from simsearch.simulator.prompts import PRESETS
from simsearch.simulator.sft_data import OUTCOME_METRICS, TARGETS

RECIPE_TEMPLATES = tuple(name for name in TEMPLATE_NAMES if name not in ("direct", "rag"))
"""Policy templates a recipe may name; `simsearch eval` runs the direct and RAG baselines itself."""


def _key(name: str) -> str:
    # sections check themselves under their own key; top-level recipes pass key="".
    return name.lstrip(".")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise RecipeError(f"{_key(name)}={value!r} is not one of {', '.join(choices)}")


def _check_range(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise RecipeError(f"{_key(name)}={value} must lie in [{low}, {high}]")


def _check_shows(name: str, shown: bool, preset: str) -> None:
    if not shown and PRESETS[preset].always_shows_context:
        raise RecipeError(
            f"{name}=false: preset={preset} always shows the question and the answer; use preset=simsearch or custom"
        )


def _check_positive(name: str, value: float) -> None:
    if value <= 0:
        raise RecipeError(f"{_key(name)}={value} must be > 0")


def _check_threads(value: int) -> None:
    if value < 0:
        raise RecipeError(f"threads={value} must be >= 0 (0 = torch's default: every core)")


def _check_grace(key: str, value: float) -> None:
    if not value >= 0:  # also refuses NaN
        raise RecipeError(f"{key}={value} must be >= 0 seconds (0 = no limit)")


RESUME_MODES = ("true", "false", "force")
"""`resume` of train and simulator finetune: continue | start over | continue with a changed recipe."""


def _resume_mode(value: str) -> str:
    """The `resume` value, lower-cased (YAML's `true` reaches a str field as "True"), checked."""
    mode = str(value).lower()
    _check_choice("resume", mode, RESUME_MODES)
    return mode


# --------------------------------------------------------------------------- models & engines


@dataclass
class ModelConfig:
    """A Hugging Face causal LM."""

    path: str = ""  # local directory or hub name; required wherever the model is used
    adapter: str | None = None  # optional PEFT adapter directory loaded on top
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    device: str = "cpu"  # cpu | cuda | cuda:N

    def check(self, key: str) -> None:
        _check_choice(f"{key}.dtype", self.dtype, ("auto", "float32", "bfloat16", "float16"))


@dataclass
class GenerationConfig:
    """A text-generation engine: transformers in-process, an OpenAI-compatible server, or vLLM."""

    kind: str = "hf"  # a name in factory.build.GENERATION_ENGINES (hf: transformers in process)
    model: ModelConfig = field(default_factory=ModelConfig)
    batch_size: int = 64  # hf: prompts per forward batch
    compile: bool = False  # hf: decode over a static KV cache under torch.compile (CUDA graphs; docs/performance.md)
    base_urls: list[str] = field(default_factory=list)  # openai: server URLs (load balanced)
    served_model_name: str = ""  # openai: the model name the server expects
    api_key_env: str | None = None  # openai: environment variable holding the API key
    chat: bool = False  # openai: use /v1/chat/completions (needed by chat-template prompts)
    timeout_s: float = 120.0  # openai: per-request timeout
    max_retries: int = 3  # openai: bounded retries before a clear error
    backoff_s: float = 1.0  # openai: first backoff, doubled each retry
    max_concurrency: int = 8  # openai: requests in flight at once
    gpu_memory_utilization: float = 0.5  # vllm: share of GPU memory for weights + KV cache
    tensor_parallel_size: int = 1  # vllm: GPUs per engine
    enable_sleep_mode: bool = False  # vllm: free GPU memory between rollouts (colocated training)
    max_model_len: int = 0  # vllm: context length (0 = the model's)

    def check(self, key: str) -> None:
        from simsearch.factory.build import GENERATION_ENGINES  # here: that module imports this one

        _check_choice(f"{key}.kind", self.kind, tuple(GENERATION_ENGINES))
        _check_positive(f"{key}.batch_size", self.batch_size)
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
            _check_positive(f"{key}.tensor_parallel_size", self.tensor_parallel_size)
            if self.max_model_len < 0:
                raise RecipeError(f"{key}.max_model_len={self.max_model_len} must be >= 0 (0 = the model's)")


@dataclass
class SamplingConfig:
    """Sampling for one generation call."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    max_new_tokens: int = 500  # per turn for the policy; per call for the simulator

    def check(self, key: str) -> None:
        # The bounds of vLLM's SamplingParams (0.32-0.33) for every engine, so a recipe samples
        # the same distribution whichever engine runs it.
        self.check_temperature(f"{key}.temperature", self.temperature)
        _check_range(f"{key}.top_p", self.top_p, 1e-6, 1.0)
        _check_positive(f"{key}.max_new_tokens", self.max_new_tokens)

    @staticmethod
    def check_temperature(key: str, value: float) -> None:
        """Refuses a temperature an engine would refuse or change: it must be 0 (greedy) or in [0.01, 2].

        vLLM's `SamplingParams` rejects values above 2 (so does the OpenAI API) and raises values
        below 0.01 to 0.01; the transformers engine would sample with them as given.
        """
        if value != 0 and not 0.01 <= value <= 2.0:  # NaN fails too
            raise RecipeError(
                f"{_key(key)}={value} must be 0 (greedy) or lie in [0.01, 2] (vLLM's bounds: it refuses "
                "more than 2 and raises less than 0.01 to 0.01)"
            )


# --------------------------------------------------------------------------- search


@dataclass
class SimulatorConfig:
    """An LLM that plays search engine (ZeroSearch)."""

    preset: str = "simsearch"  # a name in simulator.prompts.PRESETS
    useful_template: str = ""  # presets that need templates (custom): {query} {question} {answers} {top_k}
    noisy_template: str = ""  # preset=custom: the noisy counterpart
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    chat: bool = False  # hf: send prompts through the simulator's chat template (openai: generation.chat)
    temperature: float = 0.8  # ZeroSearch samples the simulator at 0.8
    max_new_tokens: int = 600  # ZeroSearch's max_tokens for the simulator
    show_question: bool = True  # false: the prompt leaves out the question (simsearch, simsearch-brief, custom)
    show_answer: bool = True  # false: not told the answer, it writes what it learned of the world (idem)

    def check(self, key: str) -> None:
        _check_choice(f"{key}.preset", self.preset, tuple(PRESETS))
        _check_shows(f"{key}.show_question", self.show_question, self.preset)
        _check_shows(f"{key}.show_answer", self.show_answer, self.preset)
        if PRESETS[self.preset].needs_templates and not (self.useful_template and self.noisy_template):
            raise RecipeError(f"{key}.preset={self.preset} needs both {key}.useful_template and {key}.noisy_template")
        self.generation.check(f"{key}.generation")
        SamplingConfig.check_temperature(f"{key}.temperature", self.temperature)
        _check_positive(f"{key}.max_new_tokens", self.max_new_tokens)
        if PRESETS[self.preset].needs_chat and not (self.chat or self.generation.chat):
            raise RecipeError(
                f"{key}.preset=zerosearch is sent through the simulator's chat template: set "
                f"{key}.chat=true (hf) or {key}.generation.chat=true (openai)"
            )


@dataclass
class SearchConfig:
    """A search engine: a real retriever, the simulator, or none (self-search)."""

    kind: str = "bm25"  # a name in factory.build.SEARCH_ENGINES (self: self-search, no engine)
    top_k: int = 3  # documents per search
    corpus: str = ""  # bm25/dense/random: corpus JSONL ({id, contents} or {id, title, text})
    index_dir: str = ""  # bm25/dense: where the index is saved; built on first use when empty
    embedding_model: str = ""  # dense: sentence-transformers model; "" = embedded all-MiniLM-L6-v2
    query_prefix: str = ""  # dense: e.g. "query: " for e5 models
    passage_prefix: str = ""  # dense: e.g. "passage: " for e5 models
    use_faiss: bool = False  # dense: FAISS flat inner product instead of numpy (needs [faiss])
    url: str = ""  # http: a Search-R1 /retrieve endpoint; serper/serpapi: override the API URL
    api_key_env: str = ""  # serper/serpapi: variable with the key ("" = their default); http: bearer token
    timeout_s: float = 30.0  # http/web: per-request timeout
    max_retries: int = 3  # http/web: bounded retries before a clear error
    backoff_s: float = 1.0  # http/web: first backoff, doubled each retry
    cache: str = ""  # SQLite file caching results across runs ("" = no cache)
    rendering: str = "search-r1"  # how the policy reads documents: data.rendering.RENDER_STYLES (docs there)
    simulator: SimulatorConfig = field(default_factory=SimulatorConfig)  # kind=simulator
    # $ per 1,000 queries sent (cache hits are free); null = the kind's documented default
    # (retrieval.accounting.QUERY_PRICES: 0 for local engines, unknown where none is documented).
    price_per_1k_queries: float | None = None
    gpu_hour_price: float | None = None  # simulator: $ per hour of the GPUs serving it (all of them); null = unknown

    def check(self, key: str) -> None:
        from simsearch.factory.build import SEARCH_ENGINES  # here: that module imports this one

        _check_choice(f"{key}.kind", self.kind, tuple(SEARCH_ENGINES))
        _check_positive(f"{key}.top_k", self.top_k)
        for name in ("price_per_1k_queries", "gpu_hour_price"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise RecipeError(f"{key}.{name}={value} must be >= 0 (or null: unknown)")
        _check_choice(f"{key}.rendering", self.rendering, RENDER_STYLES)
        if self.rendering == VERBATIM_STYLE and self.kind != "simulator":
            raise RecipeError(
                f"{key}.rendering={VERBATIM_STYLE} shows the simulator's own text and needs {key}.kind=simulator; "
                f"for {self.kind} results use search-r1, or zerosearch-google for serpapi/serper"
            )
        if self.kind in ("bm25", "dense", "random") and not self.corpus:
            raise RecipeError(f"{key}.kind={self.kind} needs {key}.corpus (a JSONL file of passages)")
        if self.kind == "http" and not self.url:
            raise RecipeError(f"{key}.kind=http needs {key}.url, e.g. http://127.0.0.1:8000/retrieve")
        if self.kind == "simulator":
            self.simulator.check(f"{key}.simulator")


@dataclass
class CurriculumConfig:
    """How the probability that a search returns noisy documents moves over training."""

    kind: str = "exponential"  # a name in curriculum.schedules.SCHEDULE_KINDS (ZeroSearch's is exponential)
    p_start: float = 0.0  # p_noise at step 0 (constant: the value throughout)
    p_end: float = 0.5  # p_noise at total_steps (ZeroSearch README: 0.5)
    base: float = 4.0  # exponential: b in p_s + (b^(i/m) - 1)/(b - 1)(p_e - p_s)
    total_steps: int = 0  # steps over which p moves; 0 = the trainer's total steps
    milestones: list[int] = field(default_factory=list)  # step: steps where p changes
    values: list[float] = field(default_factory=list)  # step: p from each milestone on
    target_reward: float = 0.5  # adaptive: raise p when the recent mean reward passes this
    collapse_reward: float = 0.1  # adaptive: lower p when it falls under this
    delta: float = 0.05  # adaptive: change of p per adjustment
    window: int = 10  # adaptive: steps in the reward average
    p_min: float = 0.0  # adaptive: lower bound
    p_max: float = 0.9  # adaptive: upper bound
    granularity: str = "call"  # a name in curriculum.schedules.GRANULARITIES (call: ZeroSearch's one flip per search)

    def check(self, key: str) -> None:
        _check_choice(f"{key}.kind", self.kind, SCHEDULE_KINDS)
        _check_choice(f"{key}.granularity", self.granularity, tuple(GRANULARITIES))
        _check_range(f"{key}.p_start", self.p_start, 0.0, 1.0)
        _check_range(f"{key}.p_end", self.p_end, 0.0, 1.0)
        if self.kind == "exponential" and (self.base <= 0 or self.base == 1):
            raise RecipeError(f"{key}.base={self.base} must be > 0 and != 1 (ZeroSearch: 4)")
        if self.total_steps < 0:
            raise RecipeError(f"{key}.total_steps={self.total_steps} must be >= 0 (0 = the run's steps)")
        if self.kind == "adaptive" and not (0 <= self.p_min <= self.p_max <= 1 and self.window >= 1):
            raise RecipeError(f"{key}: adaptive needs 0 <= p_min <= p_max <= 1 and window >= 1")
        if self.kind == "step" and len(self.milestones) != len(self.values):
            raise RecipeError(f"{key}.kind=step needs as many {key}.values as {key}.milestones")


# --------------------------------------------------------------------------- policy & RL


@dataclass
class RolloutConfig:
    """The multi-turn agent loop."""

    # Policy prompt, from simsearch.data.templates (docs there; "direct" and "rag" are evaluation baselines).
    # search-r1-auto: Search-R1's text through the chat template exactly when the tokenizer has one, as
    # Search-R1 and ZeroSearch do; search-r1: never (the quickstart's default); search-r1-chat: always.
    template: str = "search-r1"
    max_turns: int = 2  # search turns before the final answer turn (ZeroSearch paper: 2)
    max_obs_tokens: int = 512  # tokens of one <information> block before truncation
    max_context_tokens: int = 4096  # prompt + response tokens per trajectory
    group_size: int = 5  # rollouts per prompt (GRPO's G)
    self_search_real_share: float = 0.0  # self-search: share of questions whose searches `search` answers

    def check(self, key: str) -> None:
        _check_choice(f"{key}.template", self.template, RECIPE_TEMPLATES)
        _check_positive(f"{key}.group_size", self.group_size)
        if self.max_turns < 0:
            raise RecipeError(f"{key}.max_turns={self.max_turns} must be >= 0")
        _check_range(f"{key}.self_search_real_share", self.self_search_real_share, 0.0, 1.0)
        if self.self_search_real_share > 0 and self.template != "self-search":
            raise RecipeError(
                f"{key}.self_search_real_share={self.self_search_real_share:g} only applies to "
                f"{key}.template=self-search; set it to 0 or switch the template"
            )


@dataclass
class RewardConfig:
    """The reward: a weighted sum of named components."""

    # name -> weight, names from simsearch.policy.rewards.REWARD_NAMES (format is ours,
    # ssrl_format SSRL's exact rule); empty = {f1: 1.0}, ZeroSearch's reward (see `resolved_weights`).
    # (A non-empty default would be merged into, not replaced by, a recipe's own weights.)
    weights: dict[str, float] = field(default_factory=dict)
    # How answers are normalized before em / substring_em / f1 (simsearch.eval.metrics).
    # squad by default: the SQuAD v1.1 rule Search-R1, ZeroSearch and SSRL train with, so a reward
    # means what theirs means; unicode (ours) also deletes non-ASCII punctuation and never
    # matches a gold answer that normalizes to "".
    normalization: str = "squad"
    # DAPO's overlong reward shaping (policy.rewards.overlong_penalty): a trajectory whose prompt +
    # response tokens L come within overlong_buffer tokens of rollout.max_context_tokens (L_max; one the
    # context cut counts as L_max) gets overlong_penalty x (L_max - buffer - L) / buffer added; 0 = off
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0  # the penalty at the limit (DAPO's penalty_factor)

    def check(self, key: str) -> None:
        for name in self.weights:
            _check_choice(f"{key}.weights key", name, REWARD_NAMES)
        _check_choice(f"{key}.normalization", self.normalization, tuple(NORMALIZATIONS))
        if not any(self.resolved_weights().values()):
            raise RecipeError(f"{key}.weights are all 0: give at least one a weight, e.g. {{f1: 1.0}}")
        if self.overlong_buffer < 0:
            raise RecipeError(f"{key}.overlong_buffer={self.overlong_buffer} must be >= 0 tokens (0 = off)")
        if not 0 <= self.overlong_penalty < float("inf"):  # also refuses NaN
            raise RecipeError(f"{key}.overlong_penalty={self.overlong_penalty} must be finite and >= 0 (DAPO: 1.0)")

    def resolved_weights(self) -> dict[str, float]:
        """The weights the reward uses: `weights`, or ZeroSearch's {f1: 1.0} when it is empty."""
        return dict(self.weights) or {"f1": 1.0}


@dataclass
class AlgorithmConfig:
    """Advantage estimator and loss."""

    estimator: str = "grpo"  # a name in policy.advantages.ESTIMATORS
    clip_low: float = 0.2  # PPO ratio clip below 1
    clip_high: float = 0.2  # PPO ratio clip above 1 (asymmetric when != clip_low)
    # dual-clip PPO (verl's clip_ratio_c, its default 3.0): at negative advantages the loss is
    # capped at -A x clip_ratio_c, so a token whose ratio ran past it stops pushing; 0 = off, else > 1
    clip_ratio_c: float = 0.0
    kl_coef: float = 0.001  # weight of KL to the frozen reference (0 = no reference model)
    kl_estimator: str = "k3"  # per-token KL estimate: a name in policy.losses.KL_ESTIMATORS (k3: verl's low_var_kl)
    kl_in_reward: bool = False  # fold KL into the token reward instead of the loss
    entropy_coef: float = 0.0  # entropy bonus
    loss_agg: str = "token-mean"  # a name in policy.losses.LOSS_AGGREGATIONS
    gamma: float = 1.0  # discount (PPO / REINFORCE++)
    lam: float = 1.0  # GAE lambda
    value_clip: float = 0.2  # PPO value clip
    value_coef: float = 0.5  # PPO value loss weight
    critic_lr: float = 1e-5  # PPO critic learning rate
    # PPO critic warm-up, a share of `steps` (verl's critic.optim.lr_warmup_steps_ratio: 0.015 in
    # ZeroSearch's and Search-R1's PPO scripts); None = the actor's (optim.warmup_steps / warmup_ratio)
    critic_warmup_ratio: float | None = None
    stratified_alpha: float = 0.5  # stratified GRPO: weight of the within-stratum advantage
    # IGPO: discount of a turn's advantage over the turns that follow it, in [0, 1] (the paper's 1.0)
    igpo_gamma: float = 1.0
    ppo_epochs: int = 1  # passes over each batch (verl's ppo_epochs)
    # trajectories per optimizer step over all processes; 0 = the whole batch. verl's
    # ppo_mini_batch_size counts prompts: ours = ppo_mini_batch_size x rollout.n (its group size)
    minibatch_size: int = 0
    # truncated importance sampling: weight each token by min(p_trainer / p_rollout, tis_cap),
    # correcting for a rollout engine (vLLM) that samples slightly off the trainer; 0 = off, else >= 1
    tis_cap: float = 0.0
    # DAPO's dynamic sampling (policy.sampling): drop the groups whose rewards are all equal and roll out
    # the next prompts of the data stream, round after round, until prompts_per_step informative groups;
    # only with an estimator whose flat groups get no gradient (ESTIMATORS' flat_groups_are_silent)
    dynamic_sampling: bool = False
    max_sampling_rounds: int = 3  # rollout rounds per step at most, the first included (verl: max_num_gen_batches)
    # importance ratio the loss clips: a name in policy.losses.RATIO_LEVELS (sequence = GSPO's
    # length-normalized sequence ratio; it differs from token only when a batch makes several updates)
    ratio_level: str = "token"
    # Mini-o3's over-turn masking: trajectories still searching when the turns or context ran out
    # (types.OVER_TURN) get loss mask 0 instead of being trained on their reward of 0
    mask_unfinished: bool = False
    # with mask_unfinished, also mask give-ups (finish gave_up: the final turn neither searched nor answered)
    mask_gave_up: bool = False

    def check(self, key: str) -> None:
        # Imported here, not at the top: the tables' modules need torch, which `import simsearch.config`
        # (and so `simsearch --help`) must not pay for.
        from simsearch.policy.advantages import ESTIMATORS
        from simsearch.policy.losses import KL_ESTIMATORS, LOSS_AGGREGATIONS, RATIO_LEVELS

        _check_choice(f"{key}.estimator", self.estimator, tuple(ESTIMATORS))
        _check_choice(f"{key}.kl_estimator", self.kl_estimator, tuple(KL_ESTIMATORS))
        if self.clip_ratio_c != 0 and not self.clip_ratio_c > 1:  # `not >` also refuses NaN
            raise RecipeError(
                f"{key}.clip_ratio_c={self.clip_ratio_c} must be 0 (no dual clip) or > 1 (a bound on the ratio "
                "above the clip range); verl's default is 3.0"
            )
        _check_choice(f"{key}.loss_agg", self.loss_agg, tuple(LOSS_AGGREGATIONS))
        _check_positive(f"{key}.ppo_epochs", self.ppo_epochs)
        for name in ("kl_coef", "entropy_coef", "value_coef"):
            if not getattr(self, name) >= 0:  # `not >=` also refuses NaN
                raise RecipeError(f"{key}.{name}={getattr(self, name)} must be >= 0 (0 = off)")
        _check_choice(f"{key}.ratio_level", self.ratio_level, tuple(RATIO_LEVELS))
        _check_range(f"{key}.igpo_gamma", self.igpo_gamma, 0.0, 1.0)
        if ESTIMATORS[self.estimator].information_gain and self.kl_in_reward:
            raise RecipeError(
                f"{key}.kl_in_reward=true with {key}.estimator={self.estimator}: its turn rewards take no KL "
                "penalty; keep the KL in the loss (kl_in_reward=false), as the IGPO paper does"
            )
        if self.critic_warmup_ratio is not None:
            _check_range(f"{key}.critic_warmup_ratio", self.critic_warmup_ratio, 0.0, 1.0)
        if self.tis_cap != 0 and not self.tis_cap >= 1:  # `not >=` also refuses NaN
            raise RecipeError(
                f"{key}.tis_cap={self.tis_cap} must be 0 (no correction) or >= 1 (a token the rollout "
                "and the trainer agree on keeps weight 1); the usual cap is 2"
            )
        if self.max_sampling_rounds < 1:
            raise RecipeError(
                f"{key}.max_sampling_rounds={self.max_sampling_rounds} must be >= 1 (rollout rounds per step, the "
                "first included); there is no unbounded setting (verl's max_num_gen_batches=0)"
            )
        if self.mask_gave_up and not self.mask_unfinished:
            raise RecipeError(
                f"{key}.mask_gave_up=true masks give-ups only alongside over-turn masking: "
                f"set {key}.mask_unfinished=true too"
            )


@dataclass
class OptimConfig:
    """AdamW with warmup and decay."""

    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    # Schedule steps of linear warm-up. `simsearch train` steps its schedule once per training
    # step (after all of that step's minibatch updates), as verl does, so these are training steps.
    warmup_steps: int = 0
    # Or the share of the run's `steps` spent warming up: int(warmup_ratio x steps) steps, verl's
    # `optim.lr_warmup_steps_ratio` with its rounding; exclusive with warmup_steps
    warmup_ratio: float = 0.0
    schedule: str = "constant"  # constant | linear | cosine (decay after warmup)
    grad_clip: float = 1.0

    def check(self, key: str) -> None:
        _check_positive(f"{key}.lr", self.lr)
        _check_choice(f"{key}.schedule", self.schedule, ("constant", "linear", "cosine"))
        if self.warmup_steps < 0:
            raise RecipeError(f"{key}.warmup_steps={self.warmup_steps} must be >= 0")
        _check_range(f"{key}.warmup_ratio", self.warmup_ratio, 0.0, 1.0)
        if self.warmup_steps > 0 and self.warmup_ratio > 0:
            raise RecipeError(
                f"{key}.warmup_steps={self.warmup_steps} and {key}.warmup_ratio={self.warmup_ratio} both set "
                "the warm-up: keep one (warmup_ratio for a share of the run, as verl's lr_warmup_steps_ratio)"
            )

    def warmup_for(self, total_steps: int) -> int:
        """Warm-up steps of a run of `total_steps`: `warmup_steps`, or int(warmup_ratio x total_steps)."""
        return self.warmup_steps or int(self.warmup_ratio * total_steps)


@dataclass
class LoraConfig:
    """PEFT LoRA; disabled when r = 0."""

    r: int = 0
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    merge_on_save: bool = False  # write merged full weights instead of the adapter


@dataclass
class DeepSpeedConfig:
    """DeepSpeed ZeRO; disabled when stage = 0."""

    stage: int = 0  # 0 (off) | 2 | 3
    offload_optimizer: bool = False  # ZeRO: optimizer state on CPU
    offload_params: bool = False  # ZeRO-3: parameters on CPU

    def check(self, key: str) -> None:
        if self.stage not in (0, 2, 3):
            raise RecipeError(f"{key}.stage={self.stage} must be 0 (off), 2 or 3")


@dataclass
class DataConfig:
    """QA data for training or collection."""

    train: list[str] = field(default_factory=list)  # FlashRAG JSONL/Parquet or verl Parquet files
    val: list[str] = field(default_factory=list)  # held-out files for validation
    val_size: int = 0  # validation questions per file; 0 = all


# --------------------------------------------------------------------------- commands


@dataclass
class TrainRecipe:
    """`simsearch train`: curriculum RL of a search agent."""

    seed: int = 0
    run_dir: str = MISSING  # where metrics, checkpoints and the resolved recipe go
    policy: GenerationConfig = field(default_factory=GenerationConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    data: DataConfig = field(default_factory=DataConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    val_search: SearchConfig | None = None  # engine for validation (default: `search`)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    steps: int = 200  # optimizer steps (ZeroSearch: 203)
    prompts_per_step: int = 64  # questions per step; trajectories = prompts_per_step x group_size
    micro_batch_size: int = 8  # trajectories per forward/backward pass (gradient accumulation)
    gradient_checkpointing: bool = False
    bf16: bool = False  # bf16 autocast where the hardware has it
    save_every: int = 50  # steps between checkpoints (0 = only at the end)
    eval_every: int = 0  # steps between validations (0 = never)
    # true: continue from the run directory's last checkpoint if there is one, refused when the recipe
    # differs from its recipe.yaml | false: start over | force: continue and apply the changed recipe
    # (the change is recorded in recipe_changes.jsonl)
    resume: str = "true"
    threads: int = 1  # torch threads, as the quickstart's (0 = torch's default: every core)
    tensorboard: bool = True
    wandb_project: str = ""  # log to Weights & Biases too (needs [wandb])
    trajectory_samples: int = 4  # trajectories per sampled step written to trajectories.jsonl (0 = none)
    trajectory_every: int = 10  # steps between samples (and always the first and last step)
    # SIGTERM / SIGINT: seconds the step in flight may take to finish before the run stops at once (0 = no limit)
    stop_grace_s: float = 60.0

    def check(self, key: str) -> None:
        self.resume = _resume_mode(self.resume)
        _check_threads(self.threads)
        _check_grace("stop_grace_s", self.stop_grace_s)
        self.policy.check("policy")
        self._check_policy_is_trainable()
        self.sampling.check("sampling")
        self.search.check("search")
        if self.trajectory_samples < 0:
            raise RecipeError(f"trajectory_samples={self.trajectory_samples} must be >= 0 (0 = none)")
        _check_positive("trajectory_every", self.trajectory_every)
        if self.val_search is not None:
            self.val_search.check("val_search")
        self.curriculum.check("curriculum")
        self.rollout.check("rollout")
        self.reward.check("reward")
        self.algorithm.check("algorithm")
        self.optim.check("optim")
        self.deepspeed.check("deepspeed")
        _check_positive("steps", self.steps)
        _check_positive("prompts_per_step", self.prompts_per_step)
        _check_positive("micro_batch_size", self.micro_batch_size)
        if self.sampling.temperature == 0:
            # The trainer's log-probs are those of softmax(logits / temperature), the sampled distribution.
            raise RecipeError(
                "sampling.temperature=0 samples greedily: a group's rollouts would all be the same and there is "
                "no sampling distribution to train; set sampling.temperature > 0 (the papers use 1.0)"
            )
        if not self.data.train:
            raise RecipeError("data.train is empty: list at least one QA file")
        batch = self.prompts_per_step * self.rollout.group_size
        mb = self.algorithm.minibatch_size
        if mb and batch % mb:
            raise RecipeError(
                f"algorithm.minibatch_size={mb} must divide prompts_per_step x rollout.group_size "
                f"= {batch}; pick a divisor of {batch}"
            )
        if self.search.kind == "self" and self.rollout.template != "self-search":
            raise RecipeError("search.kind=self needs rollout.template=self-search")
        context = self.rollout.max_context_tokens
        if self.policy.kind == "vllm" and 0 < self.policy.max_model_len < context:
            # A later turn's prompt is the whole trajectory so far: up to max_context_tokens.
            raise RecipeError(
                f"policy.max_model_len={self.policy.max_model_len} is below rollout.max_context_tokens={context}: "
                f"vLLM would refuse the later turns of long trajectories; set policy.max_model_len >= {context} "
                "(or 0 for the model's own)"
            )
        if self.reward.overlong_buffer >= context:
            # DAPO's penalty grows over the last overlong_buffer tokens before L_max: it needs room to start.
            raise RecipeError(
                f"reward.overlong_buffer={self.reward.overlong_buffer} must be below "
                f"rollout.max_context_tokens={context} (L_max, where the penalty is full); lower the buffer "
                "(DAPO: 4096 of 20480) or raise max_context_tokens"
            )
        self._check_algorithm_with_groups()

    def _check_algorithm_with_groups(self) -> None:
        """The algorithm's options that depend on the rollout's groups."""
        from simsearch.policy.advantages import ESTIMATORS  # torch-heavy: see AlgorithmConfig.check

        # self.algorithm.check (above) has refused an estimator name ESTIMATORS does not hold.
        alg, group = self.algorithm, self.rollout.group_size
        estimator = ESTIMATORS[alg.estimator]
        batch = self.prompts_per_step * group
        if alg.ratio_level != "token" and alg.ppo_epochs == 1 and alg.minibatch_size in (0, batch):
            # one on-policy update per batch: every ratio is 1 and GSPO's loss and gradient are GRPO's
            raise RecipeError(
                f"algorithm.ratio_level={alg.ratio_level} changes nothing when each batch makes one optimizer step "
                f"(every ratio is 1): algorithm.minibatch_size={alg.minibatch_size} with ppo_epochs=1 trains the "
                f"{batch} trajectories at once; set algorithm.minibatch_size to a smaller divisor of {batch} or "
                "algorithm.ppo_epochs > 1, or keep algorithm.ratio_level=token"
            )
        if alg.dynamic_sampling and group < 2:
            raise RecipeError(
                f"algorithm.dynamic_sampling=true with rollout.group_size={group}: a group of one rollout is never "
                "flat, so there is nothing to drop; set rollout.group_size >= 2 or dynamic_sampling=false"
            )
        if estimator.compares_group and group < 2:
            raise RecipeError(
                f"algorithm.estimator={alg.estimator} compares rollouts of one prompt: set rollout.group_size >= 2"
            )
        if alg.dynamic_sampling and not estimator.flat_groups_are_silent:
            why = (
                "a group whose outcomes are all equal still has its turns' information gains to learn from"
                if estimator.information_gain
                else "it has no group baseline, so a group whose rewards are all equal still carries a gradient"
            )
            silent = ", ".join(name for name, e in ESTIMATORS.items() if e.flat_groups_are_silent)
            raise RecipeError(
                f"algorithm.dynamic_sampling=true with algorithm.estimator={alg.estimator}: {why}, and dropping it "
                f"would lose that signal; use it with {silent}, or set dynamic_sampling=false"
            )

    def _check_policy_is_trainable(self) -> None:
        if self.policy.kind == "openai":
            raise RecipeError(
                "policy.kind='openai': the trainer loads its updated weights into the rollout engine after every "
                "step, which a served model cannot take; set policy.kind=hf (in-process transformers) or "
                "policy.kind=vllm (in-process vLLM, on GPU)"
            )
        if self.policy.model.adapter:
            raise RecipeError(
                "policy.model.adapter: merge the adapter into the base model and point policy.model.path at it"
            )


@dataclass
class EvalDataset:
    """One QA set to evaluate on."""

    name: str = MISSING  # column name in the tables (nq, hotpotqa, ...)
    path: str = MISSING  # local file (FlashRAG JSONL/Parquet or verl Parquet), or a FlashRAG folder with `split`
    split: str | None = None  # for a folder: which file to read (test -> test.jsonl|json|parquet)
    limit: int = 0  # first N questions only (0 = all)


EVAL_BASELINES = ("direct", "rag")
"""The baseline rows `simsearch eval` runs itself (`EvalRecipe.baselines`)."""

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # eval row and dataset names name files


@dataclass
class EvalRecipe:
    """`simsearch eval`: one policy x several engines x several datasets."""

    seed: int = 0
    run_dir: str = MISSING
    policy: GenerationConfig = field(default_factory=GenerationConfig)
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=0.0))
    n: int = 1  # samples per question (pass@n when > 1)
    datasets: list[EvalDataset] = field(default_factory=list)
    engines: dict[str, SearchConfig] = field(default_factory=dict)  # row name -> engine
    noisy_share: float = 0.0  # simulator engines: probability a search is noisy
    baselines: list[str] = field(default_factory=list)  # direct | rag
    rag_engine: str = ""  # which of `engines` feeds the RAG baseline (default: the first)
    rollout: RolloutConfig = field(default_factory=lambda: RolloutConfig(group_size=1))
    training_run: str = ""  # a train run directory whose curves go in the report
    chunk_size: int = 64  # questions per rollout call; rows are appended after each chunk (the resume unit)
    fidelity_size: int = 100  # questions per dataset in the simulator-fidelity section (0 = skip it)
    # How answers are normalized before em / substring_em / f1 (simsearch.eval.metrics), named
    # under every table. squad by default: the SQuAD v1.1 rule Search-R1, ZeroSearch and SSRL
    # score with, so a table compares with theirs; unicode (ours) also deletes non-ASCII
    # punctuation and never matches a gold answer that normalizes to "".
    normalization: str = "squad"
    threads: int = 1  # torch threads, as the quickstart's (0 = torch's default: every core)
    # SIGTERM / SIGINT: seconds the chunk in flight may take to finish before eval stops at once (0 = no limit)
    stop_grace_s: float = 60.0

    def check(self, key: str) -> None:
        _check_threads(self.threads)
        _check_grace("stop_grace_s", self.stop_grace_s)
        self.policy.check("policy")
        _check_choice(f"{key}.normalization", self.normalization, tuple(NORMALIZATIONS))
        self.sampling.check("sampling")
        self.rollout.check("rollout")
        if self.rollout.self_search_real_share:  # eval: the engine decides (evaluate.real_search_share)
            raise RecipeError(
                f"rollout.self_search_real_share={self.rollout.self_search_real_share:g} is a training setting; "
                "in eval a self-search policy writes its own information on an engine of kind=self and "
                "searches any other engine for real (SSRL's sim-to-real): leave it at 0"
            )
        for name, engine in self.engines.items():
            engine.check(f"engines.{name}")
        if not self.datasets:
            raise RecipeError("datasets is empty: list at least one {name, path}")
        _check_range("noisy_share", self.noisy_share, 0.0, 1.0)
        for baseline in self.baselines:
            _check_choice(f"{key}.baselines", baseline, EVAL_BASELINES)
        if "rag" in self.baselines and not self.engines:
            raise RecipeError("baselines: rag retrieves with one of `engines`: add an engine")
        if self.rag_engine and self.rag_engine not in self.engines:
            raise RecipeError(f"rag_engine={self.rag_engine!r} is not one of engines: {list(self.engines)}")
        _check_positive(f"{key}.n", self.n)
        _check_positive(f"{key}.chunk_size", self.chunk_size)  # eval: resume unit
        if self.fidelity_size < 0:  # eval: 0 skips the fidelity section
            raise RecipeError(f"fidelity_size={self.fidelity_size} must be >= 0 (0 skips the fidelity section)")
        if self.n > 1 and self.sampling.temperature == 0:  # eval: greedy samples would be identical
            raise RecipeError(
                f"n={self.n} with sampling.temperature=0 gives {self.n} identical greedy samples: "
                "set sampling.temperature > 0 (e.g. 1.0) for pass@n, or n=1"
            )
        self._check_rows()

    def _check_rows(self) -> None:
        """What the evaluated rows need: a tokenizer, file-safe unique names, engines they really call."""
        if self.policy.kind == "openai" and not self.policy.model.path:
            raise RecipeError(
                "policy.kind=openai needs policy.model.path (the policy's tokenizer: a local directory "
                "or hub name), because the rollout works on token ids"
            )
        for name in self.engines:
            if name in EVAL_BASELINES:
                raise RecipeError(f"engines.{name}: {name!r} is the name of a baseline; rename the engine")
            if not _SAFE_NAME.match(name):
                raise RecipeError(f"engines.{name}: use letters, digits, '.', '_' or '-' (it names a directory)")
        names = [spec.name for spec in self.datasets]
        for name in names:
            if not _SAFE_NAME.match(name):
                raise RecipeError(f"datasets: name {name!r}: use letters, digits, '.', '_' or '-' (it names a file)")
            if names.count(name) > 1:
                raise RecipeError(f"datasets: name {name!r} is used twice; names must be unique")
        for name, cfg in self.engines.items():
            if cfg.kind == "self" and self.rollout.template != "self-search":
                raise RecipeError(f"engines.{name}.kind=self needs rollout.template=self-search")
            if cfg.kind != "self" and self.rollout.max_turns == 0:
                raise RecipeError(
                    f"engines.{name}: rollout.max_turns=0 never runs a search, so row {name!r} would report "
                    f"kind={cfg.kind} without ever calling it; set rollout.max_turns >= 1 (SSRL evaluates "
                    "with real search over 3 turns), or evaluate a self-search policy on an engine of kind=self"
                )
        if "rag" in self.baselines:
            if self.sampling.max_new_tokens >= self.rollout.max_context_tokens:
                raise RecipeError(
                    f"baselines: rag: sampling.max_new_tokens={self.sampling.max_new_tokens} leaves no room for "
                    f"the RAG prompt under rollout.max_context_tokens={self.rollout.max_context_tokens}; raise "
                    "max_context_tokens or lower max_new_tokens"
                )
            rag = self.rag_engine or next(iter(self.engines))
            if self.engines[rag].kind == "self":
                raise RecipeError(
                    f"rag_engine={rag!r} is kind=self; the RAG baseline needs a retriever or the simulator"
                )


@dataclass
class JudgeConfig:
    """Labels a retrieved document set useful or noisy."""

    kind: str = "rule"  # rule: a normalized gold answer is contained | llm: ask a model
    generation: GenerationConfig | None = None  # kind=llm

    def check(self, key: str) -> None:
        _check_choice(f"{key}.kind", self.kind, ("rule", "llm"))
        if self.kind == "llm" and self.generation is None:
            raise RecipeError(f"{key}.kind=llm needs {key}.generation (the judge model)")
        if self.generation is not None:
            self.generation.check(f"{key}.generation")


@dataclass
class CollectRecipe:
    """`simsearch simulator collect`: simulator SFT data from real-search trajectories."""

    seed: int = 0
    run_dir: str = MISSING
    policy: GenerationConfig = field(default_factory=GenerationConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    data: DataConfig = field(default_factory=DataConfig)
    search: SearchConfig = field(default_factory=SearchConfig)  # the real retriever
    rollout: RolloutConfig = field(default_factory=lambda: RolloutConfig(group_size=1))
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    preset: str = "simsearch"  # prompt preset the SFT pairs are rendered with
    show_question: bool = True  # false: prompts leave out the question (as the simulator will run)
    show_answer: bool = True  # false: prompts leave out the gold answer (as the simulator will run)
    # How pairs are labelled (simsearch.simulator.sft_data): trajectory = ZeroSearch's paper (all searches of a
    # trajectory that answered correctly are useful, of one that did not noisy) | judged = ours, by content
    # (judge: does the set hold the answer?) | retrieved = ours, keeps the retriever's query sensitivity.
    target: str = "judged"
    outcome_metric: str = "substring_em"  # trajectory: correct = this is 1 (substring_em: ZeroSearch's "EM" | em)
    contrast_queries: int = 0  # per search, perturbed queries also sent to the retriever (word dropped/cut/swapped)
    # the edits those variants draw from: simulator.sft_data.CONTRAST_EDITS (respell: a word's prefix kept, its
    # ending replaced, as a policy miscopies a name)
    contrast_edits: list[str] = field(default_factory=lambda: ["drop", "cut", "swap"])
    balance: bool = True  # judged, trajectory: equal numbers of useful and noisy pairs
    val_fraction: float = 0.1  # share of questions whose pairs go to validation
    batch_size: int = 64  # questions per rollout call
    max_questions: int = 0  # first N questions of data.train only (0 = all)
    threads: int = 1  # torch threads, as the quickstart's (0 = torch's default: every core)

    def check(self, key: str) -> None:
        _check_threads(self.threads)
        self.policy.check("policy")
        self.sampling.check("sampling")
        self.search.check("search")
        self.rollout.check("rollout")
        self.judge.check("judge")
        if self.search.kind == "self":
            raise RecipeError("search.kind=self: collect records what a search engine returns; pick a retriever")
        if not self.data.train:
            raise RecipeError("data.train is empty: list at least one QA file")
        _check_range("val_fraction", self.val_fraction, 0.0, 0.9)
        _check_choice("preset", self.preset, tuple(name for name, spec in PRESETS.items() if not spec.needs_templates))
        _check_shows("show_question", self.show_question, self.preset)
        _check_shows("show_answer", self.show_answer, self.preset)
        _check_choice("target", self.target, TARGETS)
        _check_choice("outcome_metric", self.outcome_metric, tuple(OUTCOME_METRICS))
        if self.target == "trajectory" and self.contrast_queries:
            raise RecipeError(
                f"contrast_queries={self.contrast_queries} with target=trajectory: contrast queries belong to no "
                "trajectory, so they have no outcome to label them by; set contrast_queries=0 or another target"
            )
        if self.search.rendering != "search-r1" and not PRESETS[self.preset].any_response_style:
            raise RecipeError(
                f"search.rendering={self.search.rendering}: the pairs teach the simulator to write results as "
                f"the policy reads them, but preset {self.preset} asks for `Doc i(Title: t)` lines; use "
                "preset=simsearch-brief (no instructions) or search.rendering=search-r1"
            )
        _check_positive("batch_size", self.batch_size)
        if self.contrast_queries < 0:
            raise RecipeError(f"contrast_queries={self.contrast_queries} must be 0 (off) or more")
        from simsearch.simulator.sft_data import CONTRAST_EDITS  # torch-free

        if not self.contrast_edits:
            raise RecipeError("contrast_edits is empty: list at least one of " + ", ".join(CONTRAST_EDITS))
        for i, edit in enumerate(self.contrast_edits):
            _check_choice(f"contrast_edits[{i}]", edit, CONTRAST_EDITS)
        if self.search.kind in ("simulator", "self"):
            raise RecipeError(f"search.kind={self.search.kind}: collect needs a real retriever")


@dataclass
class FinetuneRecipe:
    """`simsearch simulator finetune`: SFT of the simulator LLM."""

    seed: int = 0
    run_dir: str = MISSING
    model: ModelConfig = field(default_factory=ModelConfig)
    train_file: str = MISSING  # JSONL of {prompt, response} pairs (from `simulator collect`)
    val_file: str = ""
    chat_template: bool = False  # render prompts through the tokenizer's chat template
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-6))
    lora: LoraConfig = field(default_factory=LoraConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    steps: int = 1000  # ZeroSearch: 1000
    batch_size: int = 2  # ZeroSearch: 2
    grad_accum: int = 1
    max_length: int = 1024
    answer_loss_weight: float = 1.0  # loss weight of response tokens spelling a gold answer (1 = plain SFT)
    save_every: int = 0  # 0 = only at the end
    eval_every: int = 100
    gradient_checkpointing: bool = False
    bf16: bool = False
    resume: str = "true"  # true | false | force: as `simsearch train`'s resume
    threads: int = 1  # torch threads, as the quickstart's (0 = torch's default: every core)
    # SIGTERM / SIGINT: seconds the step in flight may take to finish before the run stops at once (0 = no limit)
    stop_grace_s: float = 60.0

    def check(self, key: str) -> None:
        self.resume = _resume_mode(self.resume)
        _check_threads(self.threads)
        _check_grace("stop_grace_s", self.stop_grace_s)
        if not self.model.path:
            raise RecipeError("model.path is empty: give the model to fine-tune")
        if self.model.adapter:
            raise RecipeError(
                f"model.adapter={self.model.adapter!r}: fine-tuning on top of an adapter is not "
                "supported; merge it into the base model first and set model.path to the result"
            )
        if not self.answer_loss_weight >= 1.0:  # also refuses NaN
            raise RecipeError(f"answer_loss_weight={self.answer_loss_weight} must be >= 1 (1 = no weighting)")
        self.model.check("model")
        self.optim.check("optim")
        self.deepspeed.check("deepspeed")
        for name in ("steps", "batch_size", "grad_accum", "max_length"):
            _check_positive(name, getattr(self, name))


@dataclass
class ServeRecipe:
    """`simsearch serve`: any engine behind Search-R1's POST /retrieve."""

    search: SearchConfig = field(default_factory=SearchConfig)
    host: str = "127.0.0.1"  # wider binds are warned about
    port: int = 8000
    max_batch: int = 256  # queries per engine call (requests are coalesced up to this)
    max_queries_per_request: int = 512
    max_body_bytes: int = 1_000_000
    max_top_k: int = 100  # larger topk requests get 422
    token_env: str = ""  # environment variable with a bearer token required on /retrieve
    threads: int = 1  # torch threads, as the quickstart's (0 = torch's default: every core)
    run_dir: str = ""  # where cost.json (what was served and what it cost) is written at shutdown ("" = nowhere)
    drain_s: int = 10  # on SIGTERM / SIGINT: seconds in-flight requests may take before they are cancelled

    def check(self, key: str) -> None:
        _check_threads(self.threads)
        _check_grace("drain_s", self.drain_s)
        self.search.check("search")
        if self.search.kind == "self":
            raise RecipeError("search.kind=self has nothing to serve: pick a retriever or the simulator")
        for name in ("max_batch", "max_queries_per_request", "max_body_bytes", "max_top_k"):
            _check_positive(name, getattr(self, name))


@dataclass
class QuickstartRecipe:
    """`simsearch quickstart`: the whole pipeline on a tiny world, offline on CPU.

    The stages after pretraining run the shipped recipes in `recipes_dir` (collect.yaml,
    simulator.yaml, train.yaml, train_nosearch.yaml, eval.yaml, eval_nosearch.yaml) with their
    paths pointed into `run_dir`; the fields here set the world and the base model those recipes
    start from.
    """

    seed: int = 0
    run_dir: str = "runs/quickstart"
    smoke: bool = False  # every stage for a step or two (a pipeline check, not a result)
    recipes_dir: str = ""  # stage recipes ("" = recipes/quickstart beside the package)
    n_entities: int = 300  # people in the tiny world RL and evaluation ask about
    n_train_entities: int = 200  # of them, those training questions ask about
    n_background_entities: int = 900  # more people, in the corpus, whose questions pretrain the base LM
    vocab_size: int = 1000  # byte-level BPE of the tiny models
    drill_steps: int = 300  # copy drills (batch 64) before the traces: they form induction heads
    pretrain_steps: int = 800  # base-model pretraining on reading and random-query traces
    pretrain_batch_size: int = 32
    pretrain_lr: float = 2e-3
    pretrain_traces: int = 16000
    copy_loss_weight: float = 1.0  # auxiliary loss on copyable tokens inside <information>
    typed_answer_share: float = 0.8  # traces answering with a value of the asked kind (a city for a birthplace)
    # reading traces: the person's name searched (out of the LM loss) and the gold value answered; they
    # teach reading, not which query to write
    reading_share: float = 0.7
    # shares of the other traces' query kinds (tinyworld.pretrain.QUERY_KINDS): the person's name alone,
    # question words alone, or both (40% of these traces name the person; the base names them in about
    # one query in eight)
    query_mix: list[float] = field(default_factory=lambda: [0.2, 0.6, 0.2])
    # redraw a trace query that finds nothing (which favours the name wherever the question's other words
    # are not in the corpus); false keeps it, with empty results and a guessed answer
    redraw_empty_searches: bool = False
    two_hop_share: float = 0.0  # people (each split) with a two-hop question: the birth city of their venture's founder
    two_search_share: float = 0.0  # pretraining traces that search twice before answering (the multi-turn format)
    year_tokens: bool = True  # every year of the world one token of the tiny tokenizer (else four digit tokens)
    city_tokens: bool = True  # every city name one token (else the BPE's pieces)
    # torch threads (0 = torch's default: every core); 1 gives the same floats on any number of cores
    threads: int = 1

    def check(self, key: str) -> None:
        for name in (
            "n_entities",
            "n_train_entities",
            "vocab_size",
            "pretrain_steps",
            "pretrain_batch_size",
            "pretrain_lr",
            "pretrain_traces",
        ):
            _check_positive(name, getattr(self, name))
        _check_range("typed_answer_share", self.typed_answer_share, 0.0, 1.0)
        _check_range("reading_share", self.reading_share, 0.0, 1.0)
        _check_range("two_hop_share", self.two_hop_share, 0.0, 1.0)
        _check_range("two_search_share", self.two_search_share, 0.0, 1.0)
        if len(self.query_mix) != 3 or min(self.query_mix) < 0 or not math.isclose(sum(self.query_mix), 1.0):
            raise RecipeError(
                f"query_mix={self.query_mix} must be 3 shares >= 0 summing to 1: traces whose query is the "
                "name alone, question words alone, or both"
            )
        for name in ("n_background_entities", "drill_steps"):
            if getattr(self, name) < 0:
                raise RecipeError(f"{name}={getattr(self, name)} must be >= 0")
        if self.n_train_entities >= self.n_entities:
            raise RecipeError(
                f"n_train_entities={self.n_train_entities} must be below n_entities={self.n_entities}: "
                "the rest are the held-out entities"
            )
        _check_threads(self.threads)


R = TypeVar("R")


def load_recipe(schema: type[R], path: str | os.PathLike | None, overrides: Sequence[str] = ()) -> R:
    """Load a YAML recipe plus `key.sub=value` overrides onto a recipe dataclass.

    `~key` removes an entry of a mapping (an eval engine: `~engines.dense`) or sets an optional
    section to null (`~val_search`); `key=null` does the same.

    Raises:
        RecipeError: the file is missing or not YAML, a key is unknown, a value has the wrong
            type, a required value is missing, or an invariant between fields fails. The message
            names the file and key.
    """
    where = str(path) if path else "<no recipe file>"
    base = OmegaConf.structured(schema)
    try:
        layers: list[Any] = [base]
        if path is not None:
            if not Path(path).is_file():
                raise RecipeError(f"{where}: recipe file not found")
            layers.append(_read_yaml(path))
        removals = [o[1:] if o.startswith("~") else o.partition("=")[0] for o in overrides if _is_removal(o)]
        setting = [o for o in overrides if not _is_removal(o)]
        if setting:
            bad = [o for o in setting if "=" not in o]
            if bad:
                raise RecipeError(f"override {bad[0]!r} is not key=value (e.g. steps=10) or ~key (removes it)")
            layers.append(_parse_overrides(setting))
        merged = cast(DictConfig, OmegaConf.merge(*layers))  # a structured recipe is a mapping
        for key in removals:
            _remove(merged, key)
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise RecipeError(
                f"{where}: missing required value(s) {', '.join(missing)}; set them in the recipe "
                f"or on the command line ({missing[0]}=...)"
            )
        recipe: Any = OmegaConf.to_object(merged)  # an instance of `schema`
        recipe.check("")
        return cast(R, recipe)
    except RecipeError as err:
        if str(err).startswith(where):
            raise
        raise RecipeError(f"{where}: {err}") from None
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        raise RecipeError(f"{where}: key {key}: {_first_line(err)}") from None


def _yaml_problem(err: yaml.YAMLError) -> str:
    """One line saying what the YAML parser tripped on, and where."""
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        return f"{err.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(err).split())


def _read_yaml(path: str | os.PathLike) -> DictConfig:
    # PyYAML's and OmegaConf's own exceptions would otherwise escape load_recipe untranslated.
    try:
        loaded = OmegaConf.load(Path(path))
    except UnicodeDecodeError as err:
        raise RecipeError(f"not UTF-8 text (bad byte at offset {err.start}); save the recipe as UTF-8") from None
    except yaml.YAMLError as err:
        raise RecipeError(f"not valid YAML: {_yaml_problem(err)}") from None
    except OSError as err:  # OmegaConf's answer to a document that is a bare number or string
        raise RecipeError(f"a recipe is a mapping of `key: value` lines, not a single value ({err})") from None
    if not isinstance(loaded, DictConfig):
        raise RecipeError("a recipe is a mapping of `key: value` lines, not a list")
    return loaded


def _is_removal(override: str) -> bool:
    """`~key`, or `key=null`: both remove the key (an entry of a mapping, or an optional value)."""
    return override.startswith("~") or override.partition("=")[2].strip() in ("null", "~")


def _remove(merged: DictConfig, key: str) -> None:
    """Deletes `key` from a mapping (`engines.dense`) or sets an optional section to null (`val_search`)."""
    parent_key, _, name = key.rpartition(".")
    parent = OmegaConf.select(merged, parent_key) if parent_key else merged
    if not isinstance(parent, DictConfig) or name not in parent:
        raise RecipeError(f"override ~{key}: there is no {key} to remove")
    if OmegaConf.get_type(parent) is dict:  # a mapping of named entries: drop the entry
        del parent[name]
        return
    try:
        parent[name] = None
    except OmegaConfBaseException:
        raise RecipeError(
            f"override ~{key}: {key} is not optional and cannot be removed; set its keys instead"
        ) from None


def _parse_overrides(overrides: Sequence[str]) -> DictConfig:
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except yaml.YAMLError:
        pass
    for override in overrides:  # name the override whose value is not YAML
        try:
            OmegaConf.from_dotlist([override])
        except yaml.YAMLError as err:
            raise RecipeError(
                f"override {override!r}: the value is not valid YAML ({_yaml_problem(err)}); quote it, e.g. key='[text'"
            ) from None
    raise AssertionError("unreachable: the overrides failed together but parse one by one")


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def save_recipe(recipe: Any, run_dir: str | os.PathLike) -> Path:
    """Write the resolved recipe as `recipe.yaml` in the run directory."""
    out = Path(run_dir) / "recipe.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(OmegaConf.to_yaml(OmegaConf.structured(recipe)))
    return out
