"""packed_sdpa: one masked query a row attended on the key/value heads, equal to transformers' sdpa."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.integrations import sdpa_attention

from simsearch.generation import attention
from simsearch.generation.attention import PACKED_SDPA, needs_packing, pack_decode_queries, packed_sdpa
from simsearch.generation.hf import HFEngine
from simsearch.models import build_tiny_model, train_tokenizer
from simsearch.types import SamplingParams


class Grouped(torch.nn.Module):
    """What packed_sdpa reads of an attention module: how many query heads share a key/value head."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def reference(query, key, value, mask):
    """Attention with each key/value head copied to its query heads: query head h reads kv head h // groups."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = query @ key.transpose(-1, -2) / query.shape[-1] ** 0.5  # [B, H, 1, T]
    scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ value).transpose(1, 2)  # [B, 1, H, D]


def test_one_masked_query_attends_each_query_head_on_its_own_key_value_head():
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(3, 6, 1, 8, generator=generator)  # 6 query heads on 2 key/value heads
    key, value = torch.randn(2, 3, 2, 5, 8, generator=generator)
    mask = torch.ones(3, 1, 1, 5, dtype=torch.bool)
    mask[0, ..., :2] = False  # row 0 left-padded by 2, row 1 by 1
    mask[1, ..., :1] = False
    out, weights = packed_sdpa(Grouped(3), query, key, value, mask, scaling=8**-0.5)
    assert weights is None and out.shape == (3, 1, 6, 8)
    torch.testing.assert_close(out, reference(query, key, value, mask), rtol=1e-5, atol=1e-6)
    # The padding counts: unmasked, row 0 would read its two padded keys and come out otherwise.
    unmasked, _ = packed_sdpa(Grouped(3), query, key, value, torch.ones_like(mask), scaling=8**-0.5)
    assert not torch.allclose(unmasked[0], out[0], atol=1e-3)
    torch.testing.assert_close(unmasked[2], out[2])


def test_every_other_call_is_transformers_sdpa_unchanged():
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(2, 4, 3, 8, generator=generator)  # three query tokens: a prefill
    key, value = torch.randn(2, 2, 2, 3, 8, generator=generator)
    mask = torch.ones(2, 1, 3, 3, dtype=torch.bool).tril()
    ours, _ = packed_sdpa(Grouped(2), query, key, value, mask, scaling=0.3)
    theirs, _ = sdpa_attention.sdpa_attention_forward(Grouped(2), query, key, value, mask, scaling=0.3)
    assert torch.equal(ours, theirs)


@pytest.fixture(scope="module")
def tokenizer():
    rng = random.Random(0)
    words = ["Alma", "Varn", "Oslo", "founded", "born", "answer", "the", "is", "1987", "was", "in"]
    texts = [" ".join(rng.choices(words, k=rng.randint(5, 14))) for _ in range(300)]
    return train_tokenizer(texts, vocab_size=300)


def test_packing_is_switched_on_only_for_grouped_sdpa_under_a_transformers_that_copies(tokenizer, monkeypatch):
    grouped = build_tiny_model(tokenizer, hidden=32, layers=1, heads=4, kv_heads=2, ffn=64)
    ungrouped = build_tiny_model(tokenizer, hidden=32, layers=1, heads=4, kv_heads=4, ffn=64)
    grouped.config._attn_implementation = ungrouped.config._attn_implementation = "sdpa"
    monkeypatch.delattr(sdpa_attention, "pack_gqa", raising=False)  # a transformers before 5.23
    assert needs_packing(grouped) and not needs_packing(ungrouped)
    grouped.config._attn_implementation = "eager"
    assert not needs_packing(grouped)  # a choice of the user's is left alone
    grouped.config._attn_implementation = "sdpa"
    monkeypatch.setattr(sdpa_attention, "pack_gqa", lambda states, groups: states, raising=False)  # 5.23 on
    assert not needs_packing(grouped)


def test_an_engine_decodes_ragged_prompts_packed_to_the_same_tokens_and_saves_no_trace_of_it(
    tokenizer, monkeypatch, tmp_path
):
    model = build_tiny_model(tokenizer, hidden=64, layers=2, heads=4, kv_heads=2, ffn=128)
    model.config._attn_implementation = "sdpa"
    prompts = [tokenizer.encode(text) for text in ("Alma Varn was born in", "the answer is", "Oslo")]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    monkeypatch.setattr(attention, "needs_packing", lambda model: False)
    stock = [c.token_ids for c in HFEngine(model, tokenizer, prefix_cache=False).generate(prompts, greedy)]
    assert model.config._attn_implementation == "sdpa"
    monkeypatch.setattr(attention, "needs_packing", lambda model: True)
    packed = HFEngine(model, tokenizer, prefix_cache=False)
    assert model.config._attn_implementation == PACKED_SDPA
    sdpa, query_shapes = torch.nn.functional.scaled_dot_product_attention, []

    def recording(query, *args, **kwargs):
        query_shapes.append(tuple(query.shape))
        return sdpa(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    assert [c.token_ids for c in packed.generate(prompts, greedy)] == stock
    assert (3, 2, 2, 16) in query_shapes  # decode steps: 3 rows, 2 key/value heads, 2 query heads on each
    model.save_pretrained(tmp_path)
    assert PACKED_SDPA not in (tmp_path / "config.json").read_text()
    assert AutoModelForCausalLM.from_pretrained(tmp_path).config._attn_implementation != PACKED_SDPA
    monkeypatch.undo()
    pack_decode_queries(model)  # a second engine on a packed model leaves it packed
    assert model.config._attn_implementation == PACKED_SDPA
