"""Typed recipes: one dataclass tree per command, loaded from YAML with OmegaConf.

A recipe file maps 1:1 onto these dataclasses. Each recipe composes sections that the libraries
declare beside the code that reads them (`generation.recipe`, `policy.recipe`, `simulator.recipe`,
`curriculum.recipe`, `training.recipe`, `data.recipe`, `tinyworld.recipe`); this module adds the
commands' own fields, the checks that span sections, and YAML loading. `load_recipe` merges the YAML and `key=value`
overrides onto the schema, so an unknown key, a wrong type or a missing required value fails
before any work starts, with the file, the key and a fix in the message.
"""

from __future__ import annotations

import os
import re
import typing
from collections.abc import Sequence
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import yaml
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from simsearch.checks import check_choice, check_positive, check_range, setting
from simsearch.curriculum.recipe import CurriculumConfig
from simsearch.curriculum.served import check_served_curriculum
from simsearch.data.recipe import DataConfig, EvalDataset
from simsearch.errors import RecipeError
from simsearch.eval.metrics import NORMALIZATIONS
from simsearch.generation.recipe import GenerationConfig, ModelConfig, SamplingConfig
from simsearch.policy.protocols import PROTOCOLS
from simsearch.policy.recipe import RECIPE_TEMPLATES, AlgorithmConfig, RewardConfig, RolloutConfig
from simsearch.simulator.prompts import PRESETS
from simsearch.simulator.recipe import JudgeConfig, SearchConfig, SimulatorConfig, check_shows
from simsearch.simulator.sft_data import OUTCOME_METRICS, TARGETS
from simsearch.tinyworld.recipe import TinyWorldConfig
from simsearch.training.health import HealthConfig
from simsearch.training.recipe import DeepSpeedConfig, LoraConfig, OptimConfig

__all__ = [  # the recipes, and the sections they compose (declared by their libraries)
    "EVAL_BASELINES",
    "RECIPE_TEMPLATES",
    "RESUME_MODES",
    "AlgorithmConfig",
    "CollectRecipe",
    "CurriculumConfig",
    "DataConfig",
    "DeepSpeedConfig",
    "EvalDataset",
    "EvalRecipe",
    "FinetuneRecipe",
    "GenerationConfig",
    "HealthConfig",
    "JudgeConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimConfig",
    "QuickstartRecipe",
    "RewardConfig",
    "RolloutConfig",
    "SamplingConfig",
    "SearchConfig",
    "ServeRecipe",
    "SimulatorConfig",
    "TinyWorldConfig",
    "TrainRecipe",
    "load_recipe",
    "save_recipe",
]


def _check_threads(value: int) -> None:
    if value < 0:
        raise RecipeError(f"threads={value} must be >= 0 (0 = torch's default: every core)")


def _check_grace(key: str, value: float) -> None:
    if not value >= 0:  # also refuses NaN
        raise RecipeError(f"{key}={value} must be >= 0 seconds (0 = no limit)")


def _check_every(save_every: int, eval_every: int) -> None:
    """Refuses a negative step interval."""
    for name, value, zero in (("save_every", save_every, "only at the end"), ("eval_every", eval_every, "never")):
        if value < 0:
            raise RecipeError(f"{name}={value} must be >= 0 (0 = {zero})")


RESUME_MODES = ("true", "false", "force")
"""`resume` of train and simulator finetune: continue | start over | continue with a changed recipe."""


def _resume_mode(value: str) -> str:
    """The `resume` value, lower-cased (YAML's `true` reaches a str field as "True"), checked."""
    mode = str(value).lower()
    check_choice("resume", mode, RESUME_MODES)
    return mode


# --------------------------------------------------------------------------- settings several recipes share
# Each declared once, default and help; a recipe declares its field with the function
# (`threads: int = _threads()`), which hands each dataclass a field of its own.


def _seed() -> int:
    return setting(0, "random seed of the run's draws (sampling, data order, search noise)")


def _run_dir() -> str:
    """`run_dir` of the commands that train (train, simulator finetune)."""
    return setting(MISSING, "where metrics, checkpoints and the resolved recipe go")


def _resume() -> str:
    return setting(
        "true",
        "true: continue from the run directory's last checkpoint if there is one, refused when the recipe differs from "
        "its recipe.yaml | false: start over | force: continue and apply the changed recipe (the change is recorded in "
        "recipe_changes.jsonl)",
    )


