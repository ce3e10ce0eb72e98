"""The actor's loss: PPO's clipped surrogate over `algorithm`'s settings, and one micro-batch's total.

    actor loss = policy_loss + kl_coef * KL - entropy_coef * entropy

each term present only when its coefficient is > 0 (with `kl_in_reward` the KL goes into the
reward instead, `AlgorithmConfig.kl_loss_coef`).
"""

from __future__ import annotations

import torch

from simsearch.policy.collate import TrainBatch
from simsearch.policy.losses import (
    LOG_RATIO_CLAMP,
    RATIO_LEVELS,
    KLEstimator,
    aggregate_loss,
    check_same_shape,
    entropy_from_logits,
    kl_loss,
    kl_penalty,
    token_logprobs,
)
from simsearch.policy.masked import Stats, masked_mean, masked_sum
from simsearch.policy.recipe import AlgorithmConfig


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    alg: AlgorithmConfig,
    denominator: float | torch.Tensor | None = None,
    token_sum_normalizer: float | None = None,
) -> tuple[torch.Tensor, Stats]:
    """PPO clipped surrogate with an asymmetric clip range, optionally dual-clipped, token or sequence ratios.

    Per token: ratio = exp(logp - old_logp),
    loss_t = max(-A_t * ratio, -A_t * clip(ratio, 1 - clip_low, 1 + clip_high)); with dual clip,
    where A_t < 0, loss_t = min(loss_t, -A_t * clip_ratio_c). With `ratio_level="sequence"` every
    token of row i takes the row's ratio s_i = exp(mean of its valid tokens' logp - old_logp),
    with the gradient s_i x the mean of grad log pi(y_t) (GSPO-token).

    Args:
        logp: `[B, L]` log-probs of the sampled tokens under the current policy (with grad).
        old_logp: `[B, L]` log-probs under the policy that sampled them (no grad needed).
        advantages: `[B, L]` token-level advantages.
        loss_mask: `[B, L]` 1 at tokens trained on.
        alg: `clip_low`, `clip_high` (the ratio's range [1 - clip_low, 1 + clip_high]),
            `clip_ratio_c` (dual-clip bound, 0 = none), `ratio_level` and `loss_agg`.
        denominator, token_sum_normalizer: see `losses.aggregate_loss`.

    Returns:
        The loss and stats `clipfrac`, `clipfrac_lower` (shares of valid tokens clipped, dual
        clipped), `approx_kl` (mean old_logp - logp), `ratio_mean`, `ratio_min`, `ratio_max`.
    """
    clip_low, clip_high, clip_ratio_c, ratio_level = alg.clip_low, alg.clip_high, alg.clip_ratio_c, alg.ratio_level
    check_same_shape(logp, old_logp, "logp", "old_logp", "policy_loss")
    check_same_shape(logp, advantages, "logp", "advantages", "policy_loss")
    check_same_shape(logp, loss_mask, "logp", "loss_mask", "policy_loss")
    if clip_low < 0 or clip_high < 0 or clip_low >= 1:
        raise ValueError(
            f"policy_loss: need 0 <= clip_low < 1 and clip_high >= 0, got clip_low={clip_low}, clip_high={clip_high}"
        )
    if clip_ratio_c != 0 and not clip_ratio_c > 1:  # `not >` also refuses NaN
        raise ValueError(f"policy_loss: clip_ratio_c must be 0 (no dual clip) or > 1, got {clip_ratio_c}")
    if ratio_level not in RATIO_LEVELS:
        raise ValueError(f"policy_loss: unknown ratio_level {ratio_level!r}; use one of {', '.join(RATIO_LEVELS)}")
    valid = loss_mask.bool()
    zeros = torch.zeros_like(logp)
    # select before any arithmetic: garbage at masked positions stays out of values and grads
    token_log_ratio = torch.where(valid, logp - old_logp.detach(), zeros)  # [B, L]
    log_ratio = RATIO_LEVELS[ratio_level](token_log_ratio, logp, valid)  # [B, L]
    adv = torch.where(valid, advantages.detach().to(logp.dtype), zeros)  # [B, L]
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # [B, L]
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)  # [B, L]
    dual_clipped = torch.zeros_like(valid)  # [B, L]
    if clip_ratio_c:
        bound = -adv * clip_ratio_c  # [B, L]
        dual_clipped = (adv < 0) & (per_token > bound)
        per_token = torch.where(dual_clipped, bound, per_token)
    loss = aggregate_loss(per_token, loss_mask, alg.loss_agg, denominator, token_sum_normalizer)
    return loss, _policy_stats(clipped > unclipped, dual_clipped, token_log_ratio, ratio, valid)


@torch.no_grad()
def _policy_stats(
    clipped: torch.Tensor, dual_clipped: torch.Tensor, token_log_ratio: torch.Tensor, ratio: torch.Tensor,
    valid: torch.Tensor,
) -> Stats:  # fmt: skip
    """`policy_loss`'s stats from its `[B, L]` clip indicators, token log-ratios and ratios."""
    ratio = ratio.detach()
    any_valid = valid.any()
    return {
        "clipfrac": masked_mean(clipped.to(ratio.dtype), valid),
        "clipfrac_lower": masked_mean(dual_clipped.to(ratio.dtype), valid),
        "approx_kl": masked_mean(-token_log_ratio.detach(), valid),
        "ratio_mean": masked_mean(ratio, valid),
        "ratio_min": torch.where(any_valid, torch.where(valid, ratio, torch.inf).min(), 1.0),
        "ratio_max": torch.where(any_valid, torch.where(valid, ratio, -torch.inf).max(), 1.0),
    }


