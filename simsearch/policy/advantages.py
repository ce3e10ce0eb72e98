"""Advantage estimators: rewards in, per-trajectory or per-token advantages out.

Shapes: B = prompts x group size (one row per trajectory), L = padded response length.
Sequence-level estimators (GRPO, Dr.GRPO, REINFORCE, RLOO, stratified GRPO) return `[B]`, spread
over the loss mask by `broadcast_to_tokens`; token-level ones (REINFORCE++, GAE, IGPO) return
`[B, L]`. Each returns `(advantages, stats)`, stats detached 0-d tensors. Groups are given by
`group_ids` `[B]` (rows of a group need not be adjacent). A group of one is an error for GRPO,
Dr.GRPO and RLOO; an all-equal group gets exactly 0. Retrieved tokens (mask 0) are skipped by
the token-level estimators: advantage and return 0 there, the return flows across them.
Departures from the papers and verl: docs/protocols.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from simsearch.policy.masked import Stats, masked_mean, masked_whiten

GRPO_EPS = 1e-6  # verl's default epsilon for the group std


def broadcast_to_tokens(advantages: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Spread sequence-level advantages over the tokens of each response.

    Args:
        advantages: `[B]` one advantage per trajectory.
        loss_mask: `[B, L]` 1 for tokens the policy generated and is trained on, 0 for prompt
            padding, retrieved `<information>` tokens and response padding.

    Returns:
        `[B, L]` advantages[b] at every valid token of row b, exactly 0 elsewhere.
    """
    if advantages.dim() != 1 or loss_mask.dim() != 2 or loss_mask.shape[0] != advantages.shape[0]:
        raise ValueError(
            f"broadcast_to_tokens expects advantages [B] and loss_mask [B, L], got "
            f"{tuple(advantages.shape)} and {tuple(loss_mask.shape)}"
        )
    token_adv = advantages.unsqueeze(-1).expand(loss_mask.shape)  # [B, L]
    return torch.where(loss_mask.bool(), token_adv, torch.zeros_like(token_adv))


# ---------------------------------------------------------------------------------------------
# Sequence-level estimators
# ---------------------------------------------------------------------------------------------


def grpo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = GRPO_EPS
) -> tuple[torch.Tensor, Stats]:
    """GRPO: z-score of each reward within its group, A_i = (R_i - mean_g) / (std_g + eps).

    std_g is the unbiased sample std (divides by n_g - 1), matching verl. Groups whose rewards
    are all equal get A = 0 exactly.

    Args:
        rewards: `[B]` scalar reward per trajectory.
        group_ids: `[B]` integer id of the prompt each trajectory answers; rows of a group may be
            anywhere in the batch.
        eps: added to the std.

    Returns:
        advantages `[B]` and stats `num_groups`, `zero_std_groups` (groups that carry no signal).
    """
    group = _group_stats(rewards, group_ids, "grpo_advantages", min_size=2)
    std = group.std[group.index]  # [B]
    advantages = (rewards - group.mean[group.index]) / (std + eps)  # [B]
    advantages = torch.where(group.constant[group.index], torch.zeros_like(advantages), advantages)
    return advantages, group.stats()


def dr_grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, Stats]:
    """Dr.GRPO: group-mean baseline without std division, A_i = R_i - mean_g.

    The other half of Dr.GRPO (no per-response length normalization) is a loss choice: aggregate
    the policy loss with `"seq-mean-token-sum-norm"` (see `losses.aggregate_loss`).

    Args:
        rewards: `[B]` scalar reward per trajectory.
        group_ids: `[B]` integer prompt id of each trajectory.

    Returns:
        advantages `[B]` and stats `num_groups`, `zero_std_groups`.
    """
    group = _group_stats(rewards, group_ids, "dr_grpo_advantages", min_size=2)
    return rewards - group.mean[group.index], group.stats()