def _threads() -> int:
    return setting(1, "torch threads (0 = torch's default: every core); 1 gives the same floats on any number of cores")


def _gradient_checkpointing() -> bool:
    return setting(False, "recompute activations in the backward pass instead of keeping them: less memory, more time")


def _stop_grace_s(work: str, stops: str) -> float:
    """`stop_grace_s` of a command whose unit of `work` finishes before `stops` on a signal."""
    return setting(
        60.0, f"SIGTERM / SIGINT: seconds {work} may take to finish before {stops} stops at once (0 = no limit)"
    )


@dataclass
class TrainRecipe:
    """`simsearch train`: curriculum RL of a search agent."""

    seed: int = _seed()
    run_dir: str = _run_dir()
    policy: GenerationConfig = setting(
        default_factory=GenerationConfig, help="the policy RL trains, and the engine that generates its rollouts"
    )
    sampling: SamplingConfig = setting(default_factory=SamplingConfig, help="how the policy samples its rollouts")
    data: DataConfig = setting(default_factory=DataConfig, help="the training and validation questions")
    search: SearchConfig = setting(
        default_factory=SearchConfig, help="the engine that answers the policy's searches in training"
    )
    val_search: SearchConfig | None = setting(None, "engine for validation (default: `search`)")
    curriculum: CurriculumConfig = setting(
        default_factory=CurriculumConfig,
        help="how the share of noisy search results (the simulator's) moves over training",
    )
    rollout: RolloutConfig = setting(default_factory=RolloutConfig, help="the multi-turn agent loop")
    reward: RewardConfig = setting(default_factory=RewardConfig, help="the reward: a weighted sum of named components")
    algorithm: AlgorithmConfig = setting(default_factory=AlgorithmConfig, help="the advantage estimator and the loss")
    optim: OptimConfig = setting(default_factory=OptimConfig, help="the policy's optimizer and its schedule")
    lora: LoraConfig = setting(
        default_factory=LoraConfig, help="LoRA adapters on the policy instead of full fine-tuning (r > 0)"
    )
    deepspeed: DeepSpeedConfig = setting(
        default_factory=DeepSpeedConfig, help="DeepSpeed ZeRO for the policy's training (stage > 0)"
    )
    health: HealthConfig = setting(default_factory=HealthConfig, help="the collapse monitor (docs/health.md)")
    steps: int = setting(200, "optimizer steps (ZeroSearch: 203)")
    prompts_per_step: int = setting(64, "questions per step; trajectories = prompts_per_step x group_size")
    micro_batch_size: int = setting(8, "trajectories per forward/backward pass (gradient accumulation)")
    gradient_checkpointing: bool = _gradient_checkpointing()
    bf16: bool = setting(False, "bf16 autocast where the hardware has it")
    save_every: int = setting(50, "steps between checkpoints (0 = only at the end)")
    eval_every: int = setting(0, "steps between validations (0 = never)")
    resume: str = _resume()
    threads: int = _threads()
    tensorboard: bool = setting(True, "also log the metrics as TensorBoard events (tensorboard/ in the run directory)")
    wandb_project: str = setting("", "log to Weights & Biases too (needs [wandb])")
    trajectory_samples: int = setting(4, "trajectories per sampled step written to trajectories.jsonl (0 = none)")
    trajectory_every: int = setting(10, "steps between samples (and always the first and last step)")
    stop_grace_s: float = _stop_grace_s("the step in flight", "the run")

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
        _check_every(self.save_every, self.eval_every)
        if self.data.val_size < 0:
            raise RecipeError(f"data.val_size={self.data.val_size} must be >= 0 (0 = every validation question)")
        check_positive("trajectory_every", self.trajectory_every)
        if self.val_search is not None:
            self.val_search.check("val_search")
        self.curriculum.check("curriculum")
        self.rollout.check("rollout")
        self.reward.check("reward")
        self.algorithm.check("algorithm")
        self.optim.check("optim")
        self.deepspeed.check("deepspeed")
        self._check_health()
        check_positive("steps", self.steps)
        check_positive("prompts_per_step", self.prompts_per_step)
        check_positive("micro_batch_size", self.micro_batch_size)
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

    def _check_health(self) -> None:
        self.health.check("health")
        if self.health.on_alarm == "rollback" and (self.deepspeed.stage > 0 or self.policy.kind == "vllm"):
            # a rollback rebuilds the learner in-process: neither DeepSpeed's engines nor vLLM's can be built twice
            raise RecipeError(
                "health.on_alarm=rollback runs in one process with the hf policy engine; with deepspeed.stage > 0 "
                "or policy.kind=vllm use health.on_alarm=stop, then resume with a lower optim.lr and resume=force"
            )

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


