"""Loss terms against hand-computed tensors.

Each numeric test derives its expected values in a comment and also asserts that a common
mistake (symmetric clip, un-masked mean, inverted KL sign, missing 0.5, ...) would not pass.
"""

import math

import pytest
import torch

from simsearch.errors import RecipeError
from simsearch.policy.actor_loss import policy_loss
from simsearch.policy.losses import (
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    aggregate_loss,
    entropy_from_logits,
    kl_loss,
    kl_penalty,
    token_logprobs,
    value_loss,
)
from simsearch.policy.recipe import AlgorithmConfig

TOL = dict(rtol=0.0, atol=1e-6)
LN2 = math.log(2.0)
NAN, INF = float("nan"), float("inf")


def close(actual: torch.Tensor, expected: float | list) -> bool:
    return torch.allclose(actual, torch.tensor(expected, dtype=actual.dtype), **TOL)


# --- aggregation ---------------------------------------------------------------------------------

# row 0 valid 1, 2; row 1 valid 4; row 2 has no valid token
AGG_LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=torch.float64)
AGG_MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "normalizer", "expected", "mistake"),
    [
        # (1 + 2 + 4) / 3 valid tokens; the un-masked mean of all 9 values would be 5
        ("token-mean", None, 7 / 3, 5.0),
        # row means 1.5 and 4 over the 2 rows with tokens; counting the empty row: 5.5 / 3
        ("seq-mean-token-mean", None, 2.75, 5.5 / 3),
        # row sums 3 and 4 -> 3.5; the token mean 7/3 would be the mistake
        ("seq-mean-token-sum", None, 3.5, 7 / 3),
        # (3/4 + 4/4) / 2 = 0.875; verl's sum over rows / 4 gives 1.75
        ("seq-mean-token-sum-norm", 4.0, 0.875, 1.75),
    ],
)
def test_aggregate_loss_modes(mode, normalizer, expected, mistake):
    out = aggregate_loss(AGG_LOSS, AGG_MASK, mode, token_sum_normalizer=normalizer)
    assert close(out, expected)
    assert not close(out, mistake)


def test_aggregate_loss_global_denominator_makes_micro_batches_add_up():
    full = aggregate_loss(AGG_LOSS, AGG_MASK, "token-mean")
    # split into micro-batches rows [0] and [1, 2]; the batch has 3 valid tokens
    parts = [
        aggregate_loss(AGG_LOSS[rows], AGG_MASK[rows], "token-mean", denominator=3)
        for rows in (slice(0, 1), slice(1, 3))
    ]
    # 3/3 + 4/3 = 7/3, the full-batch token mean; per-micro-batch means would give 1.5 + 4
    assert close(parts[0] + parts[1], full.item())
    seq = aggregate_loss(AGG_LOSS, AGG_MASK, "seq-mean-token-sum", denominator=4)
    assert close(seq, 7 / 4)  # (3 + 4) / 4


def test_aggregate_loss_rejects_bad_modes_and_missing_normalizer():
    with pytest.raises(ValueError, match="token_sum_normalizer is required"):
        aggregate_loss(AGG_LOSS, AGG_MASK, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="token_sum_normalizer is required"):
        aggregate_loss(AGG_LOSS, AGG_MASK, "token-mean", token_sum_normalizer=4.0)
    with pytest.raises(ValueError, match="unknown mode"):
        aggregate_loss(AGG_LOSS, AGG_MASK, "sum")  # type: ignore[arg-type]


# --- policy loss ---------------------------------------------------------------------------------

