"""Advantage estimators against hand-computed tensors.

Each numeric test derives its expected values in a comment and also asserts that the value a
common mistake would give (biased std, contiguous-group assumption, return reset at masked
tokens, ...) is NOT what the code returns.
"""

import math

import pytest
import torch

from simsearch.errors import RecipeError
from simsearch.policy.advantages import (
    ESTIMATORS,
    EstimatorInputs,
    broadcast_to_tokens,
    dr_grpo_advantages,
    gae_advantages,
    grpo_advantages,
    reinforce_advantages,
    reinforce_plus_plus_advantages,
    rloo_advantages,
    stratified_grpo_advantages,
)
from simsearch.policy.masked import masked_mean, masked_var, masked_whiten
from simsearch.policy.recipe import AlgorithmConfig

TOL = dict(rtol=0.0, atol=1e-6)
EPS = 1e-6


def close(actual: torch.Tensor, expected: list[float] | list[list[float]]) -> bool:
    return torch.allclose(actual, torch.tensor(expected, dtype=actual.dtype), **TOL)


# Two interleaved groups (ids 7 and 3), as a shuffled or filtered batch would have them.
REWARDS = torch.tensor([1.0, 2.0, 0.0, 2.0, 0.0, 2.0], dtype=torch.float64)
GROUPS = torch.tensor([7, 3, 7, 3, 7, 3])


# --- masked utilities --------------------------------------------------------------------------


def test_masked_mean_ignores_masked_values_even_nan():
    x = torch.tensor([[1.0, 2.0, float("nan")], [3.0, 100.0, 5.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    # valid: 1, 2, 3, 5 -> mean 11/4 = 2.75; the un-masked mean would include 100 and NaN
    assert close(masked_mean(x, mask), 2.75)
    # per row: (1+2)/2 = 1.5 ; (3+5)/2 = 4
    assert close(masked_mean(x, mask, dim=-1), [1.5, 4.0])
    assert not close(torch.nan_to_num(x).mean(dim=-1), [1.5, 4.0])


def test_masked_mean_of_empty_selection_is_zero_with_finite_grad():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    mask = torch.tensor([[1, 1], [0, 0]])
    out = masked_mean(x, mask, dim=-1)
    assert close(out.detach(), [1.5, 0.0])
    out.sum().backward()
    # d/dx of the row-0 mean is 1/2 per element; the empty row gets exactly 0, not NaN
    assert torch.equal(x.grad, torch.tensor([[0.5, 0.5], [0.0, 0.0]]))


def test_masked_var_is_unbiased_and_whiten_matches_verl_formula():
    x = torch.tensor([[1.0, 3.0, 50.0], [5.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # valid 1, 3, 5: mean 3, squared deviations 4 + 0 + 4 = 8, unbiased var 8/2 = 4
    assert close(masked_var(x, mask), 4.0)
    assert not close(masked_var(x, mask), 8.0 / 3.0)  # the biased (population) variance
    # whiten: (x - 3) / sqrt(4 + 1e-8); masked positions are 0
    s = math.sqrt(4.0 + 1e-8)
    assert close(masked_whiten(x, mask), [[-2.0 / s, 0.0, 0.0], [2.0 / s, 0.0, 0.0]])


def test_masked_var_needs_two_valid_values():
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(torch.tensor([1.0, 2.0]), torch.tensor([1, 0]))


def test_broadcast_to_tokens_zeroes_masked_tokens():
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]])
    assert close(broadcast_to_tokens(adv, mask), [[2.0, 0.0, 2.0], [-1.0, -1.0, 0.0]])
    with pytest.raises(ValueError, match="loss_mask"):
        broadcast_to_tokens(adv, torch.ones(3, 2))


# --- GRPO ----------------------------------------------------------------------------------------


def test_grpo_uses_unbiased_group_std():
    adv, stats = grpo_advantages(REWARDS, GROUPS)
    # group 7 = rows 0, 2, 4 with rewards 1, 0, 0: mean 1/3,
    #   unbiased var = ((2/3)^2 + 2 (1/3)^2) / (3 - 1) = (6/9) / 2 = 1/3, std = sqrt(1/3)
    #   A = (2/3) / (sqrt(1/3) + 1e-6), (-1/3) / (sqrt(1/3) + 1e-6)   (~ +1.1547, -0.5774)
    # group 3 = rows 1, 3, 5, all 2.0: zero std -> A = 0
    hi = (2 / 3) / (math.sqrt(1 / 3) + EPS)
    lo = (-1 / 3) / (math.sqrt(1 / 3) + EPS)
    assert close(adv, [hi, 0.0, lo, 0.0, lo, 0.0])
    assert stats["num_groups"].item() == 2 and stats["zero_std_groups"].item() == 1
    # the biased std sqrt(2/9) would give (2/3) / 0.4714 = 1.4142 for row 0
    biased = (2 / 3) / (math.sqrt(2 / 9) + EPS)
    assert not math.isclose(adv[0].item(), biased, abs_tol=1e-3)


def test_grpo_does_not_assume_contiguous_groups():
    adv, _ = grpo_advantages(REWARDS, GROUPS)
    # treating rows 0-2 and 3-5 as the groups (reshape to [2, 3]) would give group [1, 2, 0]
    # -> row 0 advantage (1 - 1) / 1 = 0; the real group gives +1.1547
    assert adv[0].item() > 1.1
    perm = torch.tensor([5, 2, 0, 3, 1, 4])
    adv_perm, _ = grpo_advantages(REWARDS[perm], GROUPS[perm])
    assert torch.allclose(adv_perm, adv[perm], **TOL)


def test_grpo_equal_rewards_give_exactly_zero():
    # 0.1 * 3 / 3 != 0.1 in float32, so an std-based test could leave tiny non-zero advantages
    rewards = torch.full((3,), 0.1)
    adv, stats = grpo_advantages(rewards, torch.tensor([0, 0, 0]))
    assert torch.equal(adv, torch.zeros(3))
    assert stats["zero_std_groups"].item() == 1


@pytest.mark.parametrize("estimator", [grpo_advantages, dr_grpo_advantages, rloo_advantages])
def test_group_estimators_reject_singleton_groups_and_bad_ids(estimator):
    with pytest.raises(ValueError, match=r"group\(s\) \[5\]"):
        estimator(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1, 1, 5]))
    with pytest.raises(ValueError, match="integer"):
        estimator(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0]))
    with pytest.raises(ValueError, match="group_ids must be"):
        estimator(torch.tensor([1.0, 0.0]), torch.tensor([1, 1, 1]))
    with pytest.raises(ValueError, match="NaN or inf"):
        estimator(torch.tensor([1.0, float("nan")]), torch.tensor([1, 1]))