EVAL_BASELINES = ("direct", "rag")
"""The baseline rows `simsearch eval` runs itself (`EvalRecipe.baselines`)."""

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # eval row and dataset names name files


@dataclass
class EvalRecipe:
    """`simsearch eval`: one policy x several engines x several datasets."""

    seed: int = _seed()
    run_dir: str = setting(
        MISSING, "where the rows, the report (table.md, summary.json, bars.png) and the resolved recipe go"
    )
    policy: GenerationConfig = setting(default_factory=GenerationConfig, help="the policy evaluated, and its engine")
    sampling: SamplingConfig = setting(
        default_factory=lambda: SamplingConfig(temperature=0.0), help="how the policy samples (greedy by default)"
    )
    n: int = setting(1, "samples per question (pass@n when > 1)")
    datasets: list[EvalDataset] = setting(default_factory=list, help="the QA sets evaluated on, one table column each")
    engines: dict[str, SearchConfig] = setting(default_factory=dict, help="row name -> engine")
    noisy_share: float = setting(0.0, "simulator engines: probability a search is noisy")
    baselines: list[str] = setting(default_factory=list, help="direct | rag")
    rag_engine: str = setting("", "which of `engines` feeds the RAG baseline (default: the first)")
    rollout: RolloutConfig = setting(
        default_factory=lambda: RolloutConfig(group_size=1), help="the multi-turn agent loop"
    )
    training_run: str = setting("", "a train run directory whose curves go in the report")
    chunk_size: int = setting(64, "questions per rollout call; rows are appended after each chunk (the resume unit)")
    fidelity_size: int = setting(100, "questions per dataset in the simulator-fidelity section (0 = skip it)")
    normalization: str = setting(
        "squad",
        "How answers are normalized before em / substring_em / f1 (simsearch.eval.metrics), named under every table. "
        "squad by default: the SQuAD v1.1 rule Search-R1, ZeroSearch and SSRL score with, so a table compares with "
        "theirs; unicode (ours) also deletes non-ASCII punctuation and never matches a gold answer that normalizes to "
        '"".',
    )
    threads: int = _threads()
    stop_grace_s: float = _stop_grace_s("the chunk in flight", "eval")

    def check(self, key: str) -> None:
        _check_threads(self.threads)
        _check_grace("stop_grace_s", self.stop_grace_s)
        self.policy.check("policy")
        check_choice(f"{key}.normalization", self.normalization, tuple(NORMALIZATIONS))
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
        check_range("noisy_share", self.noisy_share, 0.0, 1.0)
        for baseline in self.baselines:
            check_choice(f"{key}.baselines", baseline, EVAL_BASELINES)
        if "rag" in self.baselines and not self.engines:
            raise RecipeError("baselines: rag retrieves with one of `engines`: add an engine")
        if self.rag_engine and self.rag_engine not in self.engines:
            raise RecipeError(f"rag_engine={self.rag_engine!r} is not one of engines: {list(self.engines)}")
        check_positive(f"{key}.n", self.n)
        check_positive(f"{key}.chunk_size", self.chunk_size)  # eval: resume unit
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
class CollectRecipe:
    """`simsearch simulator collect`: simulator SFT data from real-search trajectories."""

    seed: int = _seed()
    run_dir: str = setting(MISSING, "where the SFT pairs, their statistics and the resolved recipe go")
    policy: GenerationConfig = setting(
        default_factory=GenerationConfig, help="the policy whose searches are recorded, and its engine"
    )
    sampling: SamplingConfig = setting(default_factory=SamplingConfig, help="how the policy samples its rollouts")
    data: DataConfig = setting(default_factory=DataConfig, help="the questions rolled out (data.train)")
    search: SearchConfig = setting(default_factory=SearchConfig, help="the real retriever")
    rollout: RolloutConfig = setting(
        default_factory=lambda: RolloutConfig(group_size=1), help="the multi-turn agent loop"
    )
    judge: JudgeConfig = setting(
        default_factory=JudgeConfig, help="labels each search's documents useful or noisy (target: judged)"
    )
    preset: str = setting("simsearch", "prompt preset the SFT pairs are rendered with")
    show_question: bool = setting(True, "false: prompts leave out the question (as the simulator will run)")
    show_answer: bool = setting(True, "false: prompts leave out the gold answer (as the simulator will run)")
    target: str = setting(
        "judged",
        "How pairs are labelled (simsearch.simulator.sft_data): trajectory = ZeroSearch's paper (all searches of a "
        "trajectory that answered correctly are useful, of one that did not noisy) | judged = ours, by content (judge: "
        "does the set hold the answer?) | retrieved = ours, keeps the retriever's query sensitivity.",
    )
    outcome_metric: str = setting(
        "substring_em",
        'trajectory: correct = this is 1 (substring_em: ZeroSearch\'s "EM" | em)',
    )
    contrast_queries: int = setting(
        0,
        "per search, perturbed queries also sent to the retriever (word dropped/cut/swapped)",
    )
    contrast_edits: list[str] = setting(
        default_factory=lambda: ["drop", "cut", "swap"],
        help="the edits those variants draw from: simulator.sft_data.CONTRAST_EDITS (respell: a word's prefix kept, "
        "its ending replaced, as a policy miscopies a name)",
    )
    balance: bool = setting(True, "judged, trajectory: equal numbers of useful and noisy pairs")
    val_fraction: float = setting(0.1, "share of questions whose pairs go to validation")
    batch_size: int = setting(64, "questions per rollout call")
    max_questions: int = setting(0, "first N questions of data.train only (0 = all)")
    threads: int = _threads()

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
        check_range("val_fraction", self.val_fraction, 0.0, 0.9)
        check_choice("preset", self.preset, tuple(name for name, spec in PRESETS.items() if not spec.needs_templates))
        check_shows("show_question", self.show_question, self.preset)
        check_shows("show_answer", self.show_answer, self.preset)
        check_choice("target", self.target, TARGETS)
        check_choice("outcome_metric", self.outcome_metric, tuple(OUTCOME_METRICS))
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
        check_positive("batch_size", self.batch_size)
        if self.contrast_queries < 0:
            raise RecipeError(f"contrast_queries={self.contrast_queries} must be 0 (off) or more")
        from simsearch.simulator.sft_data import CONTRAST_EDITS  # torch-free

        if not self.contrast_edits:
            raise RecipeError("contrast_edits is empty: list at least one of " + ", ".join(CONTRAST_EDITS))
        for i, edit in enumerate(self.contrast_edits):
            check_choice(f"contrast_edits[{i}]", edit, CONTRAST_EDITS)
        if self.search.kind in ("simulator", "self"):
            raise RecipeError(f"search.kind={self.search.kind}: collect needs a real retriever")


