"""Loss terms of the policy update: clipped surrogate, KL to a reference, entropy, value loss.

Every loss takes per-token tensors `[B, L]` with a loss mask (1 at tokens the policy generated,
0 at padding and retrieved `<information>` tokens) and returns `(scalar loss, stats)`, stats
detached 0-d tensors. Masked positions are selected away with `torch.where`, so NaN or inf there
cannot reach the loss or the gradient. Log-ratios are clamped to [-20, 20] before `exp`. KL
estimators and aggregation modes keep verl's definitions and names; departures:
docs/protocols.md.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd.function import FunctionCtx, once_differentiable

from simsearch.policy.masked import Stats, masked_mean, masked_sum

LossAggregation = str
"""A name in `LOSS_AGGREGATIONS`."""
KLEstimator = str
"""A name in `KL_ESTIMATORS`."""

LOG_RATIO_CLAMP = 20.0  # verl: clamp log-ratios before exp
K3_CLAMP = 10.0  # verl: clamp the low_var_kl estimate
DEFAULT_CHUNK_SIZE = 256  # positions per chunk in token_logprobs / entropy_from_logits


# ---------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------


def aggregate_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: LossAggregation,
    denominator: float | torch.Tensor | None = None,
    token_sum_normalizer: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.

    Modes (n_b = valid tokens of row b, S = rows with at least one valid token):
      - "token-mean": sum of every valid token's loss / number of valid tokens (every token
        weighs the same; DAPO).
      - "seq-mean-token-mean": mean over rows of each row's token mean (GRPO paper; long
        responses get less weight per token).
      - "seq-mean-token-sum": mean over rows of each row's token sum.
      - "seq-mean-token-sum-norm": mean over rows of (token sum / token_sum_normalizer), a
        constant such as the maximum response length (Dr.GRPO: no length normalization).

    Args:
        loss_mat: `[B, L]` per-token loss.
        loss_mask: `[B, L]` 1 at tokens that count.
        mode: a name in `LOSS_AGGREGATIONS` (the modes above).
        denominator: the count the mode divides by (tokens or sequences) of the whole optimizer
            batch, so micro-batch losses sum to the batch loss; None counts them in `loss_mask`.
        token_sum_normalizer: the constant of "seq-mean-token-sum-norm" (that mode only).

    Returns:
        Scalar loss.
    """
    check_same_shape(loss_mat, loss_mask, "loss_mat", "loss_mask", "aggregate_loss")
    if loss_mat.dim() != 2:
        raise ValueError(f"aggregate_loss: loss_mat must be [B, L], got {tuple(loss_mat.shape)}")
    if (mode == "seq-mean-token-sum-norm") != (token_sum_normalizer is not None):
        raise ValueError(
            "aggregate_loss: token_sum_normalizer is required by mode 'seq-mean-token-sum-norm' "
            f"(pass a constant such as the maximum response length) and only by it; got mode "
            f"{mode!r} with token_sum_normalizer={token_sum_normalizer}"
        )
    if mode not in LOSS_AGGREGATIONS:
        choices = ", ".join(repr(name) for name in LOSS_AGGREGATIONS)
        raise ValueError(f"aggregate_loss: unknown mode {mode!r}; use one of {choices}")
    return LOSS_AGGREGATIONS[mode](loss_mat, loss_mask, denominator, token_sum_normalizer)


Denominator = float | torch.Tensor | None


def _token_mean(
    loss_mat: torch.Tensor, loss_mask: torch.Tensor, denominator: Denominator, _: float | None
) -> torch.Tensor:
    if denominator is None:
        return masked_mean(loss_mat, loss_mask)
    return masked_sum(loss_mat, loss_mask) / denominator


def _mean_over_rows(per_row: torch.Tensor, loss_mask: torch.Tensor, denominator: Denominator) -> torch.Tensor:
    has_tokens = loss_mask.bool().any(dim=-1)  # [B] rows without a valid token are no sequence
    if denominator is None:
        return masked_mean(per_row, has_tokens)
    return masked_sum(per_row, has_tokens) / denominator


