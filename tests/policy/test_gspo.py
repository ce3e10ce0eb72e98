"""GSPO's sequence-level importance ratio (`algorithm.ratio_level: sequence`) against hand-computed tensors.

Two rows, three columns, float64. With d = logp - old_logp at the trained tokens:
row 0 (mask 1 1 0, A = +1): d = 0.1, 0.3 -> mean 0.2, s_0 = e^0.2 = 1.2214028 (above 1 + 0.2: clipped);
row 1 (mask 1 1 1, A = -1): d = -0.3, 0, 0 -> mean -0.1, s_1 = e^-0.1 = 0.9048374 (inside [0.8, 1.2]).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from simsearch.config import TrainRecipe
from simsearch.errors import RecipeError
from simsearch.policy.actor_loss import actor_micro_loss, policy_loss
from simsearch.policy.collate import collate_trajectories, loss_denominators
from simsearch.policy.losses import RATIO_LEVELS
from simsearch.policy.recipe import AlgorithmConfig
from tests.policy.test_batch import PAD, trajectory

TOL = dict(rtol=0.0, atol=1e-9)
S0, S1 = math.exp(0.2), math.exp(-0.1)
OLD = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
DELTA = torch.tensor([[0.1, 0.3, float("nan")], [-0.3, 0.0, 0.0]], dtype=torch.float64)  # NaN: masked padding
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)


def _logp() -> torch.Tensor:
    return (OLD + DELTA).clone().requires_grad_(True)


def test_sequence_ratio_loss_stats_and_gradient_by_hand() -> None:
    logp = _logp()
    loss, stats = policy_loss(logp, OLD, ADV, MASK, AlgorithmConfig(ratio_level="sequence"))
    # row 0: max(-1.2214028, -1.2) = -1.2 at 2 tokens (clipped); row 1: max(0.9048374, 0.9048374) at 3 tokens
    # token-mean: (2 x -1.2 + 3 x 0.9048374) / 5 = 0.0629024
    assert float(loss.detach()) == pytest.approx((2 * -1.2 + 3 * S1) / 5, abs=1e-12)
    assert float(stats["clipfrac"]) == pytest.approx(2 / 5)  # row 0's two tokens
    assert float(stats["approx_kl"]) == pytest.approx(-(0.1 + 0.3 - 0.3) / 5)  # the token log-ratios' k1
    assert float(stats["ratio_mean"]) == pytest.approx((2 * S0 + 3 * S1) / 5)
    assert float(stats["ratio_min"]) == pytest.approx(S1) and float(stats["ratio_max"]) == pytest.approx(S0)
    loss.backward()
    # row 0 clipped: no gradient; row 1: d(-A s_1,t)/d logp_t = -A s_1 = s_1 per token, / 5 tokens.
    # (token ratios would clip row 1's first token, e^-0.3 < 0.8, and give 1/5 at the other two)
    expected = torch.tensor([[0.0, 0.0, 0.0], [S1 / 5, S1 / 5, S1 / 5]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, expected, **TOL)


def test_token_level_on_the_same_tensors_differs() -> None:
    logp = _logp()
    loss, _ = policy_loss(logp, OLD, ADV, MASK, AlgorithmConfig(ratio_level="token"))
    # row 0: ratios e^0.1, e^0.3 -> -e^0.1 and -1.2 (clipped); row 1: e^-0.3 clipped to 0.8, then 1, 1
    assert float(loss.detach()) == pytest.approx((-math.exp(0.1) - 1.2 + 0.8 + 1 + 1) / 5, abs=1e-12)


def test_sequence_ratio_gradient_is_gspos_sequence_objective() -> None:
    # Without clipping, "seq-mean-token-mean" makes the loss -1/B sum_i A_i s_i, whose gradient
    # autograd gives directly from s_i = exp(mean_t(logp - old)).
    logp = _logp()
    loss, _ = policy_loss(
        logp,
        OLD,
        ADV,
        MASK,
        AlgorithmConfig(clip_low=0.9, clip_high=9.0, loss_agg="seq-mean-token-mean", ratio_level="sequence"),
    )
    loss.backward()
    ref_logp = _logp()
    valid = MASK.bool()
    seq = torch.stack([(ref_logp[i][valid[i]] - OLD[i][valid[i]]).mean() for i in range(2)])
    reference = -(ADV[:, 0] * torch.exp(seq)).mean()
    reference.backward()
    assert float(loss.detach()) == pytest.approx(float(reference.detach()), abs=1e-12)  # (-S0 + S1) / 2
    assert float(loss.detach()) == pytest.approx((-S0 + S1) / 2, abs=1e-12)
    torch.testing.assert_close(logp.grad, ref_logp.grad.nan_to_num(0.0), **TOL)


def test_rows_with_a_constant_log_ratio_give_the_token_loss() -> None:
    delta = torch.tensor([[0.1, 0.1, 0.0], [-0.4, -0.4, -0.4]], dtype=torch.float64)
    out = {}
    for level in RATIO_LEVELS:
        logp = (OLD + delta).requires_grad_(True)
        loss, _ = policy_loss(
            logp, OLD, ADV, MASK, AlgorithmConfig(clip_high=0.28, clip_ratio_c=3.0, ratio_level=level)
        )
        loss.backward()
        out[level] = (loss.detach(), logp.grad)
    torch.testing.assert_close(out["sequence"][0], out["token"][0], **TOL)
    torch.testing.assert_close(out["sequence"][1], out["token"][1], **TOL)


def test_on_policy_sequence_ratio_equals_token_ratio_in_the_actor_loss() -> None:
    # old_logp None: old = logp detached, every ratio 1 at either level (why the recipe refuses it)
    micro = collate_trajectories([trajectory([1], [0, 1, 1], [1, 0, 1])], PAD)
    advantages = torch.tensor([[1.0, 7.0, -3.0]])
    grads = []
    for level in RATIO_LEVELS:
        logits = torch.tensor([[[0.3, -0.2], [0.1, 0.0], [-0.5, 0.4]]], requires_grad=True)
        settings = AlgorithmConfig(kl_coef=0.0, ratio_level=level)
        loss, _ = actor_micro_loss(
            logits,
            micro,
            advantages,
            None,
            None,
            settings,
            loss_denominators(micro.loss_mask),
            temperature=1.0,
            token_sum_normalizer=None,
        )
        loss.backward()
        grads.append((float(loss.detach()), logits.grad))
    assert grads[0][0] == pytest.approx(grads[1][0], abs=1e-7)
    torch.testing.assert_close(grads[0][1], grads[1][1])


def test_actor_loss_passes_the_ratio_level() -> None:
    micro = collate_trajectories([trajectory([1], [0, 1], [1, 1])], PAD)
    logits = torch.zeros(1, 2, 2, dtype=torch.float64, requires_grad=True)  # log p = -ln 2 at both tokens
    old = torch.tensor([[-math.log(2) - 0.1, -math.log(2) - 0.5]], dtype=torch.float64)  # d = 0.1, 0.5
    settings = AlgorithmConfig(kl_coef=0.0, ratio_level="sequence", clip_high=10.0)
    loss, _ = actor_micro_loss(
        logits, micro, torch.ones(1, 2), old, None, settings, (2.0, 1.0), temperature=1.0, token_sum_normalizer=None
    )
    assert float(loss.detach()) == pytest.approx(-math.exp(0.3), abs=1e-9)  # s = e^((0.1 + 0.5) / 2) at both tokens


def test_token_level_is_the_default_and_unknown_levels_are_refused() -> None:
    logp = _logp()
    default, _ = policy_loss(logp, OLD, ADV, MASK, AlgorithmConfig())
    token, _ = policy_loss(logp, OLD, ADV, MASK, AlgorithmConfig(ratio_level="token"))
    assert torch.equal(default, token)
    with pytest.raises(ValueError, match="unknown ratio_level 'seq'"):
        policy_loss(logp, OLD, ADV, MASK, AlgorithmConfig(ratio_level="seq"))


def _train_recipe(**algorithm: Any) -> TrainRecipe:
    """2 prompts x 4 rollouts = a batch of 8 trajectories."""
    recipe = TrainRecipe(run_dir="unused", prompts_per_step=2, algorithm=AlgorithmConfig(**algorithm))
    recipe.rollout.group_size, recipe.data.train, recipe.search.corpus = 4, ["train.jsonl"], "corpus.jsonl"
    recipe.policy.model.path = "models/tiny"
    return recipe


def test_recipe_checks_the_ratio_level() -> None:
    AlgorithmConfig().check("algorithm")
    _train_recipe(ratio_level="sequence", minibatch_size=4).check("")
    _train_recipe(ratio_level="sequence", ppo_epochs=2).check("")
    _train_recipe(ratio_level="sequence", ppo_epochs=2, minibatch_size=8).check("")
    with pytest.raises(RecipeError, match=r"algorithm\.ratio_level='seq' is not one of token, sequence"):
        AlgorithmConfig(ratio_level="seq").check("algorithm")
    # One optimizer step per batch: no minibatches (0) or one minibatch of the whole batch (8).
    for minibatch in (0, 8):
        with pytest.raises(RecipeError, match=rf"changes nothing .* algorithm\.minibatch_size={minibatch} with"):
            _train_recipe(ratio_level="sequence", minibatch_size=minibatch).check("")
