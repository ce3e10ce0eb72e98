"""Is the simulator a faithful search engine? Useful docs useful, noisy docs noisy, queries matter.

`measure_fidelity` runs a simulator (and optionally a real retriever as reference) on held-out
(question, gold answers, query) triples and reports, under `fidelity/...`:

- `useful_contains_answer`, `noisy_contains_answer` and `gap` (their difference): the share of
  useful (num_noisy = 0) and noisy (num_noisy = top_k) document sets that contain a gold answer
  (`sft_data.contains_answer`);
- `corrupted_contains_answer` and `query_sensitivity` = useful − corrupted, with each query
  replaced by a corrupted one: the next example's differing query (wrapping around), while the
  question and gold answers stay example i's;
- with a reference: `reference_contains_answer`, `reference_corrupted_contains_answer`,
  `reference_query_sensitivity`, and `agreement` (share of examples where simulator and
  reference agree on whether the real query's documents contain the answer);
- `format_valid`, `padded`, `unparsed`: shares of parsed sets, when the simulator is an
  unwrapped `SimulatedSearchEngine`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from simsearch.retrieval.base import SearchEngine
from simsearch.simulator.engine import SimulatedSearchEngine
from simsearch.simulator.sft_data import contains_answer
from simsearch.types import SearchRequest


@dataclass
class FidelityExample:
    """A held-out question with its gold answers and a query a policy (or person) wrote for it."""

    question: str
    golden_answers: list[str]
    query: str


def corrupt_queries(queries: list[str]) -> list[str]:
    """Each query replaced by the next different query in the list (wrapping around).

    A query equal to every other one is kept as is (there is nothing to swap in).
    """
    n = len(queries)
    out = []
    for i, query in enumerate(queries):
        others = (queries[(i + step) % n] for step in range(1, n))
        out.append(next((q for q in others if q != query), query))
    return out


def _rate(hits: list[bool]) -> float:
    return sum(hits) / len(hits) if hits else 0.0


def measure_fidelity(
    simulator: SearchEngine,
    examples: list[FidelityExample],
    *,
    top_k: int = 3,
    reference: SearchEngine | None = None,
) -> dict[str, float]:
    """Measures how faithfully `simulator` behaves as a search engine (module docstring).

    One `search` call to the simulator (useful, noisy, corrupted requests), one to the reference.

    Args:
        simulator: The engine under test.
        examples: Held-out triples; each needs at least one gold answer.
        top_k: Documents per search.
        reference: A real retriever to compare with, or None.

    Returns:
        `fidelity/...` metrics and `fidelity/examples`.

    Raises:
        ValueError: No examples, or an example without a gold answer (naming it).
    """
    if not examples:
        raise ValueError("measure_fidelity needs at least one example")
    for i, ex in enumerate(examples):
        if not ex.golden_answers:
            raise ValueError(f"example {i} ({ex.question!r}) has no gold answer; fidelity needs one")
    n = len(examples)
    corrupted = corrupt_queries([ex.query for ex in examples])

    def request(ex: FidelityExample, query: str, num_noisy: int) -> SearchRequest:
        return SearchRequest(
            query=query,
            top_k=top_k,
            question=ex.question,
            golden_answers=list(ex.golden_answers),
            num_noisy=num_noisy,
        )

    requests = (
        [request(ex, ex.query, 0) for ex in examples]
        + [request(ex, ex.query, top_k) for ex in examples]
        + [request(ex, q, 0) for ex, q in zip(examples, corrupted)]
    )
    stats_before = Counter(simulator.stats) if isinstance(simulator, SimulatedSearchEngine) else None
    results = simulator.search(requests)
    hits = [contains_answer(docs, r.golden_answers) for docs, r in zip(results, requests)]
    useful, noisy, corrupt = hits[:n], hits[n : 2 * n], hits[2 * n :]
    metrics = {
        "fidelity/examples": float(n),
        "fidelity/useful_contains_answer": _rate(useful),
        "fidelity/noisy_contains_answer": _rate(noisy),
        "fidelity/corrupted_contains_answer": _rate(corrupt),
    }
    metrics["fidelity/gap"] = metrics["fidelity/useful_contains_answer"] - metrics["fidelity/noisy_contains_answer"]
    metrics["fidelity/query_sensitivity"] = (
        metrics["fidelity/useful_contains_answer"] - metrics["fidelity/corrupted_contains_answer"]
    )
    if stats_before is not None:
        assert isinstance(simulator, SimulatedSearchEngine)  # narrows the type for the checker
        delta = Counter(simulator.stats)
        delta.subtract(stats_before)
        sets = delta["simulator/sets"]
        for key in ("valid", "padded", "unparsed"):
            name = "format_valid" if key == "valid" else key
            metrics[f"fidelity/{name}"] = delta[f"simulator/{key}"] / sets if sets else 0.0
    if reference is not None:
        ref_requests = requests[:n] + requests[2 * n :]
        ref_results = reference.search(ref_requests)
        ref_hits = [contains_answer(d, r.golden_answers) for d, r in zip(ref_results, ref_requests)]
        ref_real, ref_corrupt = ref_hits[:n], ref_hits[n:]
        metrics["fidelity/reference_contains_answer"] = _rate(ref_real)
        metrics["fidelity/reference_corrupted_contains_answer"] = _rate(ref_corrupt)
        metrics["fidelity/reference_query_sensitivity"] = _rate(ref_real) - _rate(ref_corrupt)
        metrics["fidelity/agreement"] = _rate([a == b for a, b in zip(useful, ref_real)])
    return metrics
