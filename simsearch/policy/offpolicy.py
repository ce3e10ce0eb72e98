"""Truncated importance sampling (TIS) for the gap between the rollout engine and the trainer.

    w_t = min(pi_trainer(a_t) / pi_rollout(a_t), cap)

computed without gradient. Multiply the advantages by `w` before `losses.policy_loss`; for w >= 0
this is exact for the clipped surrogate: max(-A w r, -A w clip(r)) = w max(-A r, -A clip(r)).
"""

from __future__ import annotations

import torch

from simsearch.policy.losses import LOG_RATIO_CLAMP  # keeps exp() finite on garbage or far-off tokens
from simsearch.policy.masked import Stats, masked_mean


def truncated_is_weights(
    trainer_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    cap: float,
    loss_mask: torch.Tensor,
) -> tuple[torch.Tensor, Stats]:
    """Per-token truncated importance weights min(exp(trainer_logp - rollout_logp), cap).

    Args:
        trainer_logp: `[B, L]` log-probs of the sampled tokens under the trainer's policy (the
            same weights that sampled them, recomputed by the trainer; any grad is ignored).
        rollout_logp: `[B, L]` log-probs the rollout engine reported for those tokens.
        cap: Upper bound C of the weight (TIS papers use 2); must be >= 1, so an on-policy
            token (ratio 1) is never changed.
        loss_mask: `[B, L]` 1 at tokens trained on.

    Returns:
        `[B, L]` detached weights (0 at masked positions), and stats over valid tokens:
        `weight_mean`, `truncated_frac` (share of tokens whose ratio exceeded `cap`) and
        `mismatch_k1` (mean of rollout_logp - trainer_logp, a k1 estimate of
        KL(pi_rollout || pi_trainer)).
    """
    if trainer_logp.shape != rollout_logp.shape or trainer_logp.shape != loss_mask.shape:
        raise ValueError(
            f"truncated_is_weights: trainer_logp {tuple(trainer_logp.shape)}, rollout_logp "
            f"{tuple(rollout_logp.shape)} and loss_mask {tuple(loss_mask.shape)} must match"
        )
    if cap < 1:
        raise ValueError(f"truncated_is_weights: cap={cap} must be >= 1 (a ratio of 1 stays 1)")
    with torch.no_grad():
        valid = loss_mask.bool()
        zeros = torch.zeros_like(trainer_logp, dtype=torch.float32)
        # select before arithmetic: garbage at masked positions never reaches exp()
        log_ratio = torch.where(valid, trainer_logp.float() - rollout_logp.float(), zeros)  # [B, L]
        ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # [B, L]
        weights = torch.where(valid, ratio.clamp(max=cap), zeros)  # [B, L]
        stats = {
            "weight_mean": masked_mean(weights, loss_mask),
            "truncated_frac": masked_mean((ratio > cap).float(), loss_mask),
            "mismatch_k1": masked_mean(-log_ratio, loss_mask),
        }
    return weights, stats
