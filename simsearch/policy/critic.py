"""PPO's critic: a value head on the policy's backbone, and its values over a batch."""

from __future__ import annotations

import torch
from torch import nn

from simsearch.policy.collate import TrainBatch, micro_batches


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