def reinforce_advantages(rewards: torch.Tensor, batch_mean_baseline: bool = False) -> tuple[torch.Tensor, Stats]:
    """REINFORCE: the reward itself, or the reward minus the batch mean reward.

    ZeroSearch's recommended estimator. The batch-mean baseline is the mean over all B
    trajectories (all prompts), which lowers variance without needing groups.

    Args:
        rewards: `[B]` scalar reward per trajectory.
        batch_mean_baseline: subtract the mean reward of the batch.

    Returns:
        advantages `[B]` and stats `baseline` (0 without a baseline).
    """
    _check_rewards(rewards, "reinforce_advantages")
    baseline = rewards.mean() if batch_mean_baseline else rewards.new_zeros(())
    return rewards - baseline, {"baseline": baseline.detach()}


def rloo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, Stats]:
    """RLOO: leave-one-out baseline, A_i = R_i - mean_{j != i, j in g} R_j.

    Computed as R_i - (S_g - R_i) / (n_g - 1) with S_g the group sum. Every group needs at least
    two trajectories.

    Args:
        rewards: `[B]` scalar reward per trajectory.
        group_ids: `[B]` integer prompt id of each trajectory.

    Returns:
        advantages `[B]` and stats `num_groups`, `zero_std_groups`.
    """
    group = _group_stats(rewards, group_ids, "rloo_advantages", min_size=2)
    n = group.count[group.index]  # [B]
    others_mean = (group.sum[group.index] - rewards) / (n - 1)  # [B]
    advantages = rewards - others_mean
    advantages = torch.where(group.constant[group.index], torch.zeros_like(advantages), advantages)
    return advantages, group.stats()


