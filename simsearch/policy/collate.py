"""Trajectories as padded training tensors, cut into minibatches and micro-batches.

Layout (`collate_trajectories`): every row is one trajectory, its prompt **left**-padded to the
batch's longest prompt P and its response **right**-padded to the longest response L, so
`input_ids` is `[B, T]` with T = P + L and response token j of every row sits at column P + j.
Response-aligned tensors (`responses`, `loss_mask`, log-probs, advantages, values) are `[B, L]`;
the logits predicting the responses are `logits[:, P - 1 : T - 1]` (`logits_to_keep = L + 1`).
Position ids count real tokens only, so a padded row sees what it would see alone.
`TrainBatch.select` takes rows and trims the padding those rows do not need.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
from torch import nn

from simsearch.policy.losses import token_logprobs
from simsearch.types import OVER_TURN, Trajectory


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

    With `mask_unfinished` (Mini-o3's over-turn masking) a trajectory whose finish is in
    `types.OVER_TURN`, and with `mask_gave_up` also one that finished "gave_up", gets loss mask 0
    on every token: it leaves the loss and its denominators, but its row and reward stay in the
    batch, so sequence-level estimators still count it in its group's statistics.

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
    sampling `temperature` (as the update's current log-probs, `actor_loss.actor_micro_loss`'s `temperature`).
    Runs the rows in length-sorted micro-batches of at most `micro_batch_size`.
    """
    out = torch.zeros(batch.loss_mask.shape, dtype=torch.float32, device=batch.input_ids.device)
    lengths = batch.prompt_lens + batch.response_lens
    for rows in micro_batches(torch.arange(batch.size, device=lengths.device), lengths, micro_batch_size):
        micro = batch.select(rows)
        logp = token_logprobs(response_logits(model, micro), micro.responses, temperature=temperature)  # [b, L']
        out[rows, : micro.response_width] = torch.where(micro.loss_mask.bool(), logp.float(), 0.0)
    return out
