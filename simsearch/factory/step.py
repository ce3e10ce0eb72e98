"""One step of `simsearch train`, from the recipe: its rollout rounds (DAPO's dynamic sampling
included), rewards (DAPO's overlong shaping included), training batch and advantages (IGPO's
extra forward passes included).

`factory.train` builds the objects the loop works with; this module is what the loop calls on
them every step.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from simsearch.curriculum.schedules import num_noisy
from simsearch.factory.train import rollout_settings
from simsearch.policy.advantages import ESTIMATORS, EstimatorInputs, Stats
from simsearch.policy.batch import (
    TrainBatch,
    collate_rollout_logprobs,
    collate_trajectories,
    sequence_kl,
    stream_indices,
    token_advantages,
)
from simsearch.policy.infogain import (
    distinct,
    forward_passes,
    gold_probabilities,
    gold_queries,
    information_gains,
    turn_index,
)
from simsearch.policy.offpolicy import truncated_is_weights
from simsearch.policy.rewards import RewardOutput, shape_overlong
from simsearch.policy.rollout import RolloutResult, generate_trajectories, score_trajectories
from simsearch.policy.sampling import Round, Sampled, sample_informative, trainable_groups
from simsearch.policy.update import ForwardPasses, Learner, UpdateSettings, derived_seed
from simsearch.training.distributed import all_reduce_max, all_reduce_sum
from simsearch.types import SamplingParams, Trajectory

if TYPE_CHECKING:
    from simsearch.config import TrainRecipe
    from simsearch.policy.recipe import AlgorithmConfig


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
    """The step's training batch on CPU; with `algorithm.mask_unfinished`, over-turn rows masked out of the loss."""
    alg = recipe.algorithm
    return collate_trajectories(
        trajectories, pad_id, mask_unfinished=alg.mask_unfinished, mask_gave_up=alg.mask_gave_up
    )


def step_advantages(
    alg: AlgorithmConfig, learner: Learner, settings: UpdateSettings, rewards: list[float], batch: TrainBatch,
    passes: ForwardPasses, result: RolloutResult, tokenizer: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, dict[str, float]]:  # fmt: skip
    """(advantages, what the update trains on, returns, stats): the estimator's, then TIS-weighted.

    `tokenizer` is the policy's: estimators that measure information gains (IGPO) tokenize the
    gold answers with it; their extra forward passes are timed as `time/infogain_s`.
    """
    device = learner.device
    kl_tokens, timing = None, {}
    if alg.kl_in_reward and settings.needs_reference:
        kl_tokens = sequence_kl(
            passes.old_logp, passes.ref_logp, batch.loss_mask, alg.kl_estimator  # type: ignore[arg-type]
        )  # fmt: skip
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
        weights, tis_stats = truncated_is_weights(
            passes.raw_logp, rollout_logp, alg.tis_cap, batch.loss_mask  # type: ignore[arg-type]
        )  # fmt: skip
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
    if len(trajectories) != batch.size:
        raise ValueError(f"step_advantages: {len(trajectories)} trajectories for a batch of {batch.size} rows")
    mbs, sync = settings.micro_batch_size, learner.actor.zero3 and learner.world > 1
    queries = gold_queries(trajectories, tokenizer, fill=sync)
    unique, index = distinct(queries)  # once: the pass count and the forward passes both use it
    passes = 0  # alone, a process runs the passes its queries need
    if sync:  # ZeRO-3: as many forward passes on every process as the busiest one runs
        passes = int(all_reduce_max(torch.tensor([forward_passes(len(unique), mbs)]), learner.world)[0])
    with learner.autocast_context():
        measured = gold_probabilities(
            learner.actor.engine, unique, pad_id=tokenizer.pad_token_id, device=learner.device,
            micro_batch_size=mbs, temperature=settings.loss.temperature, passes=passes,
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