def actor_micro_loss(
    logits: torch.Tensor,
    micro: TrainBatch,
    advantages: torch.Tensor,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor | None,
    alg: AlgorithmConfig,
    denominators: tuple[float, float],
    *,
    temperature: float,
    token_sum_normalizer: float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The actor loss of one micro-batch: clipped policy loss + kl_coef x KL - entropy_coef x H.

    The micro-batch holds whole rows, so GSPO's sequence ratios are exact.

    Args:
        logits: `[b, L', V]` `response_logits` of the micro-batch (with grad).
        micro: The micro-batch.
        advantages: `[b, L']` token advantages.
        old_logp: `[b, L']` log-probs of the sampling policy; None = on-policy (the current ones detached).
        ref_logp: `[b, L']` reference log-probs; required when `alg.kl_loss_coef` > 0, logged when given.
        alg: Clip range, aggregation, KL estimator and coefficients.
        denominators: (valid tokens, sequences) of the whole minibatch (`loss_denominators`).
        temperature: The rollout's: log-probs and entropy are those of softmax(logits / temperature).
        token_sum_normalizer: The constant of "seq-mean-token-sum-norm" (None otherwise).

    Returns:
        The scalar loss to backpropagate, and float stats `policy`, `kl`, `entropy`,
        `clipfrac`, `clipfrac_lower`, `approx_kl`, `ratio_mean`, `ratio_max`, `tokens` (micro-batch loss parts
        are already divided by the minibatch's counts, so they sum over micro-batches; `entropy_sum` is the
        micro-batch's sum over its valid tokens; the rest are micro-batch means).
    """
    mask = micro.loss_mask
    logp = token_logprobs(logits, micro.responses, temperature=temperature)  # [b, L']
    old = logp.detach() if old_logp is None else old_logp
    tokens, sequences = denominators
    denominator = tokens if alg.loss_agg == "token-mean" else sequences
    loss, pstats = policy_loss(logp, old, advantages, mask, alg, denominator, token_sum_normalizer)
    stats = {
        "policy": float(loss.detach()),
        "clipfrac": float(pstats["clipfrac"]),
        "clipfrac_lower": float(pstats["clipfrac_lower"]),
        "approx_kl": float(pstats["approx_kl"]),
        "ratio_mean": float(pstats["ratio_mean"]),
        "ratio_max": float(pstats["ratio_max"]),
        "tokens": float(mask.sum()),
    }
    kl_term = _kl_term(logp, ref_logp, mask, alg, denominator, token_sum_normalizer, stats)
    if kl_term is not None:
        loss = loss + kl_term
    entropy_term = _entropy_term(logits, mask, alg.entropy_coef, tokens, temperature, stats)
    if entropy_term is not None:
        loss = loss - entropy_term
    return loss, stats


def _kl_term(
    logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    mask: torch.Tensor,
    alg: AlgorithmConfig,
    denominator: float,
    token_sum_normalizer: float | None,
    stats: dict[str, float],
) -> torch.Tensor | None:
    """kl_coef x KL to the reference (None when kl_coef is 0); logs `kl` in `stats` whenever ref_logp is given."""
    kl_coef = alg.kl_loss_coef
    if ref_logp is None:
        if kl_coef > 0:
            raise ValueError(f"actor_micro_loss: kl_coef={kl_coef} needs ref_logp")
        return None
    kl, _ = kl_loss(logp, ref_logp, mask, alg.kl_estimator, alg.loss_agg, denominator, token_sum_normalizer)
    stats["kl"] = float(kl.detach())
    return kl_coef * kl if kl_coef > 0 else None


def _entropy_term(
    logits: torch.Tensor,
    mask: torch.Tensor,
    entropy_coef: float,
    tokens: float,
    temperature: float,
    stats: dict[str, float],
) -> torch.Tensor | None:
    """entropy_coef x the token-mean entropy (None when entropy_coef is 0); logs `entropy` and its sum `entropy_sum`."""
    valid = mask.bool()
    if entropy_coef > 0:
        total = masked_sum(entropy_from_logits(logits, temperature=temperature), valid)
        entropy = total / tokens
        stats["entropy"], stats["entropy_sum"] = float(entropy.detach()), float(total.detach())
        return entropy_coef * entropy
    with torch.no_grad():
        total = masked_sum(entropy_from_logits(logits.detach(), temperature=temperature), valid)
        stats["entropy"], stats["entropy_sum"] = float(total / tokens), float(total)
    return None


def sequence_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """`[B, L]` per-token KL estimate, 0 at masked positions (for `kl_in_reward`)."""
    kl = kl_penalty(logp, ref_logp, estimator)
    return torch.where(mask.bool(), kl, torch.zeros_like(kl))