@dataclass
class FinetuneRecipe:
    """`simsearch simulator finetune`: SFT of the simulator LLM."""

    seed: int = _seed()
    run_dir: str = _run_dir()
    model: ModelConfig = setting(default_factory=ModelConfig, help="the simulator LLM fine-tuned")
    train_file: str = setting(MISSING, "JSONL of {prompt, response} pairs (from `simulator collect`)")
    val_file: str = setting("", 'JSONL of validation pairs, whose loss is logged every eval_every steps ("" = none)')
    chat_template: bool = setting(False, "render prompts through the tokenizer's chat template")
    optim: OptimConfig = setting(
        default_factory=lambda: OptimConfig(lr=1e-6), help="the simulator's optimizer and its schedule"
    )
    lora: LoraConfig = setting(
        default_factory=LoraConfig, help="LoRA adapters on the simulator instead of full fine-tuning (r > 0)"
    )
    deepspeed: DeepSpeedConfig = setting(
        default_factory=DeepSpeedConfig, help="DeepSpeed ZeRO for the simulator's training (stage > 0)"
    )
    steps: int = setting(1000, "ZeroSearch: 1000")
    batch_size: int = setting(2, "ZeroSearch: 2")
    grad_accum: int = setting(1, "micro-batches of batch_size pairs each process accumulates per optimizer step")
    max_length: int = setting(
        1024, "tokens per pair: a longer response is cut to fit; a pair whose prompt alone reaches it is dropped"
    )
    answer_loss_weight: float = setting(1.0, "loss weight of response tokens spelling a gold answer (1 = plain SFT)")
    save_every: int = setting(0, "0 = only at the end")
    eval_every: int = setting(
        100, "steps between validation losses on val_file, also taken at the last step (0 = never)"
    )
    gradient_checkpointing: bool = _gradient_checkpointing()
    bf16: bool = setting(False, "bf16 autocast (under DeepSpeed: its bf16 mode)")
    resume: str = _resume()
    threads: int = _threads()
    stop_grace_s: float = _stop_grace_s("the step in flight", "the run")

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
            check_positive(name, getattr(self, name))
        _check_every(self.save_every, self.eval_every)


