"""What a padding mask costs a decode step of a grouped-query model, with and without packed queries.

Run:  python -m benchmarks.masked_decode [--layers 4] [--batch 40] [--contexts 300 1100]
          [--rollout-context 1100] [--steps 12] [--threads 1] [--device cpu]

A Qwen2 with Qwen2.5-0.5B's layer shape (hidden 896, 14 query heads on 2 key/value heads, FFN
4864; `--layers` of them, random weights; bf16 on a GPU, float32 on the CPU) decodes `--steps`
greedy tokens after `--batch` prompts of each context length, three ways, side by side:

- even:   every prompt `--contexts` tokens long: no padding, so transformers passes no mask;
- ragged: prompt lengths spread over 40 tokens below it, left-padded: a mask on every step,
          under transformers' own `sdpa`;
- packed: the same ragged batch under `simsearch.generation.attention.packed_sdpa`, which
          HFEngine switches on where the installed transformers copies key/value heads under a
          mask (before 5.23).

Then the rollout-shaped case (`--rollout-context`, 0 to skip), what a training rollout decodes
and the three arms above are not: contexts of a later turn, up to `--rollout-context` tokens
(about 1,100 in the recipes' rollouts) and spread over the whole second half of it, as
trajectories that searched different numbers of times are; in groups of ROLLOUT_GROUP rows
sharing a prompt length, as the group's samples do. The same batch decodes twice:

- padded: left-padded to the longest row under transformers' `sdpa` (a mask every step);
- packed: under `packed_sdpa`.

Figures are the median time of a decode step (the model's forward on one token a row, after the
prefill), and whether the arms that decode one batch decoded the same greedy tokens (they must:
packing changes the kernel, not the arithmetic). The last line printed is one JSON object: the
transformers version; per context `even_ms`, `ragged_ms`, `packed_ms`, `ragged_over_even`,
`packed_over_even`, `packed_same_tokens`; and `rollout`: `context`, `shortest`, `padding_share`
(the padded batch's share of pad positions), `padded_ms`, `packed_ms`, `packed_over_padded`,
`packed_same_tokens`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
import transformers
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from benchmarks.benchlib import synchronize
from simsearch.generation.attention import PACKED_SDPA

ARMS = ("even", "ragged", "packed")
VOCAB = 8000
SPREAD = 40  # ragged prompts are up to this many tokens shorter than the context
ROLLOUT_GROUP = 4  # rows sharing a prompt length in the rollout-shaped case (a question's samples)


def build(layers: int, device: str) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=896, intermediate_size=4864, num_hidden_layers=layers,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    return Qwen2ForCausalLM(config).eval().to(device=device, dtype=dtype)


def lengths(arm: str, batch: int, context: int) -> list[int]:
    """Each row's prompt length: `context` for even, spread over SPREAD tokens below it otherwise."""
    return [context if arm == "even" else context - (7 * row) % SPREAD for row in range(batch)]