# --- Dr.GRPO, REINFORCE, RLOO --------------------------------------------------------------------


def test_dr_grpo_subtracts_group_mean_without_std():
    adv, stats = dr_grpo_advantages(REWARDS, GROUPS)
    # group 7: 1 - 1/3 = 2/3, 0 - 1/3 = -1/3; group 3: 2 - 2 = 0
    assert close(adv, [2 / 3, 0.0, -1 / 3, 0.0, -1 / 3, 0.0])
    assert stats["zero_std_groups"].item() == 1
    grpo, _ = grpo_advantages(REWARDS, GROUPS)
    assert not torch.allclose(adv, grpo, atol=1e-3)


def test_reinforce_with_and_without_batch_mean_baseline():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])
    adv, stats = reinforce_advantages(rewards)
    assert close(adv, [1.0, 0.0, 0.5, 0.5]) and stats["baseline"].item() == 0.0
    # batch mean = 2 / 4 = 0.5
    adv, stats = reinforce_advantages(rewards, batch_mean_baseline=True)
    assert close(adv, [0.5, -0.5, 0.0, 0.0])
    assert close(stats["baseline"], 0.5)


def test_rloo_leave_one_out_baseline():
    adv, _ = rloo_advantages(REWARDS, GROUPS)
    # group 7 rewards 1, 0, 0: row 0: 1 - (0 + 0)/2 = 1; rows 2, 4: 0 - (1 + 0)/2 = -0.5
    # group 3 all 2: 2 - 2 = 0
    assert close(adv, [1.0, 0.0, -0.5, 0.0, -0.5, 0.0])
    # the full-group mean (mistake) would give 2/3 for row 0
    assert not math.isclose(adv[0].item(), 2 / 3, abs_tol=1e-3)


# --- REINFORCE++ ---------------------------------------------------------------------------------

# row 0: mask [1, 0, 1, 1] (position 1 is a retrieved token), R = 1
# row 1: mask [1, 1, 0, 0] (padding), R = 0
RPP_MASK = torch.tensor([[1, 0, 1, 1], [1, 1, 0, 0]])
RPP_KL = torch.tensor([[0.1, 5.0, 0.2, 0.3], [0.2, 0.4, 9.0, 9.0]], dtype=torch.float64)
RPP_REWARDS = torch.tensor([1.0, 0.0], dtype=torch.float64)


