"""What a padding mask costs a decode step of a grouped-query model, with and without packed queries.

Run:  python benchmarks/masked_decode.py [--layers 4] [--batch 40] [--contexts 300 1100]
          [--steps 12] [--threads 1] [--device cpu]

A Qwen2 with Qwen2.5-0.5B's layer shape (hidden 896, 14 query heads on 2 key/value heads, FFN
4864; `--layers` of them, random weights; bf16 on a GPU, float32 on the CPU) decodes `--steps`
greedy tokens after `--batch` prompts of each context length, three ways, side by side:

- even:   every prompt `--contexts` tokens long: no padding, so transformers passes no mask;
- ragged: prompt lengths spread over 40 tokens below it, left-padded: a mask on every step,
          under transformers' own `sdpa`;
- packed: the same ragged batch under `simsearch.generation.attention.packed_sdpa`, which
          HFEngine switches on where the installed transformers copies key/value heads under a
          mask (before 5.23).

Figures are the median time of a decode step (the model's forward on one token a row, after the
prefill). The last line printed is one JSON object: the transformers version, and per context
`even_ms`, `ragged_ms`, `packed_ms`, `ragged_over_even`, `packed_over_even`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
import transformers
from benchlib import synchronize  # sibling modules: benchmarks/ is on sys.path (python benchmarks/x.py)
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from simsearch.generation.attention import PACKED_SDPA

ARMS = ("even", "ragged", "packed")
VOCAB = 8000
SPREAD = 40  # ragged prompts are up to this many tokens shorter than the context


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


def decode_ms(model: Qwen2ForCausalLM, rows: list[int], steps: int) -> float:
    """Median ms of a greedy decode step after a left-padded prefill of prompts of lengths `rows`."""
    device = next(model.parameters()).device
    width = max(rows)
    ids = torch.randint(2, VOCAB, (len(rows), width), generator=torch.Generator().manual_seed(1)).to(device)
    mask = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    for row, length in enumerate(rows):
        mask[row, width - length :] = 1
    position = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    times = []
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=position, past_key_values=cache)
        for _ in range(steps):
            token = out.logits[:, -1].argmax(-1, keepdim=True)  # [B, 1]
            mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=-1)
            position = position[:, -1:] + 1
            synchronize(device)
            began = time.perf_counter()
            out = model(input_ids=token, attention_mask=mask, position_ids=position, past_key_values=cache)
            synchronize(device)
            times.append(time.perf_counter() - began)
    return 1000 * statistics.median(times)


def measure(model: Qwen2ForCausalLM, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Per context, each arm's median decode step (ms) and the two ratios to even."""
    figures: dict[str, dict[str, float]] = {}
    for context in args.contexts:
        row: dict[str, float] = {}
        for arm in ARMS:
            model.config._attn_implementation = PACKED_SDPA if arm == "packed" else "sdpa"
            row[f"{arm}_ms"] = decode_ms(model, lengths(arm, args.batch, context), args.steps)
        model.config._attn_implementation = "sdpa"
        row["ragged_over_even"] = row["ragged_ms"] / row["even_ms"]
        row["packed_over_even"] = row["packed_ms"] / row["even_ms"]
        figures[str(context)] = row
    return figures


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of the 0.5B shape (24 is the whole)")
    parser.add_argument("--batch", type=int, default=40, help="rows decoded together")
    parser.add_argument("--contexts", type=int, nargs="+", default=[300, 1100], help="prompt tokens")
    parser.add_argument("--steps", type=int, default=12, help="decode steps timed (the median is kept)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 = every core)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if min(args.contexts) <= SPREAD:
        parser.error(f"--contexts must each exceed {SPREAD} tokens, the ragged prompts' spread")
    if args.threads:
        torch.set_num_threads(args.threads)
    figures = measure(build(args.layers, args.device), args)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    print(f"{args.layers} layers of the 0.5B shape, batch {args.batch}, median of {args.steps} decode steps (ms):")
    print(f"{'context':>8} {'even':>9} {'ragged':>9} {'packed':>9} {'ragged/even':>12} {'packed/even':>12}")
    for context, row in figures.items():
        cells = " ".join(f"{row[f'{arm}_ms']:9.1f}" for arm in ARMS)
        print(f"{context:>8} {cells} {row['ragged_over_even']:12.2f} {row['packed_over_even']:12.2f}")
    summary = {"transformers": transformers.__version__, "torch_threads": torch.get_num_threads(), "contexts": figures}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
