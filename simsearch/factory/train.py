"""What `simsearch train` builds from its recipe: the learner and its rollout engine, what the
step and the update take beside their sections, validation and checkpoints (the step: `policy.step`).

Under ZeRO-3 the `HFEngine` rollout runs on an unpartitioned copy of the policy (taken before
ZeRO-3 partitions it) and the reference is an unpartitioned copy too; with vLLM no copy is kept.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from simsearch.errors import RecipeError
from simsearch.factory.build import build_generation_engine, build_search_engine, meter_search_engine
from simsearch.generation.hf import HFEngine
from simsearch.models import load_model
from simsearch.policy.critic import ValueModel
from simsearch.policy.order import rank_share
from simsearch.policy.protocols import make_protocol
from simsearch.policy.rewards import FORMAT_SCORES
from simsearch.policy.rollout import RolloutSettings
from simsearch.policy.step import Rollouts, StepRecipe
from simsearch.policy.sync import RolloutWeights
from simsearch.policy.update import Learner, UpdateShape
from simsearch.policy.validation import Validation
from simsearch.retrieval.accounting import Ledger
from simsearch.training.checkpoint import rng_state
from simsearch.training.distributed import BatchShape, HFExport, load_for_training
from simsearch.training.session import Run, TrainedModel, TrainSettings, deepspeed_device, train_model

if TYPE_CHECKING:
    from simsearch.config import TrainRecipe
    from simsearch.simulator.recipe import SearchConfig


class Learning(NamedTuple):
    """What `load_learner` builds: this process's questions and update shape, the models, the rollout engine."""

    share: slice  # this process's questions of each step
    shape: UpdateShape
    learner: Learner
    weights: RolloutWeights
    tokenizer: Any


