"""Simulator throughput: one batched search call vs one query per call (ZeroSearch's pattern).

Run:  python -m benchmarks.simulator [--queries 64] [--new-tokens 64] [--top-k 3]
          [--repeats 2]

Builds the quickstart-sized tiny Qwen2 (hidden 128, 4 layers, 4 / 2 heads, FFN 384, random
weights; speed does not depend on training) with a 1000-token byte-level BPE trained on random
words plus copies of the simsearch simulator prompt (a real tokenizer knows English; without this
the prompt would be byte-encoded and several times longer). A `SimulatedSearchEngine` with the
`simsearch` preset over `HFEngine` (batch 64) then answers the same queries:

- batched:   one `search` call with every request (one generate call);
- per query: one `search` call per request, as ZeroSearch issues one HTTP request per query.

Every prompt generates `--new-tokens` tokens at temperature 0.8 (an untrained model seldom emits
eos). Documents/s counts the `top_k` documents returned per query, parse padding included. Each
mode runs `--repeats` times, interleaved so machine load hits both alike; the best run is kept.
The last line is JSON with `batched_over_per_query` and the raw figures.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import time

import torch

from simsearch.generation.hf import HFEngine
from simsearch.models import build_tiny_model, train_tokenizer
from simsearch.simulator.engine import SimulatedSearchEngine
from simsearch.simulator.prompts import render
from simsearch.types import SearchRequest


def _words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 8))) for _ in range(n))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    return parser.parse_args()


def build(args: argparse.Namespace) -> tuple[list[SearchRequest], SimulatedSearchEngine, int, int]:
    """The requests, the simulator over the tiny model, the first prompt's tokens and the model's parameters."""
    rng = random.Random(0)
    requests = [
        SearchRequest(
            query=_words(rng, 3), top_k=args.top_k, question=_words(rng, 6) + "?", golden_answers=[_words(rng, 2)]
        )
        for _ in range(args.queries)
    ]
    prompt_text = render("simsearch", query="", question="q", golden_answers=["a"], noisy=False, top_k=args.top_k)
    texts = [_words(rng, 20) for _ in range(2000)] + [prompt_text] * 200
    tokenizer = train_tokenizer(texts, vocab_size=1000)
    model = build_tiny_model(tokenizer)
    prompt_tokens = len(
        tokenizer(
            render(
                "simsearch",
                query=requests[0].query,
                question=requests[0].question,
                golden_answers=requests[0].golden_answers,
                noisy=False,
                top_k=args.top_k,
            )
        )["input_ids"]
    )
    engine = SimulatedSearchEngine(
        HFEngine(model, tokenizer, batch_size=64),
        preset="simsearch",
        temperature=0.8,
        max_new_tokens=args.new_tokens,
        seed=0,
    )
    return requests, engine, prompt_tokens, sum(p.numel() for p in model.parameters())


def best_seconds(engine: SimulatedSearchEngine, requests: list[SearchRequest], repeats: int) -> dict[str, float]:
    """The fastest of `repeats` interleaved runs of each mode, after a warm-up."""

    def batched() -> None:
        engine.search(requests)

    def per_query() -> None:
        for request in requests:
            engine.search([request])

    best = {"batched": float("inf"), "per_query": float("inf")}
    with torch.inference_mode():
        engine.search(requests[:2])  # warm-up
        for _ in range(repeats):
            for name, run in (("batched", batched), ("per_query", per_query)):
                began = time.perf_counter()
                run()
                best[name] = min(best[name], time.perf_counter() - began)
    return best


def report(args: argparse.Namespace, params: int, prompt_tokens: int, best: dict[str, float]) -> None:
    """The table of seconds and documents/s per mode, then the JSON line."""
    documents = args.queries * args.top_k
    rate = {name: documents / seconds for name, seconds in best.items()}
    print(
        f"tiny Qwen2 {params / 1e6:.2f}M params, "
        f"{args.queries} queries x top_k {args.top_k}, prompt ~{prompt_tokens} tokens, "
        f"{args.new_tokens} new tokens, torch threads {torch.get_num_threads()}"
    )
    print(f"{'mode':<12}{'seconds':>10}{'docs/s':>10}")
    for name in best:
        print(f"{name:<12}{best[name]:>10.2f}{rate[name]:>10.1f}")
    print(
        json.dumps(
            {
                "batched_over_per_query": round(rate["batched"] / rate["per_query"], 2),
                "batched_docs_per_s": round(rate["batched"], 1),
                "per_query_docs_per_s": round(rate["per_query"], 1),
                "batched_s": round(best["batched"], 3),
                "per_query_s": round(best["per_query"], 3),
                "queries": args.queries,
                "top_k": args.top_k,
                "new_tokens": args.new_tokens,
                "prompt_tokens": prompt_tokens,
            }
        )
    )


def main() -> None:
    args = parse_args()
    requests, engine, prompt_tokens, params = build(args)
    best = best_seconds(engine, requests, args.repeats)
    report(args, params, prompt_tokens, best)


if __name__ == "__main__":
    main()