# ratios: row 0 = 1.5, 0.5, 1.0; row 1 = 0.7 then two masked positions full of garbage
OLD = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]], dtype=torch.float64)
RATIO_LOG = torch.tensor([[math.log(1.5), math.log(0.5), 0.0], [math.log(0.7), NAN, INF]])
ADV = torch.tensor([[1.0, 1.0, -2.0], [-1.0, 5.0, NAN]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def _logp() -> torch.Tensor:
    return (OLD + RATIO_LOG.to(torch.float64)).requires_grad_(True)


@pytest.mark.parametrize(
    ("mode", "normalizer", "expected"),
    [
        # per token with clip [0.8, 1.28]: max(-A r, -A clip(r))
        #   r=1.5, A=1:  max(-1.5, -1.28) = -1.28 (clipped)
        #   r=0.5, A=1:  max(-0.5, -0.8)  = -0.5
        #   r=1.0, A=-2: max(2, 2)        =  2
        #   r=0.7, A=-1: max(0.7, 0.8)    =  0.8 (clipped)
        # token-mean (-1.28 - 0.5 + 2 + 0.8) / 4 = 1.02 / 4
        ("token-mean", None, 0.255),
        # row 0 mean 0.22 / 3, row 1 mean 0.8 -> (0.073333 + 0.8) / 2
        ("seq-mean-token-mean", None, (0.22 / 3 + 0.8) / 2),
        # (0.22 + 0.8) / 2
        ("seq-mean-token-sum", None, 0.51),
        # (0.22 / 10 + 0.8 / 10) / 2
        ("seq-mean-token-sum-norm", 10.0, 0.051),
    ],
)
def test_policy_loss_asymmetric_clip(mode, normalizer, expected):
    loss, _ = policy_loss(
        _logp(),
        OLD,
        ADV,
        MASK,
        AlgorithmConfig(clip_low=0.2, clip_high=0.28, loss_agg=mode),
        token_sum_normalizer=normalizer,
    )
    assert close(loss.detach(), expected)


def test_policy_loss_stats_and_symmetric_clip_mistake():
    loss, stats = policy_loss(_logp(), OLD, ADV, MASK, AlgorithmConfig(clip_low=0.2, clip_high=0.28))
    # clipped term active at 2 of 4 valid tokens (r=1.5 with A>0, r=0.7 with A<0)
    assert close(stats["clipfrac"], 0.5)
    # approx_kl = mean(old - new) = -(ln 1.5 + ln 0.5 + 0 + ln 0.7) / 4 = -ln(0.525) / 4
    assert close(stats["approx_kl"], -math.log(0.525) / 4)
    # ratios 1.5, 0.5, 1.0, 0.7: mean 3.7 / 4
    assert close(stats["ratio_mean"], 0.925)
    assert close(stats["ratio_min"], 0.5) and close(stats["ratio_max"], 1.5)
    assert all(not v.requires_grad for v in stats.values())
    # a symmetric 0.2 clip would cap r=1.5 at 1.2: (-1.2 - 0.5 + 2 + 0.8) / 4 = 0.275
    symmetric, _ = policy_loss(_logp(), OLD, ADV, MASK, AlgorithmConfig(clip_low=0.2, clip_high=0.2))
    assert close(symmetric.detach(), 0.275) and not close(loss.detach(), 0.275)


def test_policy_loss_gradient_is_exactly_zero_at_masked_tokens():
    logp = _logp()
    loss, _ = policy_loss(logp, OLD, ADV, MASK, AlgorithmConfig(clip_low=0.2, clip_high=0.28))
    loss.backward()
    # token-mean over 4 tokens; d(-A r)/d logp = -A r where the unclipped term is active:
    #   r=0.5, A=1  -> -0.5 / 4 = -0.125;  r=1, A=-2 -> 2 / 4 = 0.5
    #   the clipped tokens (r=1.5 with A>0, r=0.7 with A<0) and the masked ones get 0
    assert torch.isfinite(logp.grad).all()
    assert torch.equal(logp.grad[1, 1:], torch.zeros(2, dtype=torch.float64))
    assert close(logp.grad, [[0.0, -0.125, 0.5], [0.0, 0.0, 0.0]])


def test_dual_clip_caps_the_loss_of_negative_advantages_with_runaway_ratios():
    # clip 0.2 and dual clip c = 3, per token max(-A r, -A clip(r, 0.8, 1.2)), then for A < 0
    # min(that, -A c):
    #   r=5,   A=-1: max(5, 1.2) = 5 -> min(5, 3) = 3 (dual-clipped, constant: gradient 0)
    #   r=2,   A=-1: max(2, 1.2) = 2 -> min(2, 3) = 2 (ratio below c: unchanged, gradient -A r = 2)
    #   r=5,   A=+1: max(-5, -1.2) = -1.2 (clipped; the dual clip applies to A < 0 only)
    #   r=0.5, A=-2: max(1, 1.6) = 1.6 (clipped) -> min(1.6, 6) = 1.6
    logp = torch.tensor([[math.log(5.0), math.log(2.0), math.log(5.0), math.log(0.5)]], dtype=torch.float64)
    logp.requires_grad_(True)
    old = torch.zeros(1, 4, dtype=torch.float64)
    adv = torch.tensor([[-1.0, -1.0, 1.0, -2.0]], dtype=torch.float64)
    mask = torch.ones(1, 4)
    loss, stats = policy_loss(logp, old, adv, mask, AlgorithmConfig(clip_ratio_c=3.0))
    # token-mean (3 + 2 - 1.2 + 1.6) / 4 = 5.4 / 4
    assert close(loss.detach(), 1.35)
    assert close(stats["clipfrac_lower"], 0.25) and close(stats["clipfrac"], 0.5)
    plain, plain_stats = policy_loss(logp.detach(), old, adv, mask, AlgorithmConfig())
    assert close(plain.detach(), (5 + 2 - 1.2 + 1.6) / 4) and close(plain_stats["clipfrac_lower"], 0.0)
    loss.backward()
    # d(-A r)/d logp = -A r, only where unclipped: token 1: 2 / 4 = 0.5; the rest are constants
    assert close(logp.grad, [[0.0, 0.5, 0.0, 0.0]])
    for bad in (1.0, 0.5, -3.0, NAN):
        with pytest.raises(ValueError, match=r"clip_ratio_c must be 0 .no dual clip. or > 1"):
            policy_loss(logp, old, adv, mask, AlgorithmConfig(clip_ratio_c=bad))


def test_policy_loss_rejects_shape_mismatch():
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(_logp(), OLD, ADV[:, :2], MASK, AlgorithmConfig())


# --- KL ------------------------------------------------------------------------------------------

KL_LOGP = torch.tensor([[math.log(0.5), math.log(0.25), 3.0]], dtype=torch.float64)
KL_REF = torch.tensor([[math.log(0.25), math.log(0.5), NAN]], dtype=torch.float64)
KL_MASK = torch.tensor([[1, 1, 0]])


def test_kl_estimators_by_hand():
    k1 = kl_penalty(KL_LOGP[:, :2], KL_REF[:, :2], "k1")
    # logp - ref: ln 0.5 - ln 0.25 = ln 2; ln 0.25 - ln 0.5 = -ln 2
    assert close(k1, [[LN2, -LN2]])
    k3 = kl_penalty(KL_LOGP[:, :2], KL_REF[:, :2], "k3")
    # x = ref - logp: x = -ln 2 -> e^x - x - 1 = 0.5 + ln 2 - 1 = 0.193147
    #                 x =  ln 2 -> 2 - ln 2 - 1 = 0.306853
    assert close(k3, [[0.5 + LN2 - 1, 1 - LN2]])
    # swapping policy and reference (a sign mistake in x) would give 0.306853, 0.193147
    assert not close(k3, [[1 - LN2, 0.5 + LN2 - 1]])
    k2 = kl_penalty(KL_LOGP[:, :2], KL_REF[:, :2], "k2")
    # (logp - ref)^2 / 2 = (ln 2)^2 / 2 at both tokens; without the 1/2 it would be (ln 2)^2
    assert close(k2, [[LN2**2 / 2, LN2**2 / 2]]) and not close(k2, [[LN2**2, LN2**2]])
    assert close(kl_penalty(KL_LOGP[:, :2], KL_REF[:, :2], "abs"), [[LN2, LN2]])  # |k1|
    with pytest.raises(ValueError, match="unknown estimator 'mse'; use one of k1, k2, k3, abs"):
        kl_penalty(KL_LOGP, KL_REF, "mse")  # type: ignore[arg-type]


def test_k2_and_abs_gradients_by_hand():
    logp = KL_LOGP[:, :2].clone().requires_grad_(True)
    kl_penalty(logp, KL_REF[:, :2], "k2").sum().backward()
    # d/dlogp (logp - ref)^2 / 2 = logp - ref = ln 2, -ln 2
    assert close(logp.grad, [[LN2, -LN2]])
    logp.grad = None
    kl_penalty(logp, KL_REF[:, :2], "abs").sum().backward()
    assert close(logp.grad, [[1.0, -1.0]])  # sign(logp - ref)


def test_the_recipe_accepts_exactly_the_kl_estimators():
    for name in KL_ESTIMATORS:
        AlgorithmConfig(kl_estimator=name).check("algorithm")
    with pytest.raises(RecipeError) as error:
        AlgorithmConfig(kl_estimator="mse").check("algorithm")
    assert str(error.value) == f"algorithm.kl_estimator='mse' is not one of {', '.join(KL_ESTIMATORS)}"
    for bad in (1.0, 0.9, NAN):
        with pytest.raises(RecipeError, match=r"algorithm.clip_ratio_c=.* must be 0 \(no dual clip\) or > 1"):
            AlgorithmConfig(clip_ratio_c=bad).check("algorithm")
    AlgorithmConfig(clip_ratio_c=3.0).check("algorithm")


def test_k3_clamps_like_verl():
    logp = torch.zeros(1, 2, dtype=torch.float64)
    ref = torch.tensor([[50.0, -50.0]], dtype=torch.float64)
    # x = 50 -> clamp 20 -> e^20 - 21 -> clamp 10;  x = -50 -> clamp -20 -> e^-20 + 19 -> clamp 10
    assert close(kl_penalty(logp, ref, "k3"), [[10.0, 10.0]])


def test_kl_loss_masks_garbage():
    loss, stats = kl_loss(KL_LOGP, KL_REF, KL_MASK, estimator="k3")
    # (0.5 + ln 2 - 1 + 2 - ln 2 - 1) / 2 = 0.5 / 2 = 0.25; the NaN position is masked
    assert close(loss, 0.25) and close(stats["kl"], 0.25)


def test_positive_kl_coef_pulls_logp_toward_reference():
    ref = torch.tensor([[math.log(0.25), math.log(0.4)]], dtype=torch.float64)
    start = torch.tensor([[math.log(0.5), math.log(0.1)]], dtype=torch.float64)
    mask = torch.ones(1, 2)

    def step(sign: float) -> torch.Tensor:
        logp = start.clone().requires_grad_(True)
        kl, _ = kl_loss(logp, ref, mask, estimator="k3")
        policy = (logp * 0.0).sum()
        loss = policy + sign * 0.1 * kl  # -1: ZeroSearch's inverted sign
        loss.backward()
        if sign > 0:
            # d k3 / d logp = 1 - e^(ref - logp): 1 - 0.5 = 0.5 and 1 - 4 = -3;
            # times 0.1 (coef) / 2 (token mean) -> 0.025, -0.15
            assert close(logp.grad, [[0.025, -0.15]])
        with torch.no_grad():
            return logp - 1.0 * logp.grad  # one SGD step, lr 1

    before = (start - ref).abs()
    assert ((step(+1.0) - ref).abs() < before).all()
    assert ((step(-1.0) - ref).abs() > before).all()


# --- entropy ------------------------------------------------------------------------------------


def test_masked_mean_entropy_by_hand():
    uniform = torch.zeros(4, dtype=torch.float64)  # H = ln 4 = 2 ln 2
    # p = 1/2, 1/4, 1/8, 1/8: H = 0.5 ln 2 + 0.25 ln 4 + 2 * 0.125 ln 8 = 1.75 ln 2
    skewed = torch.tensor([0.5, 0.25, 0.125, 0.125], dtype=torch.float64).log()
    garbage = torch.tensor([1e4, -1e4, 0.0, 3.0], dtype=torch.float64)  # masked, H ~ 0
    logits = torch.stack([uniform, skewed, garbage]).unsqueeze(0).requires_grad_(True)
    mask = torch.tensor([[1, 1, 0]])
    assert close(entropy_from_logits(logits)[0, :2].detach(), [2 * LN2, 1.75 * LN2])
    bonus = aggregate_loss(entropy_from_logits(logits), mask, "token-mean")
    # masked mean (2 + 1.75) / 2 ln 2 = 1.875 ln 2; the un-masked mean would be 3.75 ln 2 / 3
    assert close(bonus.detach(), 1.875 * LN2)
    assert not close(bonus.detach(), 1.25 * LN2)
    bonus.backward()
    # uniform is the maximum of entropy (zero gradient); the masked row gets exactly zero
    assert close(logits.grad[0, 0], [0.0] * 4)
    assert torch.equal(logits.grad[0, 2], torch.zeros(4, dtype=torch.float64))


# --- value loss ----------------------------------------------------------------------------------


def test_value_loss_clipped_by_hand():
    values = torch.tensor([[0.625, 2.0, 7.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[0.5, 1.0, 0.0]], dtype=torch.float64)
    returns = torch.tensor([[2.0, 3.0, NAN]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]])
    loss, stats = value_loss(values, old, returns, mask, clip_range=0.2)
    # t0: V moved 0.125 < 0.2, V_clip = V: (0.625 - 2)^2 = 1.890625 both ways
    # t1: V_clip = 1.0 + 0.2 = 1.2: (2 - 3)^2 = 1 vs (1.2 - 3)^2 = 3.24 -> 3.24 (clipped)
    # 0.5 * (1.890625 + 3.24) / 2 = 1.28265625
    assert close(loss.detach(), 1.28265625)
    assert not close(loss.detach(), 0.5 * (1.890625 + 1.0) / 2)  # unclipped only
    assert not close(loss.detach(), (1.890625 + 3.24) / 2)  # without the 0.5
    assert close(stats["vf_clipfrac"], 0.5) and close(stats["values_mean"], 1.3125)
    loss.backward()
    # t0: d/dV 0.5 (V - R)^2 / 2 = (0.625 - 2) / 2 = -0.6875; t1 clipped (constant) -> 0
    assert close(values.grad, [[-0.6875, 0.0, 0.0]])


# --- token log-probs and entropy from logits -----------------------------------------------------


def test_token_logprobs_by_hand_and_shift_invariant():
    # logits (0, ln 3): p = 1/4, 3/4
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]], dtype=torch.float64)
    labels = torch.tensor([[1, 0]])
    assert close(token_logprobs(logits, labels), [[math.log(0.75), math.log(0.25)]])
    assert close(token_logprobs(logits + 100.0, labels), [[math.log(0.75), math.log(0.25)]])
    # the raw logit (no normalization) would be the mistake
    assert not close(token_logprobs(logits, labels), [[math.log(3.0), 0.0]])


