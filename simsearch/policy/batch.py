"""From trajectories to training tensors, and the per-batch pieces of the RL update.

Everything here is a pure function of its arguments (a model counts as an argument): no I/O,
no logging, no global state. `commands/train.py` wires them together.

Layout of a batch (`collate_trajectories`): every row is one trajectory, its prompt
**left**-padded to the batch's longest prompt P and its response **right**-padded to the longest
response L, so `input_ids` is `[B, T]` with T = P + L and response token j of every row sits at
column P + j. Response-aligned tensors (`responses`, `loss_mask`, log-probs, advantages, values)
are `[B, L]`, and the logits that predict the responses are the contiguous slice
`logits[:, P - 1 : T - 1]`, which the forward asks for with `logits_to_keep = L + 1`, so no
logits are computed over the prompt. Position ids count real tokens only, so a padded row sees
exactly what it would see alone (as `generation.hf` does at generation time).

`TrainBatch.select` takes rows for a micro-batch and trims the padding those rows do not need
(left columns that are padding in every selected row, right columns past their longest
response); response-aligned tensors of the micro-batch are the batch's `[rows, :L']`.

Departures from verl (the reference the published systems ran on):

- verl pads responses to the configured maximum length; we pad to the batch's longest (and trim
  again per micro-batch, whose rows are sorted by length), which is what makes CPU runs affordable.
- With `kl_in_reward`, sequence-level estimators (GRPO, RLOO, ...) see the reward minus
  kl_coef x the sum of the per-token KL over the response, the same total verl's token-level
  rewards sum to; token-level estimators (REINFORCE++, GAE) take the per-token KL directly.
- Token-level estimators cannot put an outcome reward on a response without a trained token
  (possible in self-search, when the policy's whole output is its own information block); such
  rows get advantage 0 here instead of an error.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
from torch import nn

from simsearch.policy.advantages import ESTIMATORS, EstimatorInputs, Stats, broadcast_to_tokens, masked_sum
from simsearch.policy.losses import (
    KLEstimator,
    LossAggregation,
    entropy_from_logits,
    kl_loss,
    kl_penalty,
    policy_loss,
    token_logprobs,
)
from simsearch.types import OVER_TURN, Trajectory

# --------------------------------------------------------------------------- data order


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The permutation of `n` examples that epoch `epoch` visits, seeded by (seed, epoch)."""
    order = list(range(n))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def stream_indices(n: int, start: int, count: int, seed: int) -> list[int]:
    """Example indices at positions [start, start + count) of an endless stream of epochs.

    Position p is example `epoch_order(n, seed, p // n)[p % n]`, so a run that saved its
    position resumes the exact same order, across epoch boundaries too.

    Args:
        n: Number of examples (> 0).
        start: First stream position (>= 0).
        count: How many positions.
        seed: The run's seed.

    Returns:
        `count` indices into the example list.
    """
    if n < 1 or start < 0 or count < 0:
        raise ValueError(f"stream_indices needs n >= 1, start >= 0, count >= 0; got {n}, {start}, {count}")
    orders: dict[int, list[int]] = {}
    out = []
    for position in range(start, start + count):
        epoch = position // n
        if epoch not in orders:
            orders[epoch] = epoch_order(n, seed, epoch)
        out.append(orders[epoch][position % n])
    return out


def rank_share(count: int, rank: int, world_size: int) -> slice:
    """The contiguous share of `count` items that rank `rank` of `world_size` takes.

    Raises:
        ValueError: `count` is not a multiple of `world_size` (ranks must hold equal shares:
            DeepSpeed steps every rank through the same number of forward passes).
    """
    if count % world_size:
        raise ValueError(
            f"{count} prompts per step cannot be split evenly over {world_size} processes; set "
            f"prompts_per_step to a multiple of {world_size}"
        )
    size = count // world_size
    return slice(rank * size, (rank + 1) * size)


# --------------------------------------------------------------------------- batch