def load_learner(recipe: TrainRecipe, run: Run) -> Learning:
    """The policy (resumed), its reference and critic, trained as the recipe says, and its rollout engine.

    Raises:
        RecipeError: The minibatch size does not split the processes' trajectories (`process_shape`).
    """
    share, shape = process_shape(recipe, run.rank, run.world)
    rows = shape.minibatch_rows or (share.stop - share.start) * recipe.rollout.group_size  # DeepSpeed accumulation
    use_ds, lora, model = recipe.deepspeed.stage > 0, recipe.lora.r > 0, recipe.policy.model
    state = run.state
    # Resumed weights (full or the LoRA adapter) load here; under DeepSpeed `TrainedModel.restore` below.
    policy, tokenizer = load_for_training(
        model, recipe.lora, checkpoint=run.checkpoint, deepspeed=use_ds,
        gradient_checkpointing=recipe.gradient_checkpointing,
    )  # fmt: skip
    reference = None  # with LoRA the reference is the policy with its adapter disabled
    if recipe.algorithm.kl_coef > 0 and not lora:
        reference, _ = load_model(model.path, dtype=model.dtype)
        reference.requires_grad_(False)
    critic = None
    if recipe.algorithm.estimator == "ppo":  # a copy of the base with a value head
        base, _ = load_model(model.path, dtype=model.dtype)
        if recipe.gradient_checkpointing:
            base.gradient_checkpointing_enable()
        critic = ValueModel(base.base_model, base.config.hidden_size)
    if critic is not None and state is not None and not use_ds:
        critic.load_state_dict(state["critic"])
    use_vllm = recipe.policy.kind == "vllm"
    rollout_copy = copy.deepcopy(policy) if recipe.deepspeed.stage == 3 and not use_vllm else None
    batch = BatchShape(recipe.micro_batch_size, -(-rows // recipe.micro_batch_size), run.world)
    settings = TrainSettings(recipe.optim, recipe.steps, recipe.deepspeed, batch, model.device, recipe.bf16)
    warmup = recipe.optim.warmup_for(recipe.steps)
    actor = train_model(policy, settings, lr=recipe.optim.lr, warmup=warmup, name="policy")
    trained_critic = None
    if critic is not None:
        if recipe.algorithm.critic_warmup_ratio is not None:
            warmup = int(recipe.algorithm.critic_warmup_ratio * recipe.steps)  # verl's rounding, as optim.warmup_ratio
        trained_critic = train_model(critic, settings, lr=recipe.algorithm.critic_lr, warmup=warmup, name="critic")
    device = deepspeed_device() if use_ds else torch.device(model.device)
    for extra in (reference, rollout_copy):
        if extra is not None:
            module: torch.nn.Module = extra
            module.to(device=device, dtype=torch.bfloat16 if use_ds and recipe.bf16 else None)
            module.eval()
    for trained in (actor, trained_critic):
        if trained is not None:
            if state is not None:
                trained.restore(state)
            trained.engine.train()
    autocast = recipe.bf16 and not use_ds and _bf16_supported(device)
    if recipe.bf16 and not use_ds and not autocast and run.rank == 0:
        print(f"simsearch train: bf16 is not supported on {device}; training in float32")
    learner = Learner(actor, trained_critic, reference, lora, device, autocast, run.rank, run.world)
    return Learning(share, shape, learner, _rollout_weights(recipe, run, actor, rollout_copy, tokenizer), tokenizer)


def _rollout_weights(
    recipe: TrainRecipe, run: Run, actor: TrainedModel, rollout_copy: Any, tokenizer: Any
) -> RolloutWeights:
    use_vllm = recipe.policy.kind == "vllm"
    if use_vllm:  # GPU-only (docs/scaling.md)
        backend = "external_launcher" if run.world > 1 else None  # one engine per process, on its GPU
        generator, _, _ = build_generation_engine(
            recipe.policy, seed=recipe.seed + run.rank, distributed_executor_backend=backend
        )
    else:
        module = rollout_copy if rollout_copy is not None else actor.module
        generator = HFEngine(module, tokenizer, batch_size=recipe.policy.batch_size, compile=recipe.policy.compile)
    return RolloutWeights(generator, actor.module, use_vllm, recipe.lora.r > 0, actor.zero3, rollout_copy)


def process_shape(recipe: TrainRecipe, rank: int, world: int) -> tuple[slice, UpdateShape]:
    """This process's share of each step's questions, and what its update takes beside `recipe.algorithm`."""
    if recipe.policy.kind == "vllm" and world > 1 and recipe.policy.tensor_parallel_size > 1:
        raise RecipeError(
            f"policy.tensor_parallel_size={recipe.policy.tensor_parallel_size} with {world} processes: each "
            "process runs its own vLLM engine on its own GPU and rolls out its own questions; set "
            "policy.tensor_parallel_size=1 (or train in one process)"
        )
    minibatch = recipe.algorithm.minibatch_size
    shape = update_shape(recipe, minibatch // world)
    share = rank_share(recipe.prompts_per_step, rank, world)
    rows_per_rank = (share.stop - share.start) * recipe.rollout.group_size
    if minibatch % world:
        raise RecipeError(f"algorithm.minibatch_size={minibatch} must be a multiple of the {world} processes")
    if minibatch and rows_per_rank % (minibatch // world):
        raise RecipeError(
            f"algorithm.minibatch_size={minibatch} over {world} processes must divide each process's "
            f"{rows_per_rank} trajectories"
        )
    return share, shape


def build_validation(recipe: TrainRecipe, examples: list[Any], search: Any, ledger: Ledger) -> Validation:
    """Validation on `examples` with `val_search` (metered as "val_search"), else the training engine."""
    cfg = recipe.val_search or recipe.search
    if recipe.val_search:
        search = meter_search_engine(build_search_engine(cfg, seed=recipe.seed), cfg, ledger, "val_search")
    return Validation(examples, search, rollout_settings(recipe, cfg), recipe.sampling.max_new_tokens,
                      recipe.reward.normalization, recipe.seed)  # fmt: skip


def rollout_settings(recipe: TrainRecipe, search: SearchConfig) -> RolloutSettings:
    """The rollout's settings for one search engine."""
    return RolloutSettings(recipe.rollout, search.top_k, search.rendering)


def _bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu"


def update_shape(recipe: TrainRecipe, minibatch_rows: int) -> UpdateShape:
    """What the update takes beside `recipe.algorithm`."""
    sum_norm = recipe.algorithm.loss_agg == "seq-mean-token-sum-norm"  # its constant: the context limit
    return UpdateShape(
        minibatch_rows=minibatch_rows, micro_batch_size=recipe.micro_batch_size,
        temperature=recipe.sampling.temperature,
        token_sum_normalizer=float(recipe.rollout.max_context_tokens) if sum_norm else None,
        grad_clip=recipe.optim.grad_clip, seed=recipe.seed,
    )  # fmt: skip


def rollouts(recipe: TrainRecipe, generator: Any, tokenizer: Any, search: Any, rank: int) -> Rollouts:
    """What each step's rollout rounds run with: the step's recipe sections, the engines, the loop's limits.

    Raises:
        RecipeError: tool-call with the tag format rewards, or with a template without tool support.
    """
    check_protocol(recipe, tokenizer)
    step_recipe = StepRecipe(recipe.algorithm, recipe.rollout, recipe.reward, recipe.sampling, recipe.prompts_per_step,
                             recipe.seed)  # fmt: skip
    return Rollouts(step_recipe, generator, tokenizer, search, rollout_settings(recipe, recipe.search),
                    recipe.curriculum.granularity, rank)  # fmt: skip


def check_protocol(recipe: TrainRecipe, tokenizer: Any) -> None:
    """Refuses what `rollout.protocol` cannot run with; a tool-call template must have tool support."""
    protocol = recipe.rollout.protocol
    weights = recipe.reward.resolved_weights()
    tag_formats = sorted(name for name in weights if name in FORMAT_SCORES)
    if protocol == "tags":
        if "toolcall_format" in weights:
            raise RecipeError(
                "reward.weights.toolcall_format scores tool calls: use it with rollout.protocol=tool-call"
            )
        return
    if tag_formats:
        raise RecipeError(
            f"reward.weights {tag_formats} score Search-R1 tags, which rollout.protocol=tool-call does not "
            "write: use reward.weights.toolcall_format instead"
        )
    make_protocol(recipe.rollout).check(tokenizer)


def save_training(
    recipe: TrainRecipe, run: Run, learner: Learner, tokenizer: Any, step: int, extra: dict[str, Any]
) -> Path:
    """The checkpoint of `step` finished steps (every process takes part).

    Args:
        extra: Trainer-state entries of the loop (curriculum, data position).
    """
    actor, critic = learner.actor, learner.critic
    models = [actor] if critic is None else [actor, critic]

    def export() -> Any:  # the live module saves itself (tied weights stay tied); merged LoRA through HFExport
        if learner.lora and recipe.lora.merge_on_save:
            return HFExport(actor.module, actor.module.state_dict(), recipe.policy.model.path)
        return actor.module

    def trainer_state(ds_dir: Path) -> dict[str, Any]:
        state = {"rng": rng_state(), **extra}
        for model in models:
            state.update(model.state())
        if actor.deepspeed:
            state["deepspeed_dir"] = str(ds_dir)
        elif critic is not None:
            state["critic"] = critic.module.state_dict()
        return state

    return run.save(step, models, export, tokenizer, trainer_state)
