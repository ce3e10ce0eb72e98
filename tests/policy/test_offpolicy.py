"""Truncated importance-sampling weights against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from simsearch.policy.offpolicy import truncated_is_weights


def test_weights_are_the_ratio_truncated_at_the_cap_and_zero_where_masked():
    ln2, ln3 = math.log(2.0), math.log(3.0)
    # row 0: ratios exp(0) = 1, exp(-ln2) = 0.5, exp(ln3) = 3 -> capped at 2
    # row 1: ratio exp(ln2) = 2 (exactly the cap: not truncated), then two masked tokens, one NaN
    trainer = torch.tensor([[-1.0, -1.0 - ln2, -0.5], [ln2 - 1.0, float("nan"), 0.0]])
    rollout = torch.tensor([[-1.0, -1.0, -0.5 - ln3], [-1.0, -2.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.float32)
    weights, stats = truncated_is_weights(trainer, rollout, 2.0, mask)
    expected = torch.tensor([[1.0, 0.5, 2.0], [2.0, 0.0, 0.0]])
    torch.testing.assert_close(weights, expected, rtol=0, atol=1e-6)
    # mean over the 4 valid tokens: (1 + 0.5 + 2 + 2) / 4 = 1.375
    assert stats["weight_mean"].item() == pytest.approx(1.375, abs=1e-6)
    # only the ratio 3 exceeds the cap: 1 of 4
    assert stats["truncated_frac"].item() == pytest.approx(0.25, abs=1e-6)
    # mean of rollout - trainer: (0 + ln2 - ln3 - ln2) / 4 = -ln3 / 4
    assert stats["mismatch_k1"].item() == pytest.approx(-ln3 / 4, abs=1e-6)


def test_weights_carry_no_gradient_and_on_policy_tokens_weigh_one():
    logp = torch.tensor([[-0.3, -2.0]], requires_grad=True)
    weights, stats = truncated_is_weights(logp, logp.detach(), 2.0, torch.ones(1, 2))
    assert not weights.requires_grad
    torch.testing.assert_close(weights, torch.ones(1, 2), rtol=0, atol=0)
    assert stats["truncated_frac"].item() == 0.0 and stats["mismatch_k1"].item() == 0.0


def test_bad_shapes_and_caps_below_one_are_refused():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="must match"):
        truncated_is_weights(x, torch.zeros(2, 2), 2.0, x)
    with pytest.raises(ValueError, match=r"cap=0.5"):
        truncated_is_weights(x, x, 0.5, x)