def _seq_mean_token_mean(
    loss_mat: torch.Tensor, loss_mask: torch.Tensor, denominator: Denominator, _: float | None
) -> torch.Tensor:
    return _mean_over_rows(masked_mean(loss_mat, loss_mask, dim=-1), loss_mask, denominator)


def _seq_mean_token_sum(
    loss_mat: torch.Tensor, loss_mask: torch.Tensor, denominator: Denominator, _: float | None
) -> torch.Tensor:
    return _mean_over_rows(masked_sum(loss_mat, loss_mask, dim=-1), loss_mask, denominator)


def _seq_mean_token_sum_norm(
    loss_mat: torch.Tensor, loss_mask: torch.Tensor, denominator: Denominator, normalizer: float | None
) -> torch.Tensor:
    assert normalizer is not None  # aggregate_loss requires it for this mode
    return _mean_over_rows(masked_sum(loss_mat, loss_mask, dim=-1) / normalizer, loss_mask, denominator)


LOSS_AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, Denominator, float | None], torch.Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}
"""Every loss aggregation by its recipe name (`algorithm.loss_agg`); `aggregate_loss` documents them."""


# ---------------------------------------------------------------------------------------------
# Importance ratios
# ---------------------------------------------------------------------------------------------


def _token_log_ratio(token_log_ratio: torch.Tensor, logp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return token_log_ratio


def _sequence_log_ratio(token_log_ratio: torch.Tensor, logp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    # log s_i = mean over the row's valid tokens of log(pi / pi_old); a row without one gets 0
    seq = masked_mean(token_log_ratio, valid, dim=-1).detach()  # [B]
    # value log s_i at every token, gradient that of log pi(y_t): s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)]
    return torch.where(valid, logp - logp.detach() + seq.unsqueeze(-1), torch.zeros_like(logp))  # [B, L]


RATIO_LEVELS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token": _token_log_ratio,
    "sequence": _sequence_log_ratio,
}
"""The importance ratio the surrogate clips, by its recipe name (`algorithm.ratio_level`): "token" is
PPO's / GRPO's per-token ratio, "sequence" GSPO's length-normalized sequence ratio (`policy_loss`).
Each maps (token log-ratio `[B, L]`, 0 where masked; logp `[B, L]`; valid `[B, L]` bool) to the
log-ratio `[B, L]` the surrogate uses."""


# ---------------------------------------------------------------------------------------------
# Loss terms
# ---------------------------------------------------------------------------------------------


def _k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return logp - ref_logp


def _k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logp - ref_logp).square()


def _k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    log_ratio = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-K3_CLAMP, K3_CLAMP)


