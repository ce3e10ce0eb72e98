"""The RL update of one training step, as functions over an explicit `Learner`.

`forward_passes` computes what the update compares against (reference and old log-probs, critic
values; old log-probs only when the batch is reused, else the current ones detached); `update`
runs `ppo_epochs` passes over minibatches of micro-batches: actor loss, value loss, one optimizer
step per minibatch, the LR schedules once per training step. Rows with all-zero advantages may
skip the forward/backward (same gradient). Under DeepSpeed, batch-wide statistics are per process.
Departures: docs/protocols.md.
"""

from __future__ import annotations

import random
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from simsearch.policy.actor_loss import actor_micro_loss
from simsearch.policy.collate import (
    TrainBatch,
    logprobs_in_micro_batches,
    loss_denominators,
    micro_batches,
    minibatches,
    pad_micro_batches,
    response_logits,
    rows_with_signal,
)
from simsearch.policy.critic import values_in_micro_batches, values_of
from simsearch.policy.losses import value_loss
from simsearch.policy.recipe import AlgorithmConfig
from simsearch.training.distributed import all_reduce_max, backward
from simsearch.training.session import TrainedModel

_TOKEN_MEANS = ("clipfrac", "clipfrac_lower", "approx_kl")


@dataclass
class Learner:
    """The models one RL step trains and compares against.

    Attributes:
        actor: The policy under training.
        critic: The value model (PPO-GAE), or None.
        reference: The frozen initial policy, or None (no KL, or LoRA: the actor with its
            adapter disabled is the reference).
        lora: The actor is a PEFT model.
        device: Where batches go.
        autocast: bf16 autocast around forward passes (not under DeepSpeed, which has its own).
        rank: This process.
        world: Processes.
    """

    actor: TrainedModel
    critic: TrainedModel | None
    reference: Any | None
    lora: bool
    device: torch.device
    autocast: bool
    rank: int
    world: int

    def autocast_context(self) -> Any:
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16) if self.autocast else nullcontext()


@dataclass(frozen=True)
class UpdateShape:
    """What the update takes beside the recipe's `algorithm` section (other sections' values, or derived).

    Attributes:
        minibatch_rows: This process's rows per optimizer step (0 = the whole batch).
        micro_batch_size: Rows per forward/backward.
        temperature: The rollout's sampling temperature; every log-prob and the entropy are tempered by it.
        token_sum_normalizer: The constant of "seq-mean-token-sum-norm" (None otherwise).
        grad_clip: Gradient-norm clip (<= 0: none).
        seed: The recipe's seed (minibatch shuffles are drawn from it, the step and the process).
    """

    minibatch_rows: int
    micro_batch_size: int
    temperature: float
    token_sum_normalizer: float | None
    grad_clip: float
    seed: int


def skips_flat_rows(alg: AlgorithmConfig, has_critic: bool) -> bool:
    """Rows without signal may skip the forward/backward only where nothing else acts on them."""
    return not has_critic and alg.kl_loss_coef == 0 and alg.entropy_coef == 0


def reuses(alg: AlgorithmConfig, shape: UpdateShape, batch_size: int) -> bool:
    """The batch is used by more than one optimizer step: old log-probs must be kept."""
    return alg.ppo_epochs > 1 or bool(shape.minibatch_rows and shape.minibatch_rows < batch_size)


@dataclass
class ForwardPasses:
    """What the update compares against, each `[B, L]` or None when not needed.

    Attributes:
        ref_logp: Reference log-probs (tempered).
        old_logp: The sampling policy's log-probs (tempered), recomputed when needed.
        raw_logp: Untempered old log-probs, for truncated importance sampling.
        old_values: The critic's values.
    """

    ref_logp: torch.Tensor | None = None
    old_logp: torch.Tensor | None = None
    raw_logp: torch.Tensor | None = None
    old_values: torch.Tensor | None = None


def forward_passes(learner: Learner, alg: AlgorithmConfig, shape: UpdateShape, batch: TrainBatch) -> ForwardPasses:
    """Reference and old log-probs and critic values of a freshly collated batch."""
    out = ForwardPasses()
    actor, mbs, temp = learner.actor, shape.micro_batch_size, shape.temperature
    with learner.autocast_context():
        if alg.needs_reference:
            with actor.module.disable_adapter() if learner.lora else nullcontext():
                ref_model = actor.engine if learner.lora else learner.reference
                assert ref_model is not None  # needs_reference without LoRA loads a reference
                out.ref_logp = logprobs_in_micro_batches(ref_model, batch, mbs, temp)
        reused = reuses(alg, shape, batch.size)
        if reused or (alg.kl_in_reward and alg.needs_reference) or alg.tis_cap > 0:
            out.old_logp = logprobs_in_micro_batches(actor.engine, batch, mbs, temp)
        if alg.tis_cap > 0:  # the engines report raw log-probs: compare like with like
            out.raw_logp = out.old_logp if temp == 1 else logprobs_in_micro_batches(actor.engine, batch, mbs)
        if learner.critic is not None:
            out.old_values = values_in_micro_batches(learner.critic.engine, batch, mbs)
    return out


