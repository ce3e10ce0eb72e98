"""What `simsearch train` builds from its recipe around the RL update: the learner and its
rollout engine, the update's settings, the step's advantages, and its checkpoints.

Under ZeRO-3 the `HFEngine` rollout runs on an unpartitioned copy of the policy (taken before
ZeRO-3 partitions it) and the reference is an unpartitioned copy too; with vLLM no copy is kept.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from simsearch.curriculum.schedules import num_noisy
from simsearch.errors import RecipeError
from simsearch.factory.build import build_generation_engine, build_search_engine, meter_search_engine
from simsearch.generation.hf import HFEngine
from simsearch.models import load_model
from simsearch.policy.advantages import ESTIMATORS, EstimatorInputs, Stats
from simsearch.policy.batch import (
    ActorLossSettings,
    TrainBatch,
    ValueModel,
    collate_rollout_logprobs,
    collate_trajectories,
    rank_share,
    sequence_kl,
    stream_indices,
    token_advantages,
)
from simsearch.policy.infogain import gold_probabilities, gold_queries, information_gains, turn_index
from simsearch.policy.offpolicy import truncated_is_weights
from simsearch.policy.rewards import RewardOutput, shape_overlong
from simsearch.policy.rollout import RolloutResult, RolloutSettings, generate_trajectories, score_trajectories
from simsearch.policy.sampling import Round, Sampled, sample_informative, trainable_groups
from simsearch.policy.sync import RolloutWeights
from simsearch.policy.update import ForwardPasses, Learner, UpdateSettings, derived_seed
from simsearch.policy.validation import Validation
from simsearch.retrieval.accounting import Ledger
from simsearch.training.checkpoint import rng_state
from simsearch.training.distributed import BatchShape, HFExport, all_reduce_max, all_reduce_sum, load_for_training
from simsearch.training.session import Run, TrainedModel, TrainSettings, deepspeed_device, train_model
from simsearch.types import SamplingParams, Trajectory

if TYPE_CHECKING:
    from simsearch.config import AlgorithmConfig, SearchConfig, TrainRecipe


def load_learner(recipe: TrainRecipe, run: Run, rows: int) -> tuple[Learner, RolloutWeights, Any]:
    """The policy (resumed), its reference and critic, trained as the recipe says, and its rollout engine.

    Args:
        recipe: The recipe.
        run: The run (resume state, processes).
        rows: This process's rows per optimizer step (DeepSpeed's accumulation is counted from it).

    Returns:
        (learner, rollout weights, tokenizer).
    """
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
    critic = _load_critic(recipe) if recipe.algorithm.estimator == "ppo" else None
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
    return learner, _rollout_weights(recipe, run, actor, rollout_copy, tokenizer), tokenizer


def _load_critic(recipe: TrainRecipe) -> ValueModel:
    base, _ = load_model(recipe.policy.model.path, dtype=recipe.policy.model.dtype)
    if recipe.gradient_checkpointing:
        base.gradient_checkpointing_enable()
    return ValueModel(base.base_model, base.config.hidden_size)


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
        generator = HFEngine(module, tokenizer, batch_size=recipe.policy.batch_size)
    return RolloutWeights(generator, actor.module, use_vllm, recipe.lora.r > 0, actor.zero3, rollout_copy)


def process_shape(recipe: TrainRecipe, rank: int, world: int) -> tuple[slice, int]:
    """This process's share of each step's questions and its rows per minibatch (0 = all of them)."""
    if recipe.policy.kind == "vllm" and world > 1 and recipe.policy.tensor_parallel_size > 1:
        raise RecipeError(
            f"policy.tensor_parallel_size={recipe.policy.tensor_parallel_size} with {world} processes: each "
            "process runs its own vLLM engine on its own GPU and rolls out its own questions; set "
            "policy.tensor_parallel_size=1 (or train in one process)"
        )
    share = rank_share(recipe.prompts_per_step, rank, world)
    rows_per_rank = (share.stop - share.start) * recipe.rollout.group_size
    minibatch = recipe.algorithm.minibatch_size
    if minibatch % world:
        raise RecipeError(f"algorithm.minibatch_size={minibatch} must be a multiple of the {world} processes")
    if minibatch and rows_per_rank % (minibatch // world):
        raise RecipeError(
            f"algorithm.minibatch_size={minibatch} over {world} processes must divide each process's "
            f"{rows_per_rank} trajectories"
        )
    return share, minibatch // world


def build_validation(recipe: TrainRecipe, examples: list[Any], search: Any, ledger: Ledger) -> Validation:
    """Validation on `examples` with `val_search` (metered as "val_search"), else the training engine."""
    cfg = recipe.val_search or recipe.search
    if recipe.val_search:
        search = meter_search_engine(build_search_engine(cfg, seed=recipe.seed), cfg, ledger, "val_search")
    return Validation(examples, search, rollout_settings(recipe, cfg), recipe.sampling.max_new_tokens,
                      recipe.reward.normalization, recipe.seed)  # fmt: skip


def rollout_settings(recipe: TrainRecipe, search: SearchConfig) -> RolloutSettings:
    """The rollout's settings for one search engine."""
    rollout = recipe.rollout
    return RolloutSettings(
        template=rollout.template,  # checked by the recipe
        max_turns=rollout.max_turns,
        max_obs_tokens=rollout.max_obs_tokens,
        max_context_tokens=rollout.max_context_tokens,
        top_k=search.top_k,
        rendering=search.rendering,
        self_search_real_share=rollout.self_search_real_share,
    )


