"""One training step of `simsearch train`, in order: rollout rounds → rewards → batch → advantages.

The loss pieces follow in `policy.update`. DAPO's dynamic sampling (`sample_step`), DAPO's
overlong shaping (`step_rewards`), IGPO's extra forward passes and truncated importance sampling
(`step_advantages`) are the recipe's options along the way.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from simsearch.curriculum.schedules import num_noisy
from simsearch.generation.recipe import SamplingConfig
from simsearch.policy.actor_loss import sequence_kl
from simsearch.policy.advantages import ESTIMATORS, EstimatorInputs, broadcast_to_tokens
from simsearch.policy.collate import TrainBatch, collate_rollout_logprobs, collate_trajectories
from simsearch.policy.infogain import (
    distinct,
    forward_passes,
    gold_probabilities,
    gold_queries,
    information_gains,
    turn_index,
)
from simsearch.policy.masked import Stats, masked_sum
from simsearch.policy.offpolicy import truncated_is_weights
from simsearch.policy.order import stream_indices
from simsearch.policy.recipe import AlgorithmConfig, RewardConfig, RolloutConfig
from simsearch.policy.rewards import RewardOutput, score_trajectories, shape_overlong
from simsearch.policy.rollout import RolloutResult, RolloutSettings, generate_trajectories
from simsearch.policy.sampling import Round, Sampled, sample_informative, trainable_groups
from simsearch.policy.update import ForwardPasses, Learner, UpdateShape, derived_seed
from simsearch.training.distributed import all_reduce_max, all_reduce_sum
from simsearch.types import SamplingParams, Trajectory


@dataclass(frozen=True)
class StepRecipe:
    """The recipe sections a training step reads (`config.TrainRecipe`'s, by the same names)."""

    algorithm: AlgorithmConfig
    rollout: RolloutConfig
    reward: RewardConfig
    sampling: SamplingConfig
    prompts_per_step: int
    seed: int


@dataclass
class Rollouts:
    """What every rollout round runs with, built once at set-up.

    Attributes:
        recipe: The step's recipe sections.
        generator: The policy's generation engine.
        tokenizer: The policy's tokenizer.
        search: The metered search engine.
        settings: The agent loop's limits for that engine (`factory.train.rollout_settings`).
        granularity: The curriculum's noise granularity (`curriculum.schedules.num_noisy`).
        rank: This process.
    """

    recipe: StepRecipe
    generator: Any
    tokenizer: Any
    search: Any
    settings: RolloutSettings
    granularity: str
    rank: int


def rollout_round(
    r: Rollouts, p_noise: float, step: int, examples: list[Any], round_: int,
    should_stop: Callable[[], bool] | None = None,
) -> RolloutResult:  # fmt: skip
    """`group_size` trajectories per question, each search call with num_noisy(p_noise, top_k) noisy documents.

    Sampling and coin flips are seeded by (seed, step, process, round); round 0 draws what a step
    without dynamic sampling draws. `should_stop` is asked before each turn, so also between
    dynamic sampling's rounds (`rollout.RolloutStopped`).
    """
    recipe, key = r.recipe, f"{step}:{r.rank}" + (f":{round_}" if round_ else "")
    noise_rng = random.Random(f"noise:{recipe.seed}:{key}")
    sampling = SamplingParams(
        temperature=recipe.sampling.temperature, top_p=recipe.sampling.top_p,
        max_new_tokens=recipe.sampling.max_new_tokens, logprobs=recipe.algorithm.tis_cap > 0,
        seed=derived_seed(recipe.seed, f"rollout{round_ or ''}", step, r.rank),
    )  # fmt: skip
    return generate_trajectories(
        examples, policy=r.generator, tokenizer=r.tokenizer, search=r.search, settings=r.settings,
        sampling=sampling, group_size=recipe.rollout.group_size,
        noise=lambda top_k: num_noisy(p_noise, top_k, r.granularity, noise_rng),
        rng=random.Random(f"real:{recipe.seed}:{key}"), should_stop=should_stop,
    )  # fmt: skip


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
    recipe: StepRecipe, rollout: RolloutRound, data: list[Any], position: int, share: slice, world: int,
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
    prompts = int(all_reduce_sum(torch.tensor([sampled.prompts]), world).item())
    count = trainable_groups(-most[1], recipe.rollout.group_size, minibatch_rows)
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


def step_rewards(recipe: StepRecipe, trajectories: list[Trajectory]) -> tuple[RewardOutput, list[float]]:
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


def step_batch(alg: AlgorithmConfig, trajectories: list[Trajectory], pad_id: int) -> TrainBatch:
    """The step's training batch on CPU; with `alg.mask_unfinished`, over-turn rows masked out of the loss."""
    return collate_trajectories(
        trajectories, pad_id, mask_unfinished=alg.mask_unfinished, mask_gave_up=alg.mask_gave_up
    )


def step_advantages(
    alg: AlgorithmConfig, learner: Learner, shape: UpdateShape, rewards: list[float], batch: TrainBatch,
    passes: ForwardPasses, result: RolloutResult, tokenizer: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, dict[str, float]]:  # fmt: skip
    """(advantages, what the update trains on, returns, stats): the estimator's, then TIS-weighted.

    `tokenizer` is the policy's: estimators that measure information gains (IGPO) tokenize the
    gold answers with it; their extra forward passes are timed as `time/infogain_s`.
    """
    device = learner.device
    kl_tokens, timing = None, {}
    if alg.kl_in_reward and alg.needs_reference:
        kl_tokens = sequence_kl(
            passes.old_logp, passes.ref_logp, batch.loss_mask, alg.kl_estimator  # type: ignore[arg-type]
        )  # fmt: skip
    if ESTIMATORS[alg.estimator].information_gain:  # kl_in_reward is refused with it (AlgorithmConfig)
        began = time.perf_counter()
        advantages, returns, adv_stats = _information_gain_advantages(
            alg, learner, shape, rewards, batch, result, tokenizer
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
        weights, tis_stats = truncated_is_weights(
            passes.raw_logp, rollout_logp, alg.tis_cap, batch.loss_mask  # type: ignore[arg-type]
        )  # fmt: skip
        trained = advantages * weights  # [B, L], 0 where not trained
    stats = {f"advantages/{k}": float(v) for k, v in adv_stats.items()}
    stats.update({f"offpolicy/{k}": float(v) for k, v in tis_stats.items()})
    stats.update(timing)
    return advantages, trained, returns, stats


def _information_gain_advantages(
    alg: AlgorithmConfig, learner: Learner, shape: UpdateShape, rewards: list[float], batch: TrainBatch,
    result: RolloutResult, tokenizer: Any,
) -> tuple[torch.Tensor, None, Stats]:  # fmt: skip
    """IGPO's `[B, L]` advantages (CPU): the policy's gold-answer probability after each turn (`policy.infogain`)."""
    trajectories = result.trajectories
    if len(trajectories) != batch.size:
        raise ValueError(f"step_advantages: {len(trajectories)} trajectories for a batch of {batch.size} rows")
    mbs, sync = shape.micro_batch_size, learner.actor.zero3 and learner.world > 1
    queries = gold_queries(trajectories, tokenizer, fill=sync)
    unique, index = distinct(queries)  # once: the pass count and the forward passes both use it
    passes = 0  # alone, a process runs the passes its queries need
    if sync:  # ZeRO-3: as many forward passes on every process as the busiest one runs
        passes = int(all_reduce_max(torch.tensor([forward_passes(len(unique), mbs)]), learner.world)[0])
    with learner.autocast_context():
        measured = gold_probabilities(
            learner.actor.engine, unique, pad_id=tokenizer.pad_token_id, device=learner.device,
            micro_batch_size=mbs, temperature=shape.temperature, passes=passes,
        )  # fmt: skip
    probabilities = measured[torch.tensor(index, dtype=torch.long)]  # [N], each query's measurement
    turns = turn_index(trajectories, batch.response_width)  # [B, L]
    cpu = batch.to("cpu")
    inputs = EstimatorInputs(
        torch.tensor(rewards, dtype=torch.float32), cpu.loss_mask, cpu.group_ids, cpu.num_searches,
        gamma=alg.igpo_gamma, gains=information_gains(queries, probabilities, turns), turn_index=turns,
    )  # fmt: skip
    advantages, _, stats = ESTIMATORS[alg.estimator].compute(inputs)
    return advantages, None, stats


def token_advantages(
    estimator: str,
    rewards: torch.Tensor,
    batch: TrainBatch,
    *,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    stratified_alpha: float = 0.5,
) -> tuple[torch.Tensor, torch.Tensor | None, Stats]:
    """`[B, L]` advantages of the estimator a recipe names (the one place that dispatches on it).

    Args:
        estimator: A name in `advantages.ESTIMATORS`.
        rewards: `[B]` outcome reward per trajectory.
        batch: The trajectories (loss mask, groups, search counts).
        kl: `[B, L]` per-token KL to the reference, folded into the reward when `kl_coef` > 0
            (`kl_in_reward`); see the module docstring for sequence-level estimators.
        kl_coef: Weight of that KL penalty (0 = no KL in the reward).
        values: `[B, L]` critic values; required by "ppo".
        gamma: Discount of REINFORCE++ and GAE.
        lam: GAE lambda.
        stratified_alpha: Weight of the within-stratum term of stratified GRPO.

    Returns:
        (advantages `[B, L]` with 0 at masked positions, returns `[B, L]` for "ppo" else None,
        stats).
    """
    spec = ESTIMATORS.get(estimator)
    if spec is None:
        raise ValueError(f"unknown advantage estimator {estimator!r}; use one of {', '.join(ESTIMATORS)}")
    mask = batch.loss_mask
    rewards = rewards.to(torch.float32)
    if spec.token_level:
        rows = mask.bool().any(dim=-1).nonzero().flatten()  # rows with a token to carry the outcome
        adv, returns, stats = spec.compute(
            EstimatorInputs(
                rewards[rows], mask[rows], batch.group_ids[rows], batch.num_searches[rows],
                kl=None if kl is None else kl[rows], kl_coef=kl_coef,
                values=None if values is None else values[rows], gamma=gamma, lam=lam,
            )
        )  # fmt: skip
        advantages = torch.zeros(mask.shape, dtype=torch.float32)
        advantages[rows] = adv
        if returns is None:
            return advantages, None, stats
        full_returns = torch.zeros(mask.shape, dtype=torch.float32)
        full_returns[rows] = returns
        return advantages, full_returns, stats

    if kl_coef > 0:
        if kl is None:
            raise ValueError(f"token_advantages: kl_coef={kl_coef} needs the per-token kl [B, L]")
        rewards = rewards - kl_coef * masked_sum(kl.detach(), mask, dim=-1)
    seq, _, stats = spec.compute(
        EstimatorInputs(rewards, mask, batch.group_ids, batch.num_searches, stratified_alpha=stratified_alpha)
    )
    return broadcast_to_tokens(seq, mask), None, stats
