"""Grouped-query decoding under a padding mask without copying keys and values.

transformers before 5.23, given an attention mask (a left-padded batch always has one), copies
each key/value head to every query head that shares it (`repeat_kv`) on every layer of every
decode step. `packed_sdpa` attends one query token per row on the key/value heads themselves,
the query heads of a group stacked as that head's query rows; every other call goes to
transformers' `sdpa` unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations import sdpa_attention
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

PACKED_SDPA = "simsearch_packed_sdpa"


def packed_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, heads, Q, D]
    key: torch.Tensor,  # [B, kv_heads, T, D]
    value: torch.Tensor,  # [B, kv_heads, T, D]
    attention_mask: torch.Tensor | None,  # [B, 1, Q, T] or None
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention as transformers' `sdpa` computes it: [B, Q, heads, D] and no weights, as it returns."""
    groups = getattr(module, "num_key_value_groups", 1)
    one_masked_query = query.shape[2] == 1 and attention_mask is not None and attention_mask.shape[1] == 1
    plain = kwargs.get("dropout", 0.0) == 0.0 and kwargs.get("position_bias") is None and not kwargs.get("softcap")
    if groups == 1 or not one_masked_query or not plain or torch.compiler.is_compiling():
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    batch, heads, _, dim = query.shape
    # Query head h reads key/value head h // groups (repeat_kv's order): group g's heads become its rows.
    stacked = query.reshape(batch, heads // groups, groups, dim)
    out = torch.nn.functional.scaled_dot_product_attention(
        stacked, key, value, attn_mask=attention_mask, scale=kwargs.get("scaling")
    )  # [B, kv_heads, groups, D]
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(PACKED_SDPA, packed_sdpa)
AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)


def needs_packing(model: PreTrainedModel) -> bool:
    """Whether `model` attends with sdpa over grouped key/value heads under a transformers that copies them."""
    config = model.config
    kv_heads = getattr(config, "num_key_value_heads", None)  # absent where every head has its own keys
    grouped = kv_heads is not None and kv_heads < config.num_attention_heads
    own_packing = hasattr(sdpa_attention, "pack_gqa")  # transformers 5.23 and later pack decode queries themselves
    return config._attn_implementation == "sdpa" and grouped and not own_packing


def pack_decode_queries(model: PreTrainedModel) -> None:
    """Switch `model` to `packed_sdpa` where `needs_packing(model)`; same outputs, less memory traffic."""
    if needs_packing(model):
        model.config._attn_implementation = PACKED_SDPA