def _bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu"


SUM_NORM = "seq-mean-token-sum-norm"  # its constant is rollout.max_context_tokens


def update_settings(recipe: TrainRecipe, minibatch_rows: int) -> UpdateSettings:
    """What the update takes from the recipe."""
    alg = recipe.algorithm
    loss = ActorLossSettings(
        clip_low=alg.clip_low,
        clip_high=alg.clip_high,
        aggregation=alg.loss_agg,  # checked by the recipe
        token_sum_normalizer=float(recipe.rollout.max_context_tokens) if alg.loss_agg == SUM_NORM else None,
        kl_coef=0.0 if alg.kl_in_reward else alg.kl_coef,
        kl_estimator=alg.kl_estimator,
        entropy_coef=alg.entropy_coef,
        temperature=recipe.sampling.temperature,
        clip_ratio_c=alg.clip_ratio_c,
        ratio_level=alg.ratio_level,  # checked by the recipe
    )
    return UpdateSettings(
        loss=loss, ppo_epochs=alg.ppo_epochs, minibatch_rows=minibatch_rows, micro_batch_size=recipe.micro_batch_size,
        grad_clip=recipe.optim.grad_clip, value_clip=alg.value_clip, value_coef=alg.value_coef,
        needs_reference=alg.kl_coef > 0, kl_in_reward=alg.kl_in_reward, tis_cap=alg.tis_cap, seed=recipe.seed,
    )  # fmt: skip


def step_rewards(recipe: TrainRecipe, trajectories: list[Trajectory]) -> tuple[RewardOutput, list[float]]:
    """(the rewards trained on, their totals before shaping) of a step's trajectories.

    The rewards trained on are the recipe's weighted reward plus DAPO's overlong shaping; dynamic
    sampling judges a group's flatness on the totals before shaping (`policy.sampling`).

    With `reward.overlong_buffer` > 0, L is a trajectory's prompt + response tokens (the documents
    inserted count: they fill the same context, so a trajectory that searches more is penalised
    sooner) and L_max is `rollout.max_context_tokens`. A trajectory the context cut (finish
    "context") counts as L = L_max and gets the full penalty, as DAPO's truncated responses do,
    even when the rollout stopped it short of L_max because the next observation did not fit.
    DAPO and verl's `DAPORewardManager` count the response against a response budget separate
    from the prompt's; here one budget holds both.
    """
    reward = recipe.reward
    scored = score_trajectories(trajectories, reward.resolved_weights(), normalization=reward.normalization)
    if reward.overlong_buffer == 0:
        return scored, scored.total
    limit = recipe.rollout.max_context_tokens
    lengths = [limit if t.finish == "context" else len(t.prompt_ids) + len(t.response_ids) for t in trajectories]
    return shape_overlong(scored, lengths, limit, reward.overlong_buffer, reward.overlong_penalty), scored.total