def _abs(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return (logp - ref_logp).abs()


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": _k1,
    "k2": _k2,
    "k3": _k3,
    "abs": _abs,
}
"""Per-token KL estimators by name (`kl_penalty`); `algorithm.kl_estimator` takes these names."""


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from the sampled tokens' log-probs.

    With d = logp - ref_logp (Schulman's k1, k2, k3; verl's `kl_penalty` names in brackets):
    - "k1" ("kl"): d (unbiased, high variance, can be negative per token).
    - "k2" ("mse"): d^2 / 2 (biased, >= 0; its gradient is that of the true KL's).
    - "k3" ("low_var_kl"): exp(-d) + d - 1 (unbiased, >= 0); -d clamped to [-20, 20], the result
      to [-10, 10], as verl does.
    - "abs": |d| (>= 0).

    Args:
        logp: `[B, L]` log-probs under the policy.
        ref_logp: `[B, L]` log-probs under the frozen reference (no grad is taken through it).
        estimator: A name of `KL_ESTIMATORS`.

    Returns:
        `[B, L]` per-token KL estimates (garbage wherever the inputs are; mask them).
    """
    check_same_shape(logp, ref_logp, "logp", "ref_logp", "kl_penalty")
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_penalty: unknown estimator {estimator!r}; use one of {', '.join(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[estimator](logp, ref_logp.detach())


def kl_loss(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    loss_mask: torch.Tensor,
    estimator: KLEstimator = "k3",
    aggregation: LossAggregation = "token-mean",
    denominator: float | torch.Tensor | None = None,
    token_sum_normalizer: float | None = None,
) -> tuple[torch.Tensor, Stats]:
    """KL to the frozen reference as a loss term (added with +kl_coef by `policy.actor_loss.actor_micro_loss`).

    Args:
        logp: `[B, L]` log-probs under the policy (with grad).
        ref_logp: `[B, L]` log-probs under the reference.
        loss_mask: `[B, L]` 1 at tokens trained on.
        estimator: A name of `KL_ESTIMATORS`; "k3" is the published systems' `low_var_kl`.
        aggregation, denominator, token_sum_normalizer: see `aggregate_loss`.

    Returns:
        The aggregated KL and stats `kl` (the same value, detached).
    """
    check_same_shape(logp, loss_mask, "logp", "loss_mask", "kl_loss")
    valid = loss_mask.bool()
    # select first so a NaN/inf log-prob at a masked position cannot poison the gradient
    logp = torch.where(valid, logp, torch.zeros_like(logp))
    ref_logp = torch.where(valid, ref_logp, torch.zeros_like(ref_logp))
    per_token = kl_penalty(logp, ref_logp, estimator)  # [B, L]
    loss = aggregate_loss(per_token, loss_mask, aggregation, denominator, token_sum_normalizer)
    return loss, {"kl": loss.detach()}


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_range: float = 0.2,
    aggregation: LossAggregation = "token-mean",
    denominator: float | torch.Tensor | None = None,
    token_sum_normalizer: float | None = None,
) -> tuple[torch.Tensor, Stats]:
    """PPO clipped value loss: 0.5 * max((V - R)^2, (V_clip - R)^2).

    V_clip = old_V + clip(V - old_V, -clip_range, clip_range): the critic may not move further
    than clip_range from the values it predicted at rollout time and still lower the loss.

    Args:
        values: `[B, L]` current critic values (with grad).
        old_values: `[B, L]` critic values at rollout time.
        returns: `[B, L]` regression targets (`advantages.gae_advantages`' returns).
        loss_mask: `[B, L]` 1 at tokens trained on.
        clip_range: maximum move of the value per update before clipping applies (>= 0).
        aggregation, denominator, token_sum_normalizer: see `aggregate_loss`.

    Returns:
        The loss and stats `vf_clipfrac` (fraction of valid tokens where the clipped error is
        the larger) and `values_mean`.
    """
    check_same_shape(values, old_values, "values", "old_values", "value_loss")
    check_same_shape(values, returns, "values", "returns", "value_loss")
    check_same_shape(values, loss_mask, "values", "loss_mask", "value_loss")
    if clip_range < 0:
        raise ValueError(f"value_loss: clip_range must be >= 0, got {clip_range}")
    valid = loss_mask.bool()
    zeros = torch.zeros_like(values)
    values = torch.where(valid, values, zeros)
    old_values = torch.where(valid, old_values.detach(), zeros)
    returns = torch.where(valid, returns.detach(), zeros)
    clipped_values = old_values + (values - old_values).clamp(-clip_range, clip_range)
    error = (values - returns) ** 2  # [B, L]
    clipped_error = (clipped_values - returns) ** 2  # [B, L]
    per_token = 0.5 * torch.maximum(error, clipped_error)
    loss = aggregate_loss(per_token, loss_mask, aggregation, denominator, token_sum_normalizer)
    with torch.no_grad():
        stats = {
            "vf_clipfrac": masked_mean((clipped_error > error).to(values.dtype), loss_mask),
            "values_mean": masked_mean(values.detach(), loss_mask),
        }
    return loss, stats


# ---------------------------------------------------------------------------------------------
# Log-probs and entropy from logits
# ---------------------------------------------------------------------------------------------


def token_logprobs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
) -> torch.Tensor:
    """log softmax(logits / temperature)[label] for every position, without a `[B, L, V]` float copy.

    Computed as z[label] - logsumexp(z), z = logits / temperature, in float32 (float64 for
    float64 logits), over `chunk_size` positions at a time; backward recomputes the softmax chunk
    by chunk from the saved logits. For logits of a causal LM, pass `logits[:, :-1]` and
    `input_ids[:, 1:]`. Pass the rollout's temperature (top-p is not applied).

    Args:
        logits: `[B, L, V]` (any float dtype; a non-contiguous slice is fine, it is not copied).
        labels: `[B, L]` token ids in [0, V); mask positions you do not want with the loss mask,
            not with -100.
        chunk_size: positions per chunk (bounds the float32 workspace to chunk_size x V).
        temperature: > 0; 1 gives the model's raw distribution.

    Returns:
        `[B, L]` log-probs, float32 (float64 for float64 logits).
    """
    _check_logits(logits, "token_logprobs", chunk_size, temperature)
    if labels.shape != logits.shape[:2] or labels.dtype != torch.long:
        raise ValueError(
            f"token_logprobs: labels must be a long tensor of shape {tuple(logits.shape[:2])}, "
            f"got {labels.dtype} {tuple(labels.shape)}"
        )
    vocab = logits.shape[-1]
    if labels.numel() > 0 and (int(labels.min()) < 0 or int(labels.max()) >= vocab):
        raise ValueError(
            f"token_logprobs: labels must lie in [0, {vocab}), got range "
            f"[{int(labels.min())}, {int(labels.max())}]; replace ignore-index values (-100) by "
            "any valid id and exclude those positions with the loss mask"
        )
    return _TokenLogProbs.apply(logits, labels, chunk_size, temperature)


def entropy_from_logits(
    logits: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE, temperature: float = 1.0
) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) at every position, chunked like `token_logprobs`.

    Args:
        logits: `[B, L, V]`.
        chunk_size: positions per chunk.
        temperature: > 0, the sampling temperature (see `token_logprobs`).

    Returns:
        `[B, L]` entropies in nats, float32 (float64 for float64 logits).
    """
    _check_logits(logits, "entropy_from_logits", chunk_size, temperature)
    return _Entropy.apply(logits, chunk_size, temperature)


class _TokenLogProbs(torch.autograd.Function):
    """With z = logits / T: logp = z[label] - lse(z); d logp / d logits = (onehot(label) - softmax(z)) / T."""

    @staticmethod
    def forward(
        ctx: FunctionCtx, logits: torch.Tensor, labels: torch.Tensor, chunk_size: int, temperature: float
    ) -> torch.Tensor:
        dtype = _accumulate_dtype(logits)
        lse = torch.empty(logits.shape[:2], dtype=dtype, device=logits.device)  # [B, L]
        for rows, cols in _chunks(logits, chunk_size):
            lse[rows, cols] = torch.logsumexp(logits[rows, cols].to(dtype) / temperature, dim=-1)
        picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1).to(dtype) / temperature  # [B, L]
        ctx.save_for_backward(logits, labels, lse)
        ctx.chunk_size = chunk_size  # type: ignore[attr-defined]
        ctx.temperature = temperature  # type: ignore[attr-defined]
        return picked - lse

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        logits, labels, lse = ctx.saved_tensors  # type: ignore[attr-defined]
        temperature = ctx.temperature  # type: ignore[attr-defined]
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # [B, L, V]
        for rows, cols in _chunks(logits, ctx.chunk_size):  # type: ignore[attr-defined]
            g = grad_out[rows, cols].unsqueeze(-1) / temperature  # [r, c, 1]
            z = logits[rows, cols].to(lse.dtype) / temperature  # [r, c, V]
            probs = torch.exp(z - lse[rows, cols].unsqueeze(-1))
            chunk = -g * probs
            chunk.scatter_add_(-1, labels[rows, cols].unsqueeze(-1), g)
            grad[rows, cols] = chunk
        return grad, None, None, None


class _Entropy(torch.autograd.Function):
    """With z = logits / T: H = lse(z) - sum p z; dH/d logits_j = -p_j * (log p_j + H) / T."""

    @staticmethod
    def forward(ctx: FunctionCtx, logits: torch.Tensor, chunk_size: int, temperature: float) -> torch.Tensor:
        dtype = _accumulate_dtype(logits)
        lse = torch.empty(logits.shape[:2], dtype=dtype, device=logits.device)  # [B, L]
        entropy = torch.empty_like(lse)  # [B, L]
        for rows, cols in _chunks(logits, chunk_size):
            z = logits[rows, cols].to(dtype) / temperature  # [r, c, V]
            chunk_lse = torch.logsumexp(z, dim=-1)  # [r, c]
            probs = torch.exp(z - chunk_lse.unsqueeze(-1))
            lse[rows, cols] = chunk_lse
            entropy[rows, cols] = chunk_lse - torch.einsum("rcv,rcv->rc", probs, z)
        ctx.save_for_backward(logits, lse, entropy)
        ctx.chunk_size = chunk_size  # type: ignore[attr-defined]
        ctx.temperature = temperature  # type: ignore[attr-defined]
        return entropy

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, lse, entropy = ctx.saved_tensors  # type: ignore[attr-defined]
        temperature = ctx.temperature  # type: ignore[attr-defined]
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # [B, L, V]
        for rows, cols in _chunks(logits, ctx.chunk_size):  # type: ignore[attr-defined]
            z = logits[rows, cols].to(lse.dtype) / temperature  # [r, c, V]
            log_probs = z - lse[rows, cols].unsqueeze(-1)
            scale = -grad_out[rows, cols].unsqueeze(-1) / temperature  # [r, c, 1]
            spread = log_probs + entropy[rows, cols].unsqueeze(-1)
            grad[rows, cols] = scale * torch.exp(log_probs) * spread
        return grad, None, None


def _chunks(logits: torch.Tensor, chunk_size: int) -> list[tuple[slice, slice]]:
    """(rows, positions) slices covering `[B, L]` with at most `chunk_size` positions each.

    Whole rows are grouped when a row is shorter than `chunk_size`, long rows are split; either
    way `logits[rows, positions]` is a view, never a copy.
    """
    batch, length = logits.shape[:2]
    if length == 0:
        return []
    if length <= chunk_size:
        step = chunk_size // length
        return [(slice(b, min(b + step, batch)), slice(0, length)) for b in range(0, batch, step)]
    return [
        (slice(b, b + 1), slice(s, min(s + chunk_size, length)))
        for b in range(batch)
        for s in range(0, length, chunk_size)
    ]


def _accumulate_dtype(logits: torch.Tensor) -> torch.dtype:
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def _check_logits(logits: torch.Tensor, fn: str, chunk_size: int, temperature: float) -> None:
    if logits.dim() != 3 or not logits.is_floating_point():
        raise ValueError(f"{fn}: logits must be a float tensor [B, L, V], got {logits.dtype} {tuple(logits.shape)}")
    if chunk_size < 1:
        raise ValueError(f"{fn}: chunk_size must be >= 1, got {chunk_size}")
    if not temperature > 0:  # `not >` also refuses NaN
        raise ValueError(f"{fn}: temperature must be > 0 (0 is greedy: no distribution), got {temperature}")


def check_same_shape(a: torch.Tensor, b: torch.Tensor, name_a: str, name_b: str, fn: str) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{fn}: {name_a} and {name_b} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}"
        )