@dataclass
class ServeRecipe:
    """`simsearch serve`: any engine behind Search-R1's POST /retrieve."""

    search: SearchConfig = setting(default_factory=SearchConfig, help="the engine served")
    host: str = setting("127.0.0.1", "wider binds are warned about")
    port: int = setting(8000, "TCP port the server listens on")
    max_batch: int = setting(256, "queries per engine call (requests are coalesced up to this)")
    max_queries_per_request: int = setting(512, "queries one request may send (more get 413)")
    max_body_bytes: int = setting(1_000_000, "bytes one request body may hold (more get 413)")
    max_top_k: int = setting(100, "larger topk requests get 422")
    token_env: str = setting("", "environment variable with a bearer token required on /retrieve")
    threads: int = _threads()
    run_dir: str = setting(
        "",
        'where cost.json (what was served and what it cost) is written at shutdown ("" = nowhere)',
    )
    drain_s: int = setting(10, "on SIGTERM / SIGINT: seconds in-flight requests may take before they are cancelled")
    curriculum: CurriculumConfig | None = setting(
        None,
        "the noise curriculum of requests that send neither noisy nor p_noise, by the step a client reports (train's "
        "schedules; null = none, no noise)",
    )
    curriculum_total_searches: int = setting(
        0,
        "searches the training run makes in all: they move the curriculum of a client that reports no step (0 = none)",
    )

    def check(self, key: str) -> None:
        _check_threads(self.threads)
        _check_grace("drain_s", self.drain_s)
        self.search.check("search")
        if self.search.kind == "self":
            raise RecipeError("search.kind=self has nothing to serve: pick a retriever or the simulator")
        if self.curriculum is not None:
            if self.search.kind != "simulator":
                raise RecipeError(
                    f"curriculum: search.kind={self.search.kind} writes no noisy documents; serve the simulator "
                    "(search.kind=simulator) or drop the curriculum section"
                )
            check_served_curriculum(self.curriculum, self.curriculum_total_searches)
        for name in ("max_batch", "max_queries_per_request", "max_body_bytes", "max_top_k"):
            check_positive(name, getattr(self, name))


QUICKSTART_SIMULATORS = ("knowing", "fit")
"""The quickstart's simulators (`QuickstartRecipe.simulator`)."""


@dataclass
class QuickstartRecipe:
    """`simsearch quickstart`: the whole pipeline on a tiny world, offline on CPU.

    The stages after pretraining run the shipped recipes in `recipes_dir` (collect.yaml,
    simulator.yaml, train.yaml, train_nosearch.yaml, eval.yaml, eval_nosearch.yaml) with their
    paths pointed into `run_dir`; `tinyworld` sets the world and the base model those recipes
    start from.
    """

    seed: int = setting(0, "random seed of the tiny world, the base model and every stage's run")
    run_dir: str = setting(
        "runs/quickstart", "where every stage writes: the world, the base model, the simulator, the RL and eval runs"
    )
    smoke: bool = setting(False, "every stage for a step or two (a pipeline check, not a result)")
    recipes_dir: str = setting("", 'stage recipes ("" = recipes/quickstart beside the package)')
    protocol: str = setting(
        "tags",
        "how the policy searches in every stage (rollout.protocol): tags, or tool-call (the base learns Hermes tool "
        "calls in a ChatML template of its own, models.TINY_TOOL_TEMPLATE)",
    )
    threads: int = _threads()
    simulator: str = setting(
        "knowing",
        "the simulator RL searches: knowing (its base read the world's passages, as an LLM reads Wikipedia, and it is "
        "fine-tuned on BM25's results for other people's questions; the default by docs/controls.md's rule) or fit "
        "(fine-tuned on BM25's results for RL's own questions)",
    )
    released: bool = setting(
        True,
        "a stage built under the very fingerprint of a model shipped with the package (the default world's base and "
        "simulator) installs that model instead of building it; false builds every stage here",
    )
    tinyworld: TinyWorldConfig = setting(
        default_factory=TinyWorldConfig,
        help="the fictional world and the tiny base model pretrained on it (its size, tokenizer and traces)",
    )

    def check(self, key: str) -> None:
        check_choice("protocol", self.protocol, tuple(PROTOCOLS))
        check_choice("simulator", self.simulator, QUICKSTART_SIMULATORS)
        self.tinyworld.check("tinyworld")
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
        removals = [o for o in overrides if _is_removal(o)]
        # `key=` sets an empty string (OmegaConf would read None): `search.cache=` is "no cache"
        setting = [o + "''" if o.endswith("=") else o for o in overrides if not _is_removal(o)]
        if setting:
            bad = [o for o in setting if "=" not in o]
            if bad:
                raise RecipeError(f"override {bad[0]!r} is not key=value (e.g. steps=10) or ~key (removes it)")
            layers.append(_parse_overrides(setting))
        merged = cast(DictConfig, OmegaConf.merge(*layers))  # a structured recipe is a mapping
        for override in removals:
            _remove(merged, override)
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
        raise RecipeError(f"{where}: key {key}: {_in_a_section(err) or _first_line(err)}") from None
    except TypeError as err:  # OmegaConf's merge of a mapping where the schema has a list, or the other way
        shape = f"a section has the wrong shape for the recipe ({_first_line(err)})"
        raise RecipeError(f"{where}: {shape}; its keys: `simsearch config COMMAND RECIPE --doc`") from None


