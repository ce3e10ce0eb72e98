"""Fidelity on a policy's queries: the examples taken from evaluation rows, measured once and kept in a file."""

from __future__ import annotations

import json

from simsearch.fingerprints import digest
from simsearch.simulator.fidelity import FidelityExample
from simsearch.simulator.policy_fidelity import kept_fidelity, policy_examples
from simsearch.types import Document, SearchRequest


def _row(question: str, answer: str, turns: list[dict]) -> dict:
    return {"question": question, "golden_answers": [answer], "samples": [{"turns": turns}]}


ROWS = [
    # The first executed search counts; an unexecuted one and an empty query do not.
    _row("Q0?", "a0", [{"query": "skipped"}, {"executed": True, "query": ""}, {"executed": True, "query": "q0"}]),
    _row("Q1?", "a1", [{"text": "<answer> a1 </answer>"}]),  # no search: the question is the query
]


class _Engine:
    """Finds the answer for every query that is not a question; records its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        self.calls += 1
        return [[Document("t", "nothing" if r.query.endswith("?") else "a0 a1")] for r in requests]


def test_policy_examples_take_the_first_executed_query_else_the_question() -> None:
    items, used = policy_examples(ROWS)
    assert items == [FidelityExample("Q0?", ["a0"], "q0"), FidelityExample("Q1?", ["a1"], "Q1?")]
    assert used == 1


def test_an_entry_is_measured_once_and_reused_under_its_key(tmp_path) -> None:
    path = tmp_path / "fidelity.json"
    simulator, reference = _Engine(), _Engine()
    identities = {"simulator": {"engine": "s"}, "reference": {"engine": "r"}}
    labels = {"simulator": "sim", "reference": "bm25", "dataset": "nq"}

    def entry() -> dict:
        return kept_fidelity(
            path, ROWS, simulator=simulator, reference=reference, top_k=1, identities=identities, labels=labels
        )

    first = entry()
    items, _ = policy_examples(ROWS)
    key = digest({**identities, "top_k": 1, "items": [vars(item) for item in items]})
    assert list(first)[:6] == ["key", "simulator", "reference", "dataset", "policy_queries", "question_queries"]
    assert (first["key"], first["dataset"], first["policy_queries"], first["question_queries"]) == (key, "nq", 1, 1)
    # The real query q0 finds the answer, the question Q1? does not.
    assert first["fidelity/reference_contains_answer"] == 0.5
    assert json.loads(path.read_text()) == [first]
    assert entry() == first and (simulator.calls, reference.calls) == (1, 1)
    # Another top_k is another entry, appended after the first.
    second = kept_fidelity(
        path, ROWS, simulator=simulator, reference=reference, top_k=2, identities=identities, labels=labels
    )
    assert second["key"] != key and json.loads(path.read_text()) == [first, second]
