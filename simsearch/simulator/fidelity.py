"""Is the simulator a faithful search engine? Useful docs useful, noisy docs noisy, queries matter.

`measure_fidelity` runs a simulator (and optionally a real retriever) on held-out (question, gold
answers, query) triples; its `fidelity/...` metrics: the shares of useful, noisy and
corrupted-query document sets that contain a gold answer (`sft_data.contains_answer`; a
corrupted query is the next example's differing one), `gap` = useful - noisy,
`query_sensitivity` = useful - corrupted; the reference's shares, sensitivity and `agreement`
with the simulator; and the simulator's parse shares (`format_valid`, `padded`, `unparsed`).
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
    requests = _fidelity_requests(examples, top_k)
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
        metrics.update(_parse_rates(simulator, stats_before))
    if reference is not None:
        metrics.update(_reference_metrics(reference, requests[:n] + requests[2 * n :], useful))
    return metrics


def _fidelity_requests(examples: list[FidelityExample], top_k: int) -> list[SearchRequest]:
    """The useful, then noisy, then corrupted-query request of every example, in that order."""
    corrupted = corrupt_queries([ex.query for ex in examples])

    def request(ex: FidelityExample, query: str, num_noisy: int) -> SearchRequest:
        return SearchRequest(
            query=query,
            top_k=top_k,
            question=ex.question,
            golden_answers=list(ex.golden_answers),
            num_noisy=num_noisy,
        )

    return (
        [request(ex, ex.query, 0) for ex in examples]
        + [request(ex, ex.query, top_k) for ex in examples]
        + [request(ex, q, 0) for ex, q in zip(examples, corrupted)]
    )


def _parse_rates(simulator: SimulatedSearchEngine, stats_before: Counter[str]) -> dict[str, float]:
    """Share of the simulator's document sets since `stats_before` that parsed, were padded, or did not parse."""
    delta = Counter(simulator.stats)
    delta.subtract(stats_before)
    sets = delta["simulator/sets"]
    rates: dict[str, float] = {}
    for key in ("valid", "padded", "unparsed"):
        name = "format_valid" if key == "valid" else key
        rates[f"fidelity/{name}"] = delta[f"simulator/{key}"] / sets if sets else 0.0
    return rates


def _reference_metrics(reference: SearchEngine, requests: list[SearchRequest], useful: list[bool]) -> dict[str, float]:
    """The reference's hit rates on the useful then corrupted `requests`, and its agreement with `useful`."""
    n = len(useful)
    results = reference.search(requests)
    hits = [contains_answer(d, r.golden_answers) for d, r in zip(results, requests)]
    real, corrupt = hits[:n], hits[n:]
    return {
        "fidelity/reference_contains_answer": _rate(real),
        "fidelity/reference_corrupted_contains_answer": _rate(corrupt),
        "fidelity/reference_query_sensitivity": _rate(real) - _rate(corrupt),
        "fidelity/agreement": _rate([a == b for a, b in zip(useful, real)]),
    }