@pytest.mark.parametrize("chunk_size", [2, 5, 64])
def test_token_logprobs_and_entropy_match_reference_and_gradcheck(chunk_size):
    generator = torch.Generator().manual_seed(0)
    full = torch.randn(3, 6, 7, dtype=torch.float64, generator=generator)
    logits = full[:, :-1].clone().requires_grad_(True)  # [3, 5, 7]
    labels = torch.randint(0, 7, (3, 5), generator=generator)
    log_probs = torch.log_softmax(logits, dim=-1)
    expected_logp = log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    expected_entropy = -(log_probs.exp() * log_probs).sum(-1)
    assert torch.allclose(token_logprobs(logits, labels, chunk_size), expected_logp, **TOL)
    assert torch.allclose(entropy_from_logits(logits, chunk_size), expected_entropy, **TOL)
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, labels, chunk_size), (logits,))
    assert torch.autograd.gradcheck(lambda x: entropy_from_logits(x, chunk_size), (logits,))


def test_token_logprobs_and_entropy_at_a_sampling_temperature_by_hand():
    # logits (0, ln 9) at T = 2 are (0, ln 3): p = 1/4, 3/4 (at T = 1 they would be 1/10, 9/10)
    logits = torch.tensor([[[0.0, math.log(9.0)], [0.0, math.log(9.0)]]], dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[1, 0]])
    logp = token_logprobs(logits, labels, temperature=2.0)
    assert close(logp.detach(), [[math.log(0.75), math.log(0.25)]])
    assert not close(logp.detach(), [[math.log(0.9), math.log(0.1)]])
    # H(1/4, 3/4) = -(1/4 ln 1/4 + 3/4 ln 3/4)
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert close(entropy_from_logits(logits.detach(), temperature=2.0), [[entropy, entropy]])
    # d logp / d logits = (onehot - p) / T: row 0 (label 1): (-1/4, 1/4) / 2; row 1: (3/4, -3/4) / 2
    logp.sum().backward()
    assert close(logits.grad[0], [[-0.125, 0.125], [0.375, -0.375]])
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs(logits, labels, temperature=0.0)