@dataclass
class TrainBatch:
    """Trajectories as padded tensors (see the module docstring for the layout).

    Attributes:
        input_ids: `[B, T]` left-padded prompt, then right-padded response.
        attention_mask: `[B, T]` 1 at real tokens.
        position_ids: `[B, T]` position of each real token within its own row.
        responses: `[B, L]` response token ids (pad id past each response's end).
        loss_mask: `[B, L]` 1 at tokens the policy generated and is trained on.
        prompt_lens: `[B]` prompt tokens per row.
        response_lens: `[B]` response tokens per row.
        group_ids: `[B]` prompt each trajectory answers (GRPO's groups).
        num_searches: `[B]` searches each trajectory made (stratified GRPO's strata).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    responses: torch.Tensor
    loss_mask: torch.Tensor
    prompt_lens: torch.Tensor
    response_lens: torch.Tensor
    group_ids: torch.Tensor
    num_searches: torch.Tensor

    @property
    def size(self) -> int:
        """Rows B."""
        return self.input_ids.shape[0]

    @property
    def response_width(self) -> int:
        """L, the response columns."""
        return self.responses.shape[1]

    def to(self, device: torch.device | str) -> TrainBatch:
        """The batch on `device`."""
        return TrainBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def select(self, rows: torch.Tensor) -> TrainBatch:
        """Rows `rows` (a 1-D index tensor), with padding no selected row needs trimmed."""
        width = self.input_ids.shape[1] - self.response_width  # P
        prompt = int(self.prompt_lens[rows].max())
        response = int(self.response_lens[rows].max())
        cols = slice(width - prompt, width + response)
        return TrainBatch(
            input_ids=self.input_ids[rows, cols],
            attention_mask=self.attention_mask[rows, cols],
            position_ids=self.position_ids[rows, cols],
            responses=self.responses[rows, :response],
            loss_mask=self.loss_mask[rows, :response],
            prompt_lens=self.prompt_lens[rows],
            response_lens=self.response_lens[rows],
            group_ids=self.group_ids[rows],
            num_searches=self.num_searches[rows],
        )


def collate_trajectories(
    trajectories: Sequence[Trajectory], pad_id: int, *, mask_unfinished: bool = False, mask_gave_up: bool = False
) -> TrainBatch:
    """Pads trajectories into a `TrainBatch` (left-padded prompts, right-padded responses).

    With `mask_unfinished` (Mini-o3's over-turn masking, Lai et al. 2025) a trajectory whose
    finish is in `types.OVER_TURN` (no answer: the turns or the context ran out while it was still
    searching), and with `mask_gave_up` also one that finished "gave_up", gets loss mask 0 on
    every token, so it is left out of the loss, of its denominators, of the KL and entropy terms
    and of the critic's loss, instead of being trained on its reward (0 without an answer). Its row
    stays in the batch with its reward: sequence-level estimators (GRPO, RLOO,
    ...) still count it in its group's statistics, as Mini-o3's trainer does (its
    `compute_grpo_outcome_advantage` keeps over-turn rows in the group mean and std, the skip is
    commented out; its actor zeroes their `response_mask`, `verl/workers/actor/dp_actor.py`);
    token-level estimators (REINFORCE++, GAE) whiten over trained tokens and no longer see it.

    Args:
        trajectories: Finished trajectories; `prompt_id` becomes the group id.
        pad_id: Token id written at padded positions (any id works: they are masked).
        mask_unfinished: Zero the loss mask of over-turn trajectories.
        mask_gave_up: With `mask_unfinished`, zero that of give-ups too.

    Returns:
        The batch on CPU.
    """
    if not trajectories:
        raise ValueError("collate_trajectories got no trajectories")
    width = max(len(t.prompt_ids) for t in trajectories)  # P
    length = max(len(t.response_ids) for t in trajectories)  # L
    rows = len(trajectories)
    masked = (OVER_TURN | {"gave_up"} if mask_gave_up else OVER_TURN) if mask_unfinished else frozenset()
    input_ids = torch.full((rows, width + length), pad_id, dtype=torch.long)  # [B, T]
    attention_mask = torch.zeros((rows, width + length), dtype=torch.long)  # [B, T]
    responses = torch.full((rows, length), pad_id, dtype=torch.long)  # [B, L]
    loss_mask = torch.zeros((rows, length), dtype=torch.long)  # [B, L]
    for b, t in enumerate(trajectories):
        if len(t.loss_mask) != len(t.response_ids):
            raise ValueError(
                f"trajectory {b}: loss_mask has {len(t.loss_mask)} entries for {len(t.response_ids)} response tokens"
            )
        p, r = len(t.prompt_ids), len(t.response_ids)
        input_ids[b, width - p : width] = torch.tensor(t.prompt_ids)
        input_ids[b, width : width + r] = torch.tensor(t.response_ids, dtype=torch.long)
        attention_mask[b, width - p : width + r] = 1
        responses[b, :r] = torch.tensor(t.response_ids, dtype=torch.long)
        if t.finish not in masked:
            loss_mask[b, :r] = torch.tensor(t.loss_mask, dtype=torch.long)
    # Right padding repeats the last position; it is never attended to by a real token.
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, T]
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        responses=responses,
        loss_mask=loss_mask,
        prompt_lens=torch.tensor([len(t.prompt_ids) for t in trajectories]),
        response_lens=torch.tensor([len(t.response_ids) for t in trajectories]),
        group_ids=torch.tensor([t.prompt_id for t in trajectories]),
        num_searches=torch.tensor([t.num_searches for t in trajectories]),
    )


def collate_rollout_logprobs(trajectories: Sequence[Trajectory]) -> torch.Tensor:
    """`[B, L]` log-probs the rollout engine reported, in `collate_trajectories`' response columns.

    A trajectory's `logprobs` already run along its `response_ids` (every generated span in
    place, 0.0 at inserted tokens), so response token j lands in column j, as in `responses`.
    Positions outside the loss mask are set to 0 too (self-search's own `<information>` blocks
    carry real log-probs but are not trained on), matching `logprobs_in_micro_batches`.

    Args:
        trajectories: The batch's trajectories, in its row order, rolled out with
            `SamplingParams(logprobs=True)`.

    Returns:
        `[B, L]` float32 on CPU, L the longest response; 0 at padding and untrained tokens.

    Raises:
        ValueError: A trajectory has no log-probs, or not one per response token.
    """
    if not trajectories:
        raise ValueError("collate_rollout_logprobs got no trajectories")
    length = max(len(t.response_ids) for t in trajectories)  # L, as collate_trajectories pads
    out = torch.zeros((len(trajectories), length), dtype=torch.float32)  # [B, L]
    for b, t in enumerate(trajectories):
        if t.logprobs is None:
            raise ValueError(f"trajectory {b} has no rollout log-probs: roll out with SamplingParams(logprobs=True)")
        if len(t.logprobs) != len(t.response_ids) or len(t.loss_mask) != len(t.response_ids):
            raise ValueError(
                f"trajectory {b}: {len(t.logprobs)} log-probs and {len(t.loss_mask)} loss-mask entries "
                f"for {len(t.response_ids)} response tokens"
            )
        logp = torch.tensor(t.logprobs, dtype=torch.float32)
        out[b, : len(t.logprobs)] = torch.where(torch.tensor(t.loss_mask).bool(), logp, 0.0)
    return out


def micro_batches(rows: torch.Tensor, lengths: torch.Tensor, size: int) -> list[torch.Tensor]:
    """Splits `rows` into chunks of at most `size`, rows of similar length together.

    Sorting by length before chunking keeps the padding of each micro-batch small; the summed
    gradient of a minibatch does not depend on how its rows are chunked.

    Args:
        rows: `[N]` row indices of one minibatch.
        lengths: `[B]` sequence length of every row of the batch (indexed by `rows`).
        size: Most rows per chunk (>= 1).

    Returns:
        ceil(N / size) index tensors (none for no rows).
    """
    if size < 1:
        raise ValueError(f"micro-batch size must be >= 1, got {size}")
    if rows.numel() == 0:  # every row skipped: nothing to run
        return []
    ordered = rows[torch.argsort(lengths[rows], descending=True, stable=True)]
    return list(ordered.split(size))


def rows_with_signal(advantages: torch.Tensor) -> torch.Tensor:
    """`[B]` True at rows with a non-zero advantage; the others may skip the update's forward/backward."""
    return advantages.ne(0).any(dim=-1)