def step_batch(recipe: TrainRecipe, trajectories: list[Trajectory], pad_id: int) -> TrainBatch:
    """The step's training batch on CPU; with `algorithm.mask_unfinished`, unfinished rows masked out of the loss."""
    return collate_trajectories(trajectories, pad_id, mask_unfinished=recipe.algorithm.mask_unfinished)


def step_advantages(
    alg: AlgorithmConfig, learner: Learner, settings: UpdateSettings, rewards: list[float], batch: TrainBatch,
    passes: ForwardPasses, result: RolloutResult, tokenizer: Any = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, dict[str, float]]:  # fmt: skip
    """(advantages, what the update trains on, returns, stats): the estimator's, then TIS-weighted.

    `tokenizer` (the policy's) is needed by estimators that measure information gains (IGPO: the
    gold answers are tokenized); their extra forward passes are timed as `time/infogain_s`.
    """
    device = learner.device
    kl_tokens, timing = None, {}
    if alg.kl_in_reward and settings.needs_reference:
        kl_tokens = sequence_kl(passes.old_logp, passes.ref_logp, batch.loss_mask, alg.kl_estimator)  # type: ignore[arg-type]
    if ESTIMATORS[alg.estimator].information_gain:  # kl_in_reward is refused with it (AlgorithmConfig)
        began = time.perf_counter()
        advantages, returns, adv_stats = _information_gain_advantages(
            alg, learner, settings, rewards, batch, result, tokenizer
        )
        timing["time/infogain_s"] = time.perf_counter() - began
    else:
        advantages, returns, adv_stats = token_advantages(
            alg.estimator, torch.tensor(rewards, dtype=torch.float32), batch.to("cpu"),
            kl=None if kl_tokens is None else kl_tokens.cpu(), kl_coef=alg.kl_coef if kl_tokens is not None else 0.0,
            values=None if passes.old_values is None else passes.old_values.cpu(),
            gamma=alg.gamma, lam=alg.lam, stratified_alpha=alg.stratified_alpha,
        )  # fmt: skip
    advantages = advantages.to(device)
    returns = None if returns is None else returns.to(device)
    trained, tis_stats = advantages, dict[str, torch.Tensor]()
    if alg.tis_cap > 0:
        # Weights >= 0 scale each token's clipped surrogate exactly (policy.offpolicy); the logged
        # advantages stay the estimator's. Both sides are raw (untempered) log-probs, so the weights
        # measure the engines' disagreement; p_trainer is the old log-probs, then always computed.
        rollout_logp = collate_rollout_logprobs(result.trajectories).to(device)  # [B, L]
        weights, tis_stats = truncated_is_weights(passes.raw_logp, rollout_logp, alg.tis_cap, batch.loss_mask)  # type: ignore[arg-type]
        trained = advantages * weights  # [B, L], 0 where not trained
    stats = {f"advantages/{k}": float(v) for k, v in adv_stats.items()}
    stats.update({f"offpolicy/{k}": float(v) for k, v in tis_stats.items()})
    stats.update(timing)
    return advantages, trained, returns, stats