@pytest.mark.parametrize("temperature", [0.6, 1.7])
def test_tempered_logprobs_and_entropy_match_reference_and_gradcheck(temperature):
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 5, 7, dtype=torch.float64, generator=generator).requires_grad_(True)
    labels = torch.randint(0, 7, (2, 5), generator=generator)
    log_probs = torch.log_softmax(logits / temperature, dim=-1)
    expected_logp = log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    expected_entropy = -(log_probs.exp() * log_probs).sum(-1)
    assert torch.allclose(token_logprobs(logits, labels, 3, temperature), expected_logp, **TOL)
    assert torch.allclose(entropy_from_logits(logits, 3, temperature), expected_entropy, **TOL)
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, labels, 3, temperature), (logits,))
    assert torch.autograd.gradcheck(lambda x: entropy_from_logits(x, 3, temperature), (logits,))


def test_token_logprobs_accepts_a_non_contiguous_slice_without_copying_it():
    generator = torch.Generator().manual_seed(1)
    full = torch.randn(2, 5, 11, generator=generator).to(torch.bfloat16).requires_grad_(True)
    logits = full[:, :-1]  # [2, 4, 11], not contiguous: the usual causal-LM shift
    labels = torch.randint(0, 11, (2, 4), generator=generator)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        logp = token_logprobs(logits, labels, chunk_size=3)
    # bf16 in, float32 out, equal to a float32 log_softmax of the same (bf16-rounded) logits
    assert logp.dtype == torch.float32
    reference = torch.log_softmax(logits.detach().float(), -1)
    assert torch.allclose(logp.detach(), reference.gather(-1, labels.unsqueeze(-1))[..., 0], **TOL)
    # the only [B, L, V]-sized tensor kept for backward is the logits view itself
    big = [t for t in saved if t.numel() == logits.numel()]
    assert len(big) == 1 and big[0].data_ptr() == logits.data_ptr()
    assert big[0].dtype == torch.bfloat16
    logp.sum().backward()
    # the last position was sliced away: no gradient reaches it
    assert torch.equal(full.grad[:, -1], torch.zeros(2, 11, dtype=torch.bfloat16))
    # softmax gradients of one position sum to 1 - 1 = 0 (onehot minus probabilities)
    assert torch.allclose(full.grad[:, :-1].float().sum(-1), torch.zeros(2, 4), atol=1e-2)


def test_token_logprobs_rejects_ignore_index_labels():
    with pytest.raises(ValueError, match="-100"):
        token_logprobs(torch.zeros(1, 2, 3), torch.tensor([[0, -100]]))
    with pytest.raises(ValueError, match="long tensor"):
        token_logprobs(torch.zeros(1, 2, 3), torch.tensor([[0, 1, 2]]))


def test_the_recipe_accepts_exactly_the_loss_aggregations():
    names = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
    assert list(LOSS_AGGREGATIONS) == names
    for name in LOSS_AGGREGATIONS:
        AlgorithmConfig(loss_agg=name).check("algorithm")
    with pytest.raises(RecipeError, match=r"algorithm.loss_agg='sum' is not one of token-mean, seq-mean-token-mean"):
        AlgorithmConfig(loss_agg="sum").check("algorithm")