def pad_micro_batches(
    micros: list[torch.Tensor], spare_rows: torch.Tensor, lengths: torch.Tensor, count: int
) -> list[torch.Tensor]:
    """`micros` topped up to `count` micro-batches with one spare row each, shortest rows first.

    Under DeepSpeed every process must run as many forward/backward passes per optimizer step;
    spare rows are rows that skip the update (`rows_with_signal` False), whose loss and gradient
    are exactly 0 where skipping is allowed, so the extra passes change nothing but the count.

    Args:
        micros: The minibatch's micro-batches (`micro_batches` of its kept rows).
        spare_rows: `[S]` the minibatch's skipped rows.
        lengths: `[B]` sequence length of every row of the batch.
        count: Micro-batches wanted (>= len(micros)).

    Raises:
        ValueError: Fewer spare rows than missing micro-batches.
    """
    missing = count - len(micros)
    if missing <= 0:
        return micros
    if missing > spare_rows.numel():
        raise ValueError(f"{count} micro-batches wanted from {len(micros)} and {spare_rows.numel()} spare rows")
    shortest = spare_rows[torch.argsort(lengths[spare_rows], stable=True)]
    return micros + list(shortest[:missing].split(1))


def minibatches(num_rows: int, minibatch_size: int, generator: torch.Generator | None) -> list[torch.Tensor]:
    """Row indices of each minibatch of one PPO epoch (shuffled when there are several).

    Args:
        num_rows: Rows of the batch.
        minibatch_size: Rows per optimizer step; 0 means the whole batch in one step.
        generator: Shuffles the rows when there is more than one minibatch.

    Returns:
        Index tensors of `minibatch_size` rows each.
    """
    if minibatch_size == 0 or minibatch_size >= num_rows:
        return [torch.arange(num_rows)]
    if num_rows % minibatch_size:
        raise ValueError(f"minibatch size {minibatch_size} must divide the batch's {num_rows} rows")
    return list(torch.randperm(num_rows, generator=generator).split(minibatch_size))