def update(
    learner: Learner,
    alg: AlgorithmConfig,
    shape: UpdateShape,
    batch: TrainBatch,
    advantages: torch.Tensor,
    passes: ForwardPasses,
    returns: torch.Tensor | None,
    step: int,
) -> dict[str, float]:
    """`ppo_epochs` passes over the minibatches, then one step of the LR schedules.

    Args:
        learner: The models.
        alg: The recipe's `algorithm` section.
        shape: Batching, temperature and the other values beside it.
        batch: The step's batch, on the learner's device.
        advantages: `[B, L]` token advantages (already importance-weighted where that is on).
        passes: `forward_passes` of the batch.
        returns: `[B, L]` value targets (with a critic), or None.
        step: The training step (seeds the minibatch shuffle).

    Returns:
        Metrics: `losses/*`, `optim/grad_norm` (and `optim/critic_grad_norm`), `perf/skipped_row_share`,
        and `health/entropy`, `health/ratio_mean`, `health/ratio_max` (token means over every pass).
    """
    lengths = batch.prompt_lens + batch.response_lens
    if skips_flat_rows(alg, learner.critic is not None):
        keep = rows_with_signal(advantages)
    else:
        keep = torch.ones(batch.size, dtype=torch.bool, device=lengths.device)
    old_logp = passes.old_logp if reuses(alg, shape, batch.size) else None
    sums: dict[str, float] = defaultdict(float)
    inputs = _MicroInputs(advantages, old_logp, passes.ref_logp, returns, passes.old_values)
    plan = _plan(learner, alg, shape, batch.size, lengths, keep, step)
    for rows, micros in plan:
        denominators = loss_denominators(batch.loss_mask[rows])
        for i, micro_rows in enumerate(micros):
            _micro_step(learner, alg, shape, batch.select(micro_rows), micro_rows, inputs, denominators, sums,
                        boundary=i == len(micros) - 1)  # fmt: skip
        sums["grad_norm"] += optimizer_step(learner.actor, shape.grad_clip)
        if learner.critic is not None:
            sums["critic_grad_norm"] += optimizer_step(learner.critic, shape.grad_clip)
    learner.actor.scheduler.step()
    if learner.critic is not None:
        learner.critic.scheduler.step()
    return _update_metrics(sums, len(plan), keep, alg.needs_reference, learner.critic is not None)


def _plan(
    learner: Learner,
    alg: AlgorithmConfig,
    shape: UpdateShape,
    size: int,
    lengths: torch.Tensor,
    keep: torch.Tensor,
    step: int,
) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
    """(minibatch rows, its micro-batches of kept rows) for every optimizer step of the update."""
    shuffle = torch.Generator().manual_seed(derived_seed(shape.seed, "minibatch", step, learner.rank))
    plan = [
        (rows, micro_batches(rows[keep[rows]], lengths, shape.micro_batch_size))
        for _ in range(alg.ppo_epochs)
        for rows in (r.to(lengths.device) for r in minibatches(size, shape.minibatch_rows, shuffle))
    ]
    if learner.actor.deepspeed:
        # DeepSpeed steps at the boundary we set, after the last micro-batch of each minibatch;
        # every process runs as many micro-batches (each forward/backward has collectives) and
        # at least one, so skipped rows never move or drop a step. Fillers are skipped rows
        # (gradient 0).
        counts = all_reduce_max(torch.tensor([max(len(micros), 1) for _, micros in plan]), learner.world)
        plan = [
            (rows, pad_micro_batches(micros, rows[~keep[rows]], lengths, int(n)))
            for (rows, micros), n in zip(plan, counts, strict=True)
        ]
    return plan


@dataclass
class _MicroInputs:
    advantages: torch.Tensor  # [B, L]
    old_logp: torch.Tensor | None  # [B, L]
    ref_logp: torch.Tensor | None  # [B, L]
    returns: torch.Tensor | None  # [B, L]
    old_values: torch.Tensor | None  # [B, L]

    def rows(self, name: str, rows: torch.Tensor, width: int) -> torch.Tensor | None:
        value = getattr(self, name)
        return None if value is None else value[rows, :width]

    def required_rows(self, name: str, rows: torch.Tensor, width: int) -> torch.Tensor:
        """`rows` of an input the caller's settings guarantee (advantages; with a critic, values and returns)."""
        value = self.rows(name, rows, width)
        if value is None:
            raise ValueError(f"the update needs {name}, which was not computed")
        return value