def _in_a_section(err: OmegaConfBaseException) -> str:
    """For a key its section does not have, where the recipe does have it, one section down or more (the
    quickstart's `drill_steps` is `tinyworld.drill_steps`); "" when nowhere."""
    section = getattr(err, "object_type", None)
    name = str(getattr(err, "key", ""))
    if not isinstance(err, ConfigKeyError) or not isinstance(section, type) or not is_dataclass(section):
        return ""
    parent = str(getattr(err, "full_key", "") or "").rpartition(".")[0]
    places = [f"{parent}.{place}" if parent else place for place in _section_keys(section, name)]
    if not places:
        return ""
    inside = places[0].rpartition(".")[0].rpartition(".")[2]
    return (
        f"{section.__name__} has no {name} of its own; it is {' or '.join(places)}: write {places[0]}=... "
        f"(in a recipe file, {name} under `{inside}:`)"
    )


def _section_keys(schema: type, name: str) -> list[str]:
    """The dotted keys at which the sections nested in `schema` (not mappings, lists or optional ones) declare
    a field `name`."""
    found = []
    hints = typing.get_type_hints(schema)
    for f in fields(schema):
        section = hints[f.name]
        if isinstance(section, type) and is_dataclass(section):
            found += [f"{f.name}.{name}"] if name in {g.name for g in fields(section)} else []
            found += [f"{f.name}.{key}" for key in _section_keys(section, name)]
    return found


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


def _remove(merged: DictConfig, override: str) -> None:
    """Applies a removal `override` (`~key` or `key=null`): deletes an entry of a mapping (`engines.dense`)
    or sets an optional section to null (`val_search`)."""
    key = override[1:] if override.startswith("~") else override.partition("=")[0]
    parent_key, _, name = key.rpartition(".")
    parent = OmegaConf.select(merged, parent_key) if parent_key else merged
    if not isinstance(parent, DictConfig) or name not in parent:
        raise RecipeError(f"override {override}: there is no {key} to remove")
    if OmegaConf.get_type(parent) is dict:  # a mapping of named entries: drop the entry
        del parent[name]
        return
    try:
        parent[name] = None
    except OmegaConfBaseException:
        section = isinstance(parent[name], DictConfig)
        fix = "set its keys instead" if section else f"give it a value instead (e.g. {key}= for an empty string)"
        raise RecipeError(f"override {override}: {key} is not optional and cannot be removed; {fix}") from None


def _parse_overrides(overrides: Sequence[str]) -> DictConfig:
    for override in overrides:  # bytes the shell passed that are not UTF-8 arrive as lone surrogates
        try:
            override.encode("utf-8")
        except UnicodeEncodeError as err:
            raise RecipeError(f"override {override!r} holds bytes that are not UTF-8 (at character {err.start}); "
                              "write it in UTF-8") from None  # fmt: skip
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