def loss_denominators(loss_mask: torch.Tensor) -> tuple[float, float]:
    """(valid tokens, sequences with a valid token) of a minibatch's `[N, L]` loss mask.

    Each micro-batch loss divides by these whole-minibatch counts, so the micro-batch losses
    sum to the minibatch loss (`losses.aggregate_loss`'s `denominator`).
    """
    valid = loss_mask.bool()
    return max(float(valid.sum()), 1.0), max(float(valid.any(dim=-1).sum()), 1.0)


# --------------------------------------------------------------------------- forward passes


def response_logits(model: nn.Module, batch: TrainBatch) -> torch.Tensor:
    """`[B, L, V]` logits predicting each response token (computed for those positions only).

    Args:
        model: A causal LM (transformers, PEFT or a DeepSpeed engine around one) that accepts
            `position_ids` and `logits_to_keep`.
        batch: The rows to run.
    """
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
        logits_to_keep=batch.response_width + 1,
    )
    return out.logits[:, :-1]  # [B, L, V]: position P + j - 1 predicts response token j


@torch.no_grad()
def logprobs_in_micro_batches(
    model: nn.Module, batch: TrainBatch, micro_batch_size: int, temperature: float = 1.0
) -> torch.Tensor:
    """`[B, L]` log-probs of the response tokens under `model`, without gradient, 0 at padding.

    Used for the old policy (before an update) and the frozen reference, at the rollout's
    sampling `temperature` (as the update's current log-probs, `ActorLossSettings.temperature`).
    Runs the rows in length-sorted micro-batches of at most `micro_batch_size`.
    """
    out = torch.zeros(batch.loss_mask.shape, dtype=torch.float32, device=batch.input_ids.device)
    lengths = batch.prompt_lens + batch.response_lens
    for rows in micro_batches(torch.arange(batch.size, device=lengths.device), lengths, micro_batch_size):
        micro = batch.select(rows)
        logp = token_logprobs(response_logits(model, micro), micro.responses, temperature=temperature)  # [b, L']
        out[rows, : micro.response_width] = torch.where(micro.loss_mask.bool(), logp.float(), 0.0)
    return out