def stratified_grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    num_search_calls: torch.Tensor,
    alpha: float,
    eps: float = GRPO_EPS,
) -> tuple[torch.Tensor, Stats]:
    """Stratified GRPO: blend of within-stratum and within-group normalization.

    A stratum is the set of trajectories of one group that made the same number of search calls.
    A_SAN = (R_i - mean_k) / (std_k + eps) within stratum k; A = alpha * A_SAN + (1 - alpha) *
    A_GRPO. A stratum of a single trajectory has A_SAN = 0.

    Args:
        rewards: `[B]` scalar reward per trajectory.
        group_ids: `[B]` integer prompt id of each trajectory.
        num_search_calls: `[B]` integer number of `<search>` calls each trajectory made.
        alpha: weight of the stratified term, in [0, 1] (1 = pure SAN, 0 = plain GRPO).
        eps: added to both stds.

    Returns:
        advantages `[B]`; stats `num_groups`, `zero_std_groups`, `num_strata`, `singleton_strata`.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"stratified_grpo_advantages: alpha must be in [0, 1], got {alpha}")
    grpo, stats = grpo_advantages(rewards, group_ids, eps)
    _check_ids(num_search_calls, rewards, "num_search_calls", "stratified_grpo_advantages")
    # one id per (group, search count) pair; unique over rows avoids assuming any id range
    pairs = torch.stack([group_ids.long(), num_search_calls.long()], dim=1)  # [B, 2]
    _, stratum_ids = torch.unique(pairs, dim=0, return_inverse=True)  # [B]
    stratum = _group_stats(rewards, stratum_ids, "stratified_grpo_advantages", min_size=1)
    singleton = stratum.count[stratum.index] < 2  # [B]
    flat = stratum.constant[stratum.index] | singleton  # [B] no within-stratum comparison
    # singleton strata have NaN unbiased std; the `where` below discards it, the safe value keeps
    # the arithmetic finite
    std = torch.where(singleton, torch.ones_like(rewards), stratum.std[stratum.index])
    san = (rewards - stratum.mean[stratum.index]) / (std + eps)  # [B]
    san = torch.where(flat, torch.zeros_like(san), san)
    advantages = alpha * san + (1.0 - alpha) * grpo
    stats["num_strata"] = torch.tensor(float(stratum.count.numel()))
    stats["singleton_strata"] = (stratum.count < 2).sum().to(rewards.dtype)
    return advantages, stats


# ---------------------------------------------------------------------------------------------
# Token-level estimators
# ---------------------------------------------------------------------------------------------


def reinforce_plus_plus_advantages(
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, Stats]:
    """REINFORCE++: KL-shaped token rewards, discounted return-to-go, batch-wide whitening.

    Token reward r_t = -kl_coef * kl_t at every valid token, plus the outcome reward at the last
    valid token. G_t = r_t + gamma * G_next over valid tokens only (masked tokens are skipped,
    see the module docstring). Advantages are the returns whitened over every valid token of the
    batch (not per group).

    Args:
        rewards: `[B]` outcome reward per trajectory.
        loss_mask: `[B, L]` 1 at generated tokens, 0 at retrieved tokens and padding.
        kl: `[B, L]` per-token KL estimate (`losses.kl_penalty`), needed when `kl_coef` > 0.
        kl_coef: weight of the KL penalty in the reward (>= 0).
        gamma: discount per valid token.

    Returns:
        advantages `[B, L]`, returns `[B, L]` (0 at masked positions) and stats `returns_mean`.
    """
    fn = "reinforce_plus_plus_advantages"
    token_rewards = _token_rewards(rewards, loss_mask, kl, kl_coef, fn)
    valid = loss_mask.bool()
    returns = torch.zeros_like(token_rewards)  # [B, L]
    carry = torch.zeros_like(rewards)  # [B] return of the next valid token
    for t in reversed(range(loss_mask.shape[1])):
        g = token_rewards[:, t] + gamma * carry
        carry = torch.where(valid[:, t], g, carry)
        returns[:, t] = torch.where(valid[:, t], g, torch.zeros_like(g))
    advantages = masked_whiten(returns, loss_mask)
    return advantages, returns, {"returns_mean": masked_mean(returns, loss_mask).detach()}


def gae_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, Stats]:
    """Generalized advantage estimation for PPO over the valid tokens of each response.

    With valid tokens t_1 < ... < t_n of a row (masked tokens skipped):
    delta_k = r_k + gamma * V_{k+1} - V_k (V_{n+1} = 0), A_k = delta_k + gamma * lam * A_{k+1},
    returns = A + V. Token rewards as in REINFORCE++: outcome reward at the last valid token,
    optional -kl_coef * kl_t at each valid token.

    Args:
        rewards: `[B]` outcome reward per trajectory.
        values: `[B, L]` critic values V_t, aligned with the response tokens.
        loss_mask: `[B, L]` 1 at generated tokens, 0 at retrieved tokens and padding.
        gamma: discount per valid token.
        lam: GAE lambda.
        kl: `[B, L]` per-token KL estimate, needed when `kl_coef` is non-zero.
        kl_coef: weight of the KL penalty in the reward (>= 0).
        whiten: whiten the advantages over every valid token of the batch (never the returns).

    Returns:
        advantages `[B, L]`, returns `[B, L]` (the critic's targets; both 0 at masked positions)
        and stats `returns_mean`, `values_mean`.
    """
    token_rewards = _token_rewards(rewards, loss_mask, kl, kl_coef, "gae_advantages")
    _check_same_shape(values, loss_mask, "values", "loss_mask")
    values = values.detach()
    valid = loss_mask.bool()
    advantages = torch.zeros_like(token_rewards)  # [B, L]
    next_value = torch.zeros_like(rewards)  # [B] V of the next valid token
    carry = torch.zeros_like(rewards)  # [B] A of the next valid token
    for t in reversed(range(loss_mask.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * carry
        carry = torch.where(valid[:, t], a, carry)
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        advantages[:, t] = torch.where(valid[:, t], a, torch.zeros_like(a))
    returns = torch.where(valid, advantages + values, torch.zeros_like(advantages))
    if whiten:
        advantages = masked_whiten(advantages, loss_mask)
    stats = {
        "returns_mean": masked_mean(returns, loss_mask),
        "values_mean": masked_mean(values, loss_mask),
    }
    return advantages, returns, stats


def igpo_advantages(
    rewards: torch.Tensor,
    gains: torch.Tensor,
    turn_index: torch.Tensor,
    loss_mask: torch.Tensor,
    group_ids: torch.Tensor,
    gamma: float = 1.0,
    eps: float = GRPO_EPS,
) -> tuple[torch.Tensor, Stats]:
    """IGPO (Wang et al. 2025): information-gain turn rewards, normalized per group, discounted over turns.

    Row b's turn rewards are its gains (`policy.infogain`) for turns k < n_b - 1 and its outcome
    for the last; a group's turn rewards are z-scored jointly (population std; flat group 0), and
    turn k's advantage A_k = sum_{j >= k} gamma^(j - k) r^_j goes to its trained tokens.

    Args:
        rewards: `[B]` outcome reward per trajectory (the last turn's reward).
        gains: `[B, K]` information gain of each non-final turn; entries at k >= n_b - 1 are
            ignored (K >= the most turns of any row, or K >= 1 when every row has one turn).
        turn_index: `[B, L]` turn of each response token (0, 1, ...), -1 at padding.
        loss_mask: `[B, L]` 1 at generated tokens, 0 at inserted tokens and padding.
        group_ids: `[B]` prompt each trajectory answers.
        gamma: Discount per turn, in [0, 1].
        eps: Added to the std.

    Returns:
        advantages `[B, L]` and stats `num_groups`, `zero_std_groups`, `turns_mean`, `gain_mean`
        (mean gain over the non-final turns of the batch, 0 without one).
    """
    fn = "igpo_advantages"
    _check_rewards(rewards, fn)
    _check_ids(group_ids, rewards, "group_ids", fn)
    _check_same_shape(turn_index, loss_mask, "turn_index", "loss_mask")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"{fn}: gamma must be in [0, 1], got {gamma}")
    turns = (turn_index.max(dim=1).values + 1).clamp(min=1)  # [B] a row without tokens still has its outcome
    turn_rewards, valid, last = _turn_rewards(rewards, gains, turns, fn)  # [B, K] each
    normalized, stats = _joint_group_normalize(turn_rewards, valid, group_ids, eps)
    advantages = _discounted_turn_sums(normalized, valid, gamma)  # [B, K]
    token_adv = advantages.gather(1, turn_index.clamp(min=0).long())  # [B, L]
    token_adv = torch.where(loss_mask.bool() & (turn_index >= 0), token_adv, torch.zeros_like(token_adv))
    non_final = valid & ~last
    stats["turns_mean"] = turns.to(rewards.dtype).mean()
    stats["gain_mean"] = masked_mean(turn_rewards, non_final) if bool(non_final.any()) else rewards.new_zeros(())
    return token_adv, stats


def _turn_rewards(
    rewards: torch.Tensor, gains: torch.Tensor, turns: torch.Tensor, fn: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`[B, K]` turn rewards (gains, then the outcome at each row's last turn; 0 past it), valid and last masks."""
    width = int(turns.max())
    if gains.dim() != 2 or gains.shape[0] != rewards.shape[0] or gains.shape[1] < width - 1:
        raise ValueError(f"{fn}: gains must be [B, >= {width - 1}] rows x turns, got {tuple(gains.shape)}")
    k = torch.arange(width, device=rewards.device).unsqueeze(0)  # [1, K]
    valid = k < turns.unsqueeze(1)  # [B, K]
    last = k == (turns - 1).unsqueeze(1)  # [B, K]
    turn_rewards = rewards.new_zeros(valid.shape)  # [B, K]
    if width > 1:
        turn_rewards[:, : width - 1] = gains[:, : width - 1].to(rewards.dtype)
    turn_rewards = torch.where(last, rewards.detach().unsqueeze(1), torch.where(valid, turn_rewards, 0.0))
    if not bool(torch.isfinite(turn_rewards).all()):
        raise ValueError(f"{fn}: gains contain NaN or inf at rows {_nonfinite_rows(turn_rewards.sum(dim=1))}")
    return turn_rewards, valid, last


def _discounted_turn_sums(normalized: torch.Tensor, valid: torch.Tensor, gamma: float) -> torch.Tensor:
    """`[B, K]` A_k = sum_{j >= k} gamma^(j - k) normalized_j over each row's valid turns, 0 past them."""
    advantages = torch.zeros_like(normalized)  # [B, K]
    carry = normalized.new_zeros(normalized.shape[0])  # [B] advantage of the next turn
    for t in reversed(range(normalized.shape[1])):
        carry = torch.where(valid[:, t], normalized[:, t] + gamma * carry, carry)
        advantages[:, t] = torch.where(valid[:, t], carry, torch.zeros_like(carry))
    return advantages


def _joint_group_normalize(
    values: torch.Tensor, valid: torch.Tensor, group_ids: torch.Tensor, eps: float
) -> tuple[torch.Tensor, Stats]:
    """`[B, K]` values z-scored over every valid entry of their row's group (population std); constant groups 0."""
    rows_group = group_ids.unsqueeze(1).expand(valid.shape)[valid]  # [N] group of each valid entry
    groups = _Groups(values[valid], rows_group)  # [N] entries as the "rewards" of _Groups
    n = groups.count[groups.index]
    population_std = groups.std[groups.index] * torch.sqrt((n - 1).clamp(min=0) / n)  # [N]; NaN-free for n >= 2
    std = torch.where(n < 2, torch.ones_like(n), population_std)
    flat = (values[valid] - groups.mean[groups.index]) / (std + eps)
    flat = torch.where(groups.constant[groups.index], torch.zeros_like(flat), flat)
    out = torch.zeros_like(values)
    out[valid] = flat
    return out, groups.stats()


# ---------------------------------------------------------------------------------------------
# The estimators by recipe name
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EstimatorInputs:
    """Everything an estimator may read; each one takes what it needs.

    Attributes:
        rewards: `[B]` outcome reward per trajectory (for sequence-level estimators the caller
            has already folded any KL penalty into it).
        loss_mask: `[B, L]` 1 at tokens trained on.
        group_ids: `[B]` prompt each trajectory answers.
        num_searches: `[B]` searches each trajectory made (stratified GRPO's strata).
        kl: `[B, L]` per-token KL for token-level estimators, None for no penalty.
        kl_coef: Weight of that per-token KL penalty.
        values: `[B, L]` critic values (GAE).
        gamma: Discount (REINFORCE++, GAE: per token; IGPO: per turn).
        lam: GAE lambda.
        stratified_alpha: Weight of the within-stratum term of stratified GRPO.
        gains: `[B, K]` IGPO's information gain of each non-final turn (`policy.infogain`).
        turn_index: `[B, L]` IGPO: turn of each response token, -1 at padding (`policy.infogain`).
    """

    rewards: torch.Tensor
    loss_mask: torch.Tensor
    group_ids: torch.Tensor
    num_searches: torch.Tensor
    kl: torch.Tensor | None = None
    kl_coef: float = 0.0
    values: torch.Tensor | None = None
    gamma: float = 1.0
    lam: float = 1.0
    stratified_alpha: float = 0.5
    gains: torch.Tensor | None = None
    turn_index: torch.Tensor | None = None


EstimatorOutput = tuple[torch.Tensor, torch.Tensor | None, Stats]
"""(advantages `[B]` or `[B, L]`, returns `[B, L]` for a critic to regress on or None, stats)."""


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator as a recipe names it.

    Attributes:
        compute: The estimator over `EstimatorInputs`.
        token_level: True: returns `[B, L]` and applies the per-token KL itself; False: returns
            `[B]`, which the caller spreads over the loss mask.
        compares_group: It compares the rollouts of one prompt, so it needs >= 2 per prompt.
        information_gain: It needs `EstimatorInputs.gains` and `turn_index`, which cost extra
            forward passes of the policy (`policy.infogain`); the trainer computes them first.
    """

    compute: Callable[[EstimatorInputs], EstimatorOutput]
    token_level: bool
    compares_group: bool
    information_gain: bool = False

    @property
    def flat_groups_are_silent(self) -> bool:
        """A group whose rewards are all equal gets advantage 0 everywhere: no policy gradient.

        True of the group-baseline estimators; not of those without one (a flat group still sits
        above or below a batch mean, a critic's values or nothing), nor of IGPO (its turns'
        information gains differ within a flat group). DAPO's dynamic sampling drops such groups.
        """
        return self.compares_group and not self.information_gain


def _sequence(advantages_and_stats: tuple[torch.Tensor, Stats]) -> EstimatorOutput:
    advantages, stats = advantages_and_stats
    return advantages, None, stats


def _grpo(x: EstimatorInputs) -> EstimatorOutput:
    return _sequence(grpo_advantages(x.rewards, x.group_ids))


def _dr_grpo(x: EstimatorInputs) -> EstimatorOutput:
    return _sequence(dr_grpo_advantages(x.rewards, x.group_ids))


def _reinforce(x: EstimatorInputs) -> EstimatorOutput:
    return _sequence(reinforce_advantages(x.rewards, batch_mean_baseline=False))


def _reinforce_baseline(x: EstimatorInputs) -> EstimatorOutput:
    return _sequence(reinforce_advantages(x.rewards, batch_mean_baseline=True))


def _rloo(x: EstimatorInputs) -> EstimatorOutput:
    return _sequence(rloo_advantages(x.rewards, x.group_ids))


def _stratified_grpo(x: EstimatorInputs) -> EstimatorOutput:
    return _sequence(stratified_grpo_advantages(x.rewards, x.group_ids, x.num_searches, x.stratified_alpha))


def _reinforce_pp(x: EstimatorInputs) -> EstimatorOutput:
    advantages, _, stats = reinforce_plus_plus_advantages(x.rewards, x.loss_mask, x.kl, x.kl_coef, x.gamma)
    return advantages, None, stats  # its returns train no critic


def _ppo(x: EstimatorInputs) -> EstimatorOutput:
    if x.values is None:
        raise ValueError("token_advantages: estimator 'ppo' needs the critic's values")
    return gae_advantages(x.rewards, x.values, x.loss_mask, x.gamma, x.lam, x.kl, x.kl_coef)


def _igpo(x: EstimatorInputs) -> EstimatorOutput:
    if x.gains is None or x.turn_index is None:
        raise ValueError("token_advantages: estimator 'igpo' needs the information gains (policy.infogain)")
    advantages, stats = igpo_advantages(x.rewards, x.gains, x.turn_index, x.loss_mask, x.group_ids, x.gamma)
    return advantages, None, stats


ESTIMATORS: dict[str, Estimator] = {
    "grpo": Estimator(_grpo, token_level=False, compares_group=True),
    "dr_grpo": Estimator(_dr_grpo, token_level=False, compares_group=True),
    "reinforce": Estimator(_reinforce, token_level=False, compares_group=False),
    "reinforce_baseline": Estimator(_reinforce_baseline, token_level=False, compares_group=False),
    "reinforce_pp": Estimator(_reinforce_pp, token_level=True, compares_group=False),
    "rloo": Estimator(_rloo, token_level=False, compares_group=True),
    "ppo": Estimator(_ppo, token_level=True, compares_group=False),  # GAE over a critic's values
    "stratified_grpo": Estimator(_stratified_grpo, token_level=False, compares_group=True),
    "igpo": Estimator(_igpo, token_level=True, compares_group=True, information_gain=True),
}
"""Every advantage estimator by its recipe name (`algorithm.estimator`)."""


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


class _Groups:
    """Per-group reductions of a `[B]` reward vector (G groups, in `torch.unique` order)."""

    def __init__(self, rewards: torch.Tensor, ids: torch.Tensor) -> None:
        _, index, count = torch.unique(ids, return_inverse=True, return_counts=True)
        num = count.numel()
        self.index = index  # [B] group of each row, in 0..G-1
        self.count = count.to(rewards.dtype)  # [G]
        self.sum = rewards.new_zeros(num).index_add_(0, index, rewards)  # [G]
        high = rewards.new_full((num,), -torch.inf)
        low = rewards.new_full((num,), torch.inf)
        high = high.scatter_reduce(0, index, rewards, reduce="amax")  # [G]
        low = low.scatter_reduce(0, index, rewards, reduce="amin")  # [G]
        self.constant = high == low  # [G] every reward of the group is the same
        # for constant groups take the exact value, so R - mean is exactly 0
        self.mean = torch.where(self.constant, high, self.sum / self.count)  # [G]
        squares = (rewards - self.mean[index]) ** 2  # [B]
        sq_sum = rewards.new_zeros(num).index_add_(0, index, squares)  # [G]
        self.std = torch.sqrt(sq_sum / (self.count - 1))  # [G] unbiased; NaN for singletons

    def stats(self) -> Stats:
        return {
            "num_groups": torch.tensor(float(self.count.numel())),
            "zero_std_groups": self.constant.sum().to(self.count.dtype),
        }


def _group_stats(rewards: torch.Tensor, ids: torch.Tensor, fn: str, min_size: int) -> _Groups:
    _check_rewards(rewards, fn)
    _check_ids(ids, rewards, "group_ids", fn)
    groups = _Groups(rewards.detach(), ids)
    smallest = int(groups.count.min().item())
    if smallest < min_size:
        bad = torch.unique(ids)[groups.count < min_size][:5].tolist()
        raise ValueError(
            f"{fn}: group(s) {bad} have fewer than {min_size} trajectories; a group-relative "
            "baseline needs several samples of the same prompt: set the rollout group size "
            f"(samples per prompt) to at least {min_size} and keep whole groups together"
        )
    return groups


def _token_rewards(
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    kl: torch.Tensor | None,
    kl_coef: float,
    fn: str,
) -> torch.Tensor:
    """`[B, L]` rewards: -kl_coef * kl at valid tokens, plus the outcome at the last valid one."""
    _check_rewards(rewards, fn)
    if loss_mask.dim() != 2 or loss_mask.shape[0] != rewards.shape[0]:
        raise ValueError(
            f"{fn}: loss_mask must be [B, L] with B = len(rewards) = {rewards.shape[0]}, got {tuple(loss_mask.shape)}"
        )
    valid = loss_mask.bool()
    empty = (~valid.any(dim=1)).nonzero().flatten()
    if empty.numel() > 0:
        raise ValueError(
            f"{fn}: row(s) {empty[:5].tolist()} have no valid token in loss_mask, so there is no "
            "token to put the outcome reward on; drop such trajectories before computing advantages"
        )
    if kl_coef < 0:
        raise ValueError(f"{fn}: kl_coef must be >= 0 (it is subtracted from the reward), got {kl_coef}")
    token_rewards = rewards.new_zeros(loss_mask.shape)  # [B, L]
    if kl_coef != 0.0:
        if kl is None:
            raise ValueError(f"{fn}: kl_coef={kl_coef} needs the per-token kl tensor [B, L]")
        _check_same_shape(kl, loss_mask, "kl", "loss_mask")
        penalty = -kl_coef * kl.detach().to(rewards.dtype)
        token_rewards = torch.where(valid, penalty, token_rewards)
    length = loss_mask.shape[1]
    # index of the last valid token: the first valid one when reading the row backwards
    last = length - 1 - valid.flip(dims=[1]).int().argmax(dim=1)  # [B]
    rows = torch.arange(rewards.shape[0], device=rewards.device)
    token_rewards[rows, last] += rewards.detach()
    return token_rewards


def _check_rewards(rewards: torch.Tensor, fn: str) -> None:
    if rewards.dim() != 1 or not rewards.is_floating_point():
        raise ValueError(
            f"{fn}: rewards must be a 1-D float tensor [B], got dtype {rewards.dtype} shape {tuple(rewards.shape)}"
        )
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError(f"{fn}: rewards contain NaN or inf at rows {_nonfinite_rows(rewards)}")


def _check_ids(ids: torch.Tensor, rewards: torch.Tensor, name: str, fn: str) -> None:
    if ids.dim() != 1 or ids.shape[0] != rewards.shape[0]:
        raise ValueError(
            f"{fn}: {name} must be [B] with B = len(rewards) = {rewards.shape[0]}, got shape {tuple(ids.shape)}"
        )
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"{fn}: {name} must be an integer tensor, got {ids.dtype}")


def _check_same_shape(a: torch.Tensor, b: torch.Tensor, name_a: str, name_b: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{name_a} and {name_b} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")


def _nonfinite_rows(x: torch.Tensor) -> list[int]:
    return (~torch.isfinite(x)).nonzero().flatten()[:5].tolist()