def _micro_step(
    learner: Learner,
    alg: AlgorithmConfig,
    shape: UpdateShape,
    micro: TrainBatch,
    micro_rows: torch.Tensor,
    inputs: _MicroInputs,
    denominators: tuple[float, float],
    sums: dict[str, float],
    *,
    boundary: bool,
) -> None:
    """Forward and backward of one micro-batch (actor, then critic); adds its stats to `sums`."""
    width = micro.response_width
    actor, critic = learner.actor, learner.critic
    with learner.autocast_context():
        logits = response_logits(actor.engine, micro)
    advantages = inputs.required_rows("advantages", micro_rows, width)
    old_logp, ref_logp = inputs.rows("old_logp", micro_rows, width), inputs.rows("ref_logp", micro_rows, width)
    loss, stats = actor_micro_loss(
        logits, micro, advantages, old_logp, ref_logp, alg, denominators,
        temperature=shape.temperature, token_sum_normalizer=shape.token_sum_normalizer,
    )  # fmt: skip
    backward(loss, actor.engine if actor.deepspeed else None, boundary=boundary)
    sums["policy"] += stats["policy"]
    sums["kl"] += stats.get("kl", 0.0)
    for name in _TOKEN_MEANS:
        sums[name] += stats[name] * stats["tokens"]
    sums["tokens"] += stats["tokens"]
    sums["entropy_sum"] += stats["entropy_sum"]
    sums["ratio_sum"] += stats["ratio_mean"] * stats["tokens"]
    if stats["tokens"]:
        sums["ratio_max"] = max(sums.get("ratio_max", 0.0), stats["ratio_max"])
    if critic is None:
        return
    with learner.autocast_context():
        values = values_of(critic.engine, micro)
    aggregation = alg.loss_agg
    old_values, returns = (inputs.required_rows(name, micro_rows, width) for name in ("old_values", "returns"))
    vloss, _ = value_loss(
        values, old_values, returns, micro.loss_mask, alg.value_clip, aggregation,
        denominators[0] if aggregation == "token-mean" else denominators[1], shape.token_sum_normalizer,
    )  # fmt: skip
    backward(alg.value_coef * vloss, critic.engine if critic.deepspeed else None, boundary=boundary)
    sums["value"] += float(vloss.detach())


def _update_metrics(
    sums: dict[str, float], updates: int, keep: torch.Tensor, with_kl: bool, with_critic: bool
) -> dict[str, float]:
    tokens = max(sums["tokens"], 1.0)  # 0 when every row was skipped
    out = {"perf/skipped_row_share": 1.0 - float(keep.float().mean())}
    parts = ("policy",) + (("kl",) if with_kl else ()) + (("value",) if with_critic else ())
    out.update({f"losses/{k}": sums[k] / updates for k in parts})
    out.update({f"losses/{k}": sums[k] / tokens for k in _TOKEN_MEANS})
    out["losses/entropy"] = sums["entropy_sum"] / tokens  # each micro-batch's `entropy` is over the minibatch's tokens
    # Health signals (training.health): exact token means over every pass; 1 = no ratio seen. No entropy
    # when every row was skipped (every group flat): no token was scored, and 0 would read as a collapse.
    if sums["tokens"]:
        out["health/entropy"] = sums["entropy_sum"] / sums["tokens"]
    out["health/ratio_mean"] = sums["ratio_sum"] / sums["tokens"] if sums["tokens"] else 1.0
    out["health/ratio_max"] = sums.get("ratio_max", 1.0)
    out["optim/grad_norm"] = sums["grad_norm"] / updates
    if with_critic:
        out["optim/critic_grad_norm"] = sums["critic_grad_norm"] / updates
    return out


def optimizer_step(model: TrainedModel, grad_clip: float) -> float:
    """Clips and steps (DeepSpeed already did at the boundary); returns the gradient norm."""
    if model.deepspeed:
        return float(model.engine.get_global_grad_norm() or 0.0)
    params = [p for group in model.optimizer.param_groups for p in group["params"]]
    for p in params:  # a minibatch whose rows were all skipped has gradient 0, not "no gradient"
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    model.optimizer.step()
    model.optimizer.zero_grad(set_to_none=True)
    return float(norm)


def derived_seed(seed: int, purpose: str, step: int, rank: int) -> int:
    """A seed for one (purpose, step, process): resumed runs draw exactly what they would have."""
    return random.Random(f"{purpose}:{seed}:{step}:{rank}").randrange(2**31)