def test_reinforce_plus_plus_skips_masked_tokens_and_whitens_over_the_batch():
    adv, returns, _ = reinforce_plus_plus_advantages(RPP_REWARDS, RPP_MASK, kl=RPP_KL, kl_coef=0.5, gamma=0.5)
    # token rewards (-0.5 * kl at valid tokens, + R at the last valid token):
    #   row 0: t0 -0.05, t1 masked, t2 -0.1, t3 -0.15 + 1 = 0.85
    #   row 1: t0 -0.1,  t1 -0.2 + 0 = -0.2
    # returns over valid tokens, gamma 0.5 (t1 of row 0 is skipped, not discounted):
    #   row 0: G3 = 0.85, G2 = -0.1 + 0.5*0.85 = 0.325, G0 = -0.05 + 0.5*0.325 = 0.1125
    #   row 1: G1 = -0.2, G0 = -0.1 + 0.5*(-0.2) = -0.2
    assert close(returns, [[0.1125, 0.0, 0.325, 0.85], [-0.2, -0.2, 0.0, 0.0]])
    # whiten over the 5 valid returns: mean = 0.8875 / 5 = 0.1775
    #   deviations -0.065, 0.1475, 0.6725, -0.3775, -0.3775
    #   squares 0.004225 + 0.02175625 + 0.45225625 + 2 * 0.14250625 = 0.76325
    #   unbiased var = 0.76325 / 4 = 0.1908125
    s = math.sqrt(0.1908125 + 1e-8)
    expected = [[-0.065 / s, 0.0, 0.1475 / s, 0.6725 / s], [-0.3775 / s, -0.3775 / s, 0.0, 0.0]]
    assert close(adv, expected)
    # verl's loop resets the return at a masked token: row 0 t0 would get -0.05 + 0.5*0 = -0.05
    assert not math.isclose(returns[0, 0].item(), -0.05, abs_tol=1e-3)
    # the biased variance (0.76325 / 5) would give a different scale
    assert not math.isclose(adv[0, 2].item(), 0.1475 / math.sqrt(0.76325 / 5), abs_tol=1e-3)