class ValueModel(nn.Module):
    """PPO's critic: a copy of the policy's transformer backbone with a scalar head.

    V_t is read at the position that predicts response token t (the state the token was
    generated from), as verl's critic does. The head starts at zero, so the first values are 0.

    Args:
        backbone: The transformer without its LM head (e.g. `AutoModelForCausalLM(...).base_model`),
            returning `last_hidden_state`.
        hidden_size: Width of its hidden states.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, response_width: int
    ) -> torch.Tensor:
        """`[B, L]` values at the positions predicting the `response_width` last columns."""
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state  # [B, T, H]
        width = input_ids.shape[1]
        states = hidden[:, width - response_width - 1 : width - 1]  # [B, L, H]
        return self.head(states.to(self.head.weight.dtype)).squeeze(-1).float()


def values_of(critic: nn.Module, batch: TrainBatch) -> torch.Tensor:
    """`[B, L]` critic values of a (micro-)batch, with gradient."""
    return critic(batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_width)


@torch.no_grad()
def values_in_micro_batches(critic: nn.Module, batch: TrainBatch, micro_batch_size: int) -> torch.Tensor:
    """`[B, L]` critic values without gradient, 0 at padding, in length-sorted micro-batches."""
    out = torch.zeros(batch.loss_mask.shape, dtype=torch.float32, device=batch.input_ids.device)
    lengths = batch.prompt_lens + batch.response_lens
    for rows in micro_batches(torch.arange(batch.size, device=lengths.device), lengths, micro_batch_size):
        micro = batch.select(rows)
        out[rows, : micro.response_width] = torch.where(micro.loss_mask.bool(), values_of(critic, micro), 0.0)
    return out


# --------------------------------------------------------------------------- advantages


def token_advantages(
    estimator: str,
    rewards: torch.Tensor,
    batch: TrainBatch,
    *,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    stratified_alpha: float = 0.5,
) -> tuple[torch.Tensor, torch.Tensor | None, Stats]:
    """`[B, L]` advantages of the estimator a recipe names (the one place that dispatches on it).

    Args:
        estimator: A name in `advantages.ESTIMATORS`.
        rewards: `[B]` outcome reward per trajectory.
        batch: The trajectories (loss mask, groups, search counts).
        kl: `[B, L]` per-token KL to the reference, folded into the reward when `kl_coef` > 0
            (`kl_in_reward`); see the module docstring for sequence-level estimators.
        kl_coef: Weight of that KL penalty (0 = no KL in the reward).
        values: `[B, L]` critic values; required by "ppo".
        gamma: Discount of REINFORCE++ and GAE.
        lam: GAE lambda.
        stratified_alpha: Weight of the within-stratum term of stratified GRPO.

    Returns:
        (advantages `[B, L]` with 0 at masked positions, returns `[B, L]` for "ppo" else None,
        stats).
    """
    spec = ESTIMATORS.get(estimator)
    if spec is None:
        raise ValueError(f"unknown advantage estimator {estimator!r}; use one of {', '.join(ESTIMATORS)}")
    mask = batch.loss_mask
    rewards = rewards.to(torch.float32)
    if spec.token_level:
        rows = mask.bool().any(dim=-1).nonzero().flatten()  # rows with a token to carry the outcome
        adv, returns, stats = spec.compute(
            EstimatorInputs(
                rewards[rows], mask[rows], batch.group_ids[rows], batch.num_searches[rows],
                kl=None if kl is None else kl[rows], kl_coef=kl_coef,
                values=None if values is None else values[rows], gamma=gamma, lam=lam,
            )
        )  # fmt: skip
        advantages = torch.zeros(mask.shape, dtype=torch.float32)
        advantages[rows] = adv
        if returns is None:
            return advantages, None, stats
        full_returns = torch.zeros(mask.shape, dtype=torch.float32)
        full_returns[rows] = returns
        return advantages, full_returns, stats

    if kl_coef > 0:
        if kl is None:
            raise ValueError(f"token_advantages: kl_coef={kl_coef} needs the per-token kl [B, L]")
        rewards = rewards - kl_coef * masked_sum(kl.detach(), mask, dim=-1)
    seq, _, stats = spec.compute(
        EstimatorInputs(rewards, mask, batch.group_ids, batch.num_searches, stratified_alpha=stratified_alpha)
    )
    return broadcast_to_tokens(seq, mask), None, stats


# --------------------------------------------------------------------------- the actor loss


@dataclass(frozen=True)
class ActorLossSettings:
    """What the actor loss of one micro-batch needs beside the tensors (from the recipe).

    Attributes:
        clip_low: PPO ratio clip below 1.
        clip_high: PPO ratio clip above 1.
        aggregation: How per-token losses become a scalar (`losses.aggregate_loss`).
        token_sum_normalizer: The constant of "seq-mean-token-sum-norm" (None otherwise).
        kl_coef: Weight of the KL loss term (0 when KL is off or folded into the reward).
        kl_estimator: A name of `losses.KL_ESTIMATORS`.
        entropy_coef: Weight of the entropy bonus (the entropy is computed for logging anyway).
        temperature: The rollout's sampling temperature: log-probs and entropy are those of
            softmax(logits / temperature), the distribution the tokens were drawn from (verl).
        clip_ratio_c: Dual-clip bound of the ratio at negative advantages (> 1), or 0 for none.
        ratio_level: A name in `losses.RATIO_LEVELS`: "token" (PPO, GRPO) or "sequence" (GSPO).
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    aggregation: LossAggregation = "token-mean"
    token_sum_normalizer: float | None = None
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    entropy_coef: float = 0.0
    temperature: float = 1.0
    clip_ratio_c: float = 0.0
    ratio_level: str = "token"