def _information_gain_advantages(
    alg: AlgorithmConfig, learner: Learner, settings: UpdateSettings, rewards: list[float], batch: TrainBatch,
    result: RolloutResult, tokenizer: Any,
) -> tuple[torch.Tensor, None, Stats]:  # fmt: skip
    """IGPO's `[B, L]` advantages (CPU): the policy's gold-answer probability after each turn (`policy.infogain`)."""
    trajectories = result.trajectories
    if tokenizer is None:
        raise ValueError(f"step_advantages: estimator {alg.estimator!r} needs the policy's tokenizer (gold answers)")
    if len(trajectories) != batch.size:
        raise ValueError(f"step_advantages: {len(trajectories)} trajectories for a batch of {batch.size} rows")
    mbs, sync = settings.micro_batch_size, learner.actor.zero3 and learner.world > 1
    queries = gold_queries(trajectories, tokenizer, fill=sync)
    count = torch.tensor([-(-len(queries) // mbs)])
    count = all_reduce_max(count, learner.world) if sync else count  # ZeRO-3: as many forward passes everywhere
    with learner.autocast_context():
        probabilities = gold_probabilities(
            learner.actor.engine, queries, pad_id=tokenizer.pad_token_id, device=learner.device,
            micro_batch_size=mbs, temperature=settings.loss.temperature, passes=int(count[0]),
        )  # fmt: skip
    turns = turn_index(trajectories, batch.response_width)  # [B, L]
    cpu = batch.to("cpu")
    inputs = EstimatorInputs(
        torch.tensor(rewards, dtype=torch.float32), cpu.loss_mask, cpu.group_ids, cpu.num_searches,
        gamma=alg.igpo_gamma, gains=information_gains(queries, probabilities, turns), turn_index=turns,
    )  # fmt: skip
    advantages, _, stats = ESTIMATORS[alg.estimator].compute(inputs)
    return advantages, None, stats


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


@dataclass
class StepSample:
    """A step's rollout, as the update trains on it.

    Attributes:
        result: The trajectories to train on (`prompt_id` numbers their groups 0, 1, ...). Under
            dynamic sampling its metrics are the first round's (the step's own prompts, comparable
            with a run without it), except `perf/prompt_tokens` and `perf/decoded_tokens`, and its
            timings, which add up every round.
        scored: The rewards of those trajectories; its stats, too, are the first round's.
        prompts: Data-stream positions the step used, over all processes: the data position
            advances by this much.
        metrics: `sampling/flat_share`, `time/reward_s` (scoring and shaping the rewards, every
            round); under dynamic sampling `sampling/rounds`, `sampling/prompts` and
            `sampling/groups` (informative groups trained on, over all processes; 0 when none was
            found and the first round is trained on).
    """

    result: RolloutResult
    scored: RewardOutput
    prompts: int
    metrics: dict[str, float]


RolloutRound = Callable[[list[Any], int], RolloutResult]
"""`rollout(examples, i)`: round i of the step's rollout on these questions."""


def sample_step(
    recipe: TrainRecipe, rollout: RolloutRound, data: list[Any], position: int, share: slice, world: int,
    minibatch_rows: int,
) -> StepSample:  # fmt: skip
    """The step's rollouts and rewards: one round, or DAPO's dynamic sampling (`policy.sampling`).

    Round i takes positions [position + i x prompts_per_step, ...) of the seeded data stream, this
    process its `share` of them. Each process fills its own share: it stops when it holds that many
    informative groups; the data position then advances by the most rounds any process ran, and
    every process trains on as many groups as the one that found fewest (minus what the minibatch
    size cannot split), so all run the same micro-batches. A process's share of a round it did not
    need is skipped.
    """
    step_prompts, alg = recipe.prompts_per_step, recipe.algorithm
    reward_s = 0.0

    def one_round(i: int) -> Round[tuple[RolloutResult, RewardOutput]]:
        nonlocal reward_s
        indices = stream_indices(len(data), position + i * step_prompts, step_prompts, recipe.seed)[share]
        result = rollout([data[j] for j in indices], i)
        began = time.perf_counter()
        scored, unshaped = step_rewards(recipe, result.trajectories)
        reward_s += time.perf_counter() - began
        return Round((result, scored), unshaped, [t.prompt_id for t in result.trajectories])

    rounds = alg.max_sampling_rounds if alg.dynamic_sampling else 1
    sampled = sample_informative(one_round, share.stop - share.start, rounds)
    metrics = {"sampling/flat_share": sampled.flat_share, "time/reward_s": reward_s}
    if not alg.dynamic_sampling:
        result, scored = sampled.rounds[0].output
        return StepSample(result, scored, step_prompts, metrics)
    most = all_reduce_max(torch.tensor([len(sampled.rounds), -len(sampled.informative)]), world).tolist()
    count = trainable_groups(-most[1], recipe.rollout.group_size, minibatch_rows)
    prompts = int(all_reduce_sum(torch.tensor([sampled.prompts]), world).item())
    metrics.update({"sampling/rounds": float(most[0]), "sampling/prompts": float(prompts),
                    "sampling/groups": float(count * world)})  # fmt: skip
    result, scored = _trained_batch(sampled, sampled.trained(count))
    return StepSample(result, scored, most[0] * step_prompts, metrics)


def _trained_batch(
    sampled: Sampled[tuple[RolloutResult, RewardOutput]], groups: list[tuple[int, int]]
) -> tuple[RolloutResult, RewardOutput]:
    """The trajectories and rewards of `groups` ((round, group id) each), groups renumbered in order."""
    first, first_scored = sampled.rounds[0].output
    trajectories, total, components = [], [], {name: list[float]() for name in first_scored.components}
    for new_id, (i, group) in enumerate(groups):
        result, scored = sampled.rounds[i].output
        for row, trajectory in enumerate(result.trajectories):
            if trajectory.prompt_id == group:
                trajectories.append(replace(trajectory, prompt_id=new_id))
                total.append(scored.total[row])
                for name, values in components.items():
                    values.append(scored.components[name][row])
    results = [r.output[0] for r in sampled.rounds]
    metrics = dict(first.metrics)
    for key in ("perf/prompt_tokens", "perf/decoded_tokens"):
        metrics[key] = sum(r.metrics[key] for r in results)
    timings = {key: sum(r.timings[key] for r in results) for key in first.timings}
    return RolloutResult(trajectories, metrics, timings), RewardOutput(total, components, first_scored.stats)


def rollout_round(
    recipe: TrainRecipe, generator: Any, tokenizer: Any, search: Any, rank: int, p_noise: float, step: int,
    examples: list[Any], round_: int,
) -> RolloutResult:  # fmt: skip
    """`group_size` trajectories per question, each search call with num_noisy(p_noise, top_k) noisy documents.

    Sampling and coin flips are seeded by (seed, step, process, round); round 0 draws what a step
    without dynamic sampling draws.
    """
    key = f"{step}:{rank}" + (f":{round_}" if round_ else "")
    noise_rng = random.Random(f"noise:{recipe.seed}:{key}")
    sampling = SamplingParams(
        temperature=recipe.sampling.temperature, top_p=recipe.sampling.top_p,
        max_new_tokens=recipe.sampling.max_new_tokens, logprobs=recipe.algorithm.tis_cap > 0,
        seed=derived_seed(recipe.seed, f"rollout{round_ or ''}", step, rank),
    )  # fmt: skip
    return generate_trajectories(
        examples, policy=generator, tokenizer=tokenizer, search=search,
        settings=rollout_settings(recipe, recipe.search), sampling=sampling, group_size=recipe.rollout.group_size,
        noise=lambda top_k: num_noisy(p_noise, top_k, recipe.curriculum.granularity, noise_rng),
        rng=random.Random(f"real:{recipe.seed}:{key}"),
    )  # fmt: skip