def rollout_lengths(batch: int, context: int) -> list[int]:
    """The rollout-shaped case's prompt lengths: groups of ROLLOUT_GROUP equal rows over [context / 2, context]."""
    groups = -(-batch // ROLLOUT_GROUP)
    half = context // 2
    per_group = [context - (half * ((7 * g) % groups)) // max(1, groups - 1) for g in range(groups)]
    return [per_group[row // ROLLOUT_GROUP] for row in range(batch)]


def padding_share(rows: list[int]) -> float:
    """The share of a left-padded batch's positions that are padding."""
    return 1 - sum(rows) / (len(rows) * max(rows))


def decode_ms(model: Qwen2ForCausalLM, rows: list[int], steps: int) -> tuple[float, list[list[int]]]:
    """Median ms of a greedy decode step after a left-padded prefill of prompts of lengths `rows`, and the tokens.

    The prompts' tokens are seeded: the same `rows` give the same prompts, so two attention
    implementations can be held to the same greedy tokens (each row's `steps + 1` of them).
    """
    device = next(model.parameters()).device
    width = max(rows)
    ids = torch.randint(2, VOCAB, (len(rows), width), generator=torch.Generator().manual_seed(1)).to(device)
    mask = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    for row, length in enumerate(rows):
        mask[row, width - length :] = 1
    position = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    times = []
    tokens = []
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=position, past_key_values=cache)
        for _ in range(steps):
            token = out.logits[:, -1].argmax(-1, keepdim=True)  # [B, 1]
            tokens.append(token)
            mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=-1)
            position = position[:, -1:] + 1
            synchronize(device)
            began = time.perf_counter()
            out = model(input_ids=token, attention_mask=mask, position_ids=position, past_key_values=cache)
            synchronize(device)
            times.append(time.perf_counter() - began)
        tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return 1000 * statistics.median(times), torch.cat(tokens, dim=1).tolist()


def decode_under(model: Qwen2ForCausalLM, attention: str, rows: list[int], steps: int) -> tuple[float, list[list[int]]]:
    """`decode_ms` with the model's attention set to `attention` (sdpa again afterwards)."""
    model.config._attn_implementation = attention
    try:
        return decode_ms(model, rows, steps)
    finally:
        model.config._attn_implementation = "sdpa"


def measure(model: Qwen2ForCausalLM, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Per context, each arm's median decode step (ms), the two ratios to even, and packed's agreement."""
    figures: dict[str, dict[str, Any]] = {}
    for context in args.contexts:
        row: dict[str, Any] = {}
        decoded = {}
        for arm in ARMS:
            attention = PACKED_SDPA if arm == "packed" else "sdpa"
            row[f"{arm}_ms"], decoded[arm] = decode_under(
                model, attention, lengths(arm, args.batch, context), args.steps
            )
        row["ragged_over_even"] = row["ragged_ms"] / row["even_ms"]
        row["packed_over_even"] = row["packed_ms"] / row["even_ms"]
        row["packed_same_tokens"] = decoded["packed"] == decoded["ragged"]
        figures[str(context)] = row
    return figures


def measure_rollout(model: Qwen2ForCausalLM, args: argparse.Namespace) -> dict[str, Any]:
    """The rollout-shaped case (module docstring): padded and packed decode steps of one batch."""
    rows = rollout_lengths(args.batch, args.rollout_context)
    padded_ms, padded = decode_under(model, "sdpa", rows, args.steps)
    packed_ms, packed = decode_under(model, PACKED_SDPA, rows, args.steps)
    return {
        "context": max(rows), "shortest": min(rows), "padding_share": padding_share(rows),
        "padded_ms": padded_ms, "packed_ms": packed_ms, "packed_over_padded": packed_ms / padded_ms,
        "packed_same_tokens": packed == padded,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of the 0.5B shape (24 is the whole)")
    parser.add_argument("--batch", type=int, default=40, help="rows decoded together")
    parser.add_argument("--contexts", type=int, nargs="+", default=[300, 1100], help="prompt tokens")
    parser.add_argument(
        "--rollout-context", type=int, default=1100, help="longest context of the rollout-shaped case (0: skip it)"
    )
    parser.add_argument("--steps", type=int, default=12, help="decode steps timed (the median is kept)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 = every core)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if min(args.contexts) <= SPREAD:
        parser.error(f"--contexts must each exceed {SPREAD} tokens, the ragged prompts' spread")
    if args.rollout_context and args.rollout_context < 2 * ROLLOUT_GROUP:
        parser.error(f"--rollout-context must be 0 (skip) or at least {2 * ROLLOUT_GROUP} tokens")
    if args.threads:
        torch.set_num_threads(args.threads)
    model = build(args.layers, args.device)
    figures = measure(model, args)
    rollout = measure_rollout(model, args) if args.rollout_context else None
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    print(f"{args.layers} layers of the 0.5B shape, batch {args.batch}, median of {args.steps} decode steps (ms):")
    print(f"{'context':>8} {'even':>9} {'ragged':>9} {'packed':>9} {'ragged/even':>12} {'packed/even':>12}")
    for context, row in figures.items():
        cells = " ".join(f"{row[f'{arm}_ms']:9.1f}" for arm in ARMS)
        print(f"{context:>8} {cells} {row['ragged_over_even']:12.2f} {row['packed_over_even']:12.2f}")
    if rollout is not None:
        print(
            f"rollout-shaped: contexts {rollout['shortest']}-{rollout['context']} in groups of {ROLLOUT_GROUP}, "
            f"{100 * rollout['padding_share']:.0f}% padding: padded {rollout['padded_ms']:.1f} ms, packed "
            f"{rollout['packed_ms']:.1f} ms ({rollout['packed_over_padded']:.2f}), same tokens: "
            f"{rollout['packed_same_tokens']}"
        )
    summary = {
        "transformers": transformers.__version__, "torch_threads": torch.get_num_threads(), "contexts": figures,
        "rollout": rollout,
    }  # fmt: skip
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