def actor_micro_loss(
    logits: torch.Tensor,
    micro: TrainBatch,
    advantages: torch.Tensor,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor | None,
    settings: ActorLossSettings,
    denominators: tuple[float, float],
) -> tuple[torch.Tensor, dict[str, float]]:
    """The actor loss of one micro-batch: clipped policy loss + kl_coef x KL - entropy_coef x H.

    The micro-batch holds whole rows, so GSPO's sequence ratios (`settings.ratio_level`) are exact.

    Args:
        logits: `[b, L', V]` `response_logits` of the micro-batch (with grad).
        micro: The micro-batch.
        advantages: `[b, L']` token advantages.
        old_logp: `[b, L']` log-probs of the sampling policy; None = on-policy, the current
            log-probs detached (one update per batch: the weights have not moved since sampling).
        ref_logp: `[b, L']` reference log-probs; required when `settings.kl_coef` > 0, and used
            for the logged KL whenever given.
        settings: Clip range, aggregation and coefficients.
        denominators: (valid tokens, sequences) of the whole minibatch (`loss_denominators`).

    Returns:
        The scalar loss to backpropagate, and float stats `policy`, `kl`, `entropy`,
        `clipfrac`, `clipfrac_lower`, `approx_kl`, `tokens` (micro-batch loss parts are already divided by the
        minibatch's counts, so they sum over micro-batches; the rest are micro-batch means).
    """
    mask = micro.loss_mask
    logp = token_logprobs(logits, micro.responses, temperature=settings.temperature)  # [b, L']
    old = logp.detach() if old_logp is None else old_logp
    tokens, sequences = denominators
    denominator = tokens if settings.aggregation == "token-mean" else sequences
    loss, pstats = policy_loss(
        logp, old, advantages, mask, settings.clip_low, settings.clip_high,
        settings.aggregation, denominator, settings.token_sum_normalizer, settings.clip_ratio_c, settings.ratio_level,
    )  # fmt: skip
    stats = {
        "policy": float(loss.detach()),
        "clipfrac": float(pstats["clipfrac"]),
        "clipfrac_lower": float(pstats["clipfrac_lower"]),
        "approx_kl": float(pstats["approx_kl"]),
        "tokens": float(mask.sum()),
    }
    if ref_logp is not None:
        kl, _ = kl_loss(
            logp, ref_logp, mask, settings.kl_estimator, settings.aggregation, denominator,
            settings.token_sum_normalizer,
        )  # fmt: skip
        stats["kl"] = float(kl.detach())
        if settings.kl_coef > 0:
            loss = loss + settings.kl_coef * kl
    elif settings.kl_coef > 0:
        raise ValueError(f"actor_micro_loss: kl_coef={settings.kl_coef} needs ref_logp")
    valid = mask.bool()
    if settings.entropy_coef > 0:
        entropy = masked_sum(entropy_from_logits(logits, temperature=settings.temperature), valid) / tokens
        loss = loss - settings.entropy_coef * entropy
        stats["entropy"] = float(entropy.detach())
    else:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach(), temperature=settings.temperature)
            stats["entropy"] = float(masked_sum(entropy, valid) / tokens)
    return loss, stats


def sequence_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """`[B, L]` per-token KL estimate, 0 at masked positions (for `kl_in_reward`)."""
    kl = kl_penalty(logp, ref_logp, estimator)
    return torch.where(mask.bool(), kl, torch.zeros_like(kl))