def test_reinforce_plus_plus_without_kl_gamma_one_is_whitened_outcome():
    adv, returns, stats = reinforce_plus_plus_advantages(RPP_REWARDS, RPP_MASK)
    # gamma 1, no KL: every valid token's return is its row's outcome R
    assert close(returns, [[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    # valid values 1, 1, 1, 0, 0: mean 0.6, unbiased var (3*0.16 + 2*0.36)/4 = 0.3
    s = math.sqrt(0.3 + 1e-8)
    assert close(adv, [[0.4 / s, 0.0, 0.4 / s, 0.4 / s], [-0.6 / s, -0.6 / s, 0.0, 0.0]])
    assert close(stats["returns_mean"], 0.6)


def test_reinforce_plus_plus_requires_kl_when_penalized_and_a_valid_token_per_row():
    with pytest.raises(ValueError, match="kl tensor"):
        reinforce_plus_plus_advantages(RPP_REWARDS, RPP_MASK, kl_coef=0.1)
    with pytest.raises(ValueError, match=r"row\(s\) \[1\]"):
        reinforce_plus_plus_advantages(RPP_REWARDS, torch.tensor([[1, 1], [0, 0]]))
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        reinforce_plus_plus_advantages(RPP_REWARDS, RPP_MASK, kl=RPP_KL, kl_coef=-0.1)


# --- GAE -----------------------------------------------------------------------------------------

# one row, position 2 is a retrieved token (mask 0) whose value 9.0 must be ignored
GAE_MASK = torch.tensor([[1, 1, 0, 1]])
GAE_VALUES = torch.tensor([[0.5, 0.2, 9.0, 0.4]], dtype=torch.float64)
GAE_REWARD = torch.tensor([1.0], dtype=torch.float64)


def test_gae_runs_over_valid_tokens_only():
    adv, returns, _ = gae_advantages(GAE_REWARD, GAE_VALUES, GAE_MASK, gamma=0.9, lam=0.8, whiten=False)
    # valid tokens t0, t1, t3; reward 1 at t3; gamma * lam = 0.72
    #   t3: delta = 1 + 0.9*0 - 0.4 = 0.6                 A3 = 0.6
    #   t1: delta = 0 + 0.9*V3 - 0.2 = 0.36 - 0.2 = 0.16  A1 = 0.16 + 0.72*0.6 = 0.592
    #   t0: delta = 0 + 0.9*V1 - 0.5 = 0.18 - 0.5 = -0.32 A0 = -0.32 + 0.72*0.592 = 0.10624
    # returns = A + V: 0.60624, 0.792, (masked) 0, 1.0
    assert close(adv, [[0.10624, 0.592, 0.0, 0.6]])
    assert close(returns, [[0.60624, 0.792, 0.0, 1.0]])
    # treating the masked position as a real step (the common mistake):
    #   t2: delta = 0.9*0.4 - 9.0 = -8.64, A2 = -8.64 + 0.72*0.6 = -8.208
    #   t1: delta = 0.9*9.0 - 0.2 = 7.9,   A1 = 7.9 + 0.72*(-8.208) = 1.99024
    assert not math.isclose(adv[0, 1].item(), 1.99024, abs_tol=1e-3)


def test_gae_gamma_lambda_one_is_reward_minus_value_with_kl_penalty():
    kl = torch.tensor([[0.2, 0.1, 3.0, 0.3]], dtype=torch.float64)
    adv, returns, stats = gae_advantages(
        GAE_REWARD, GAE_VALUES, GAE_MASK, gamma=1.0, lam=1.0, kl=kl, kl_coef=0.5, whiten=False
    )
    # gamma = lam = 1: A_t = (sum of rewards from t on) - V_t; rewards -0.1, -0.05, -, 1 - 0.15
    #   returns-to-go: t3 0.85, t1 0.8, t0 0.7 -> A = 0.7 - 0.5, 0.8 - 0.2, -, 0.85 - 0.4
    assert close(adv, [[0.2, 0.6, 0.0, 0.45]])
    assert close(returns, [[0.7, 0.8, 0.0, 0.85]])
    # values_mean over valid tokens: (0.5 + 0.2 + 0.4) / 3
    assert close(stats["values_mean"], 1.1 / 3)


def test_gae_whitening_over_batch_valid_tokens():
    adv, returns, _ = gae_advantages(GAE_REWARD, GAE_VALUES, GAE_MASK, gamma=0.9, lam=0.8)
    # raw A = 0.10624, 0.592, 0.6: mean 1.29824/3 = 0.43274667
    #   deviations -0.32650667, 0.15925333, 0.16725333
    #   unbiased var = (0.10660660 + 0.02536162 + 0.02797367) / 2 = 0.07997094
    mean = 1.29824 / 3
    devs = [0.10624 - mean, 0.592 - mean, 0.6 - mean]
    var = sum(d * d for d in devs) / 2
    s = math.sqrt(var + 1e-8)
    assert close(adv, [[devs[0] / s, devs[1] / s, 0.0, devs[2] / s]])
    # returns are never whitened
    assert close(returns, [[0.60624, 0.792, 0.0, 1.0]])


# --- Stratified GRPO -----------------------------------------------------------------------------

# group 0 (even rows): rewards 1, 0, 1, 1, 0 with 1, 1, 2, 2, 0 search calls
# group 1 (odd rows):  rewards 0, 0 with 1, 1 search calls, interleaved with group 0
STRAT_REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0], dtype=torch.float64)
STRAT_GROUPS = torch.tensor([0, 1, 0, 1, 0, 0, 0])
STRAT_SEARCHES = torch.tensor([1, 1, 1, 1, 2, 2, 0])


def test_stratified_grpo_blends_stratum_and_group_normalization():
    adv, stats = stratified_grpo_advantages(STRAT_REWARDS, STRAT_GROUPS, STRAT_SEARCHES, alpha=0.5)
    # group 0 rows 0, 2, 4, 5, 6: rewards 1, 0, 1, 1, 0
    #   GRPO: mean 0.6, unbiased var (3*0.16 + 2*0.36)/4 = 0.3, std sqrt(0.3) = 0.5477
    #     R=1 -> 0.4/(sqrt(0.3)+eps) = 0.7303;  R=0 -> -0.6/(sqrt(0.3)+eps) = -1.0954
    #   strata: 1 search {row0: 1, row2: 0}: mean 0.5, unbiased std sqrt(0.5)
    #             -> +-0.5 / (sqrt(0.5) + eps)
    #           2 searches {rows 4, 5: 1, 1}: zero std -> 0
    #           0 searches {row 6}: singleton -> 0
    # group 1 rows 1, 3: rewards 0, 0 -> both terms 0
    g_hi = 0.4 / (math.sqrt(0.3) + EPS)
    g_lo = -0.6 / (math.sqrt(0.3) + EPS)
    san = 0.5 / (math.sqrt(0.5) + EPS)
    expected = [
        0.5 * san + 0.5 * g_hi,  # row 0
        0.0,
        -0.5 * san + 0.5 * g_lo,  # row 2
        0.0,
        0.5 * g_hi,  # row 4
        0.5 * g_hi,  # row 5
        0.5 * g_lo,  # row 6
    ]
    assert close(adv, expected)
    assert stats["num_strata"].item() == 4 and stats["singleton_strata"].item() == 1
    # pooling the 1-search stratum across groups ({1, 0, 0, 0}, mean 0.25) would change row 0
    pooled_san = 0.75 / (math.sqrt(0.25) + EPS)
    assert not math.isclose(adv[0].item(), 0.5 * pooled_san + 0.5 * g_hi, abs_tol=1e-3)


def test_stratified_grpo_limits_reduce_to_grpo():
    grpo, _ = grpo_advantages(STRAT_REWARDS, STRAT_GROUPS)
    alpha0, _ = stratified_grpo_advantages(STRAT_REWARDS, STRAT_GROUPS, STRAT_SEARCHES, alpha=0.0)
    assert torch.allclose(alpha0, grpo, **TOL)
    # one stratum per group (equal search counts): SAN is GRPO itself, whatever alpha
    same = torch.zeros_like(STRAT_SEARCHES)
    alpha1, _ = stratified_grpo_advantages(STRAT_REWARDS, STRAT_GROUPS, same, alpha=1.0)
    assert torch.allclose(alpha1, grpo, **TOL)
    with pytest.raises(ValueError, match="alpha"):
        stratified_grpo_advantages(STRAT_REWARDS, STRAT_GROUPS, STRAT_SEARCHES, alpha=1.5)


def test_the_table_names_every_estimator_the_recipe_accepts():
    assert list(ESTIMATORS) == [
        "grpo", "dr_grpo", "reinforce", "reinforce_baseline", "reinforce_pp", "rloo", "ppo", "stratified_grpo", "igpo",
    ]  # fmt: skip
    assert [n for n, e in ESTIMATORS.items() if e.token_level] == ["reinforce_pp", "ppo", "igpo"]
    assert [n for n, e in ESTIMATORS.items() if e.compares_group] == [
        "grpo", "dr_grpo", "rloo", "stratified_grpo", "igpo",
    ]  # fmt: skip
    assert [n for n, e in ESTIMATORS.items() if e.information_gain] == ["igpo"]
    for name in ESTIMATORS:
        AlgorithmConfig(estimator=name).check("algorithm")
    with pytest.raises(RecipeError, match=r"algorithm.estimator='gpro' is not one of grpo, dr_grpo"):
        AlgorithmConfig(estimator="gpro").check("algorithm")


def test_table_entries_call_their_estimator():
    # two groups of two: rewards (1, 0) and (3, 3); GRPO: (1 - 0.5) / (std 0.7071 + 1e-6) = +-0.7071, then 0, 0
    rewards, groups = torch.tensor([1.0, 0.0, 3.0, 3.0]), torch.tensor([0, 0, 1, 1])
    x = EstimatorInputs(rewards, torch.ones(4, 2), groups, torch.zeros(4))
    advantages, returns, _ = ESTIMATORS["grpo"].compute(x)
    assert returns is None
    torch.testing.assert_close(advantages, torch.tensor([0.7071058, -0.7071058, 0.0, 0.0]), rtol=0, atol=1e-6)
    # RLOO: 1 - 0 = 1, 0 - 1 = -1; the constant group 0
    torch.testing.assert_close(ESTIMATORS["rloo"].compute(x)[0], torch.tensor([1.0, -1.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="needs the critic's values"):
        ESTIMATORS["ppo"].compute(x)


def test_flat_groups_are_silent_exactly_where_the_table_says():
    # Two flat groups, rewards (1, 1) and (0, 0), two turns of one token each. Group-baseline
    # estimators give 0 everywhere; REINFORCE gives the reward (1), its batch-mean baseline
    # +-0.5, REINFORCE++ and GAE (critic values 0) non-zero returns, and IGPO's gains
    # (0.5, 0; 0.2, 0.1) differ within each group, so its turns are not flat.
    rewards, groups = torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1])
    x = EstimatorInputs(
        rewards, torch.ones(4, 2), groups, torch.zeros(4, dtype=torch.long), values=torch.zeros(4, 2),
        gains=torch.tensor([[0.5], [0.0], [0.2], [0.1]]), turn_index=torch.tensor([[0, 1]] * 4),
    )  # fmt: skip
    silent = [n for n, e in ESTIMATORS.items() if e.flat_groups_are_silent]
    assert silent == ["grpo", "dr_grpo", "rloo", "stratified_grpo"]
    for name, estimator in ESTIMATORS.items():
        advantages = estimator.compute(x)[0]
        assert bool((advantages == 0).all()) == (name in silent), name
