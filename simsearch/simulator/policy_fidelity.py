"""Simulator fidelity on the queries a policy sent: `measure_fidelity` on an evaluation's per-example rows,
measured once and kept in a JSON file, so a resumed evaluation reuses it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from simsearch.fingerprints import digest
from simsearch.retrieval.base import SearchEngine
from simsearch.simulator.fidelity import FidelityExample, measure_fidelity

FIDELITY_FILE = "fidelity.json"
"""In an evaluation's run directory: the list of `kept_fidelity` entries."""


def policy_examples(rows: Sequence[dict[str, Any]]) -> tuple[list[FidelityExample], int]:
    """One `FidelityExample` per per-example row (`eval.report.example_row`), and how many carry a policy query.

    The query is the first search the policy ran in the row's first sample, or the question itself when it ran
    none.
    """
    queries = [_first_query(row) for row in rows]
    items = [
        FidelityExample(row["question"], list(row["golden_answers"]), query or row["question"])
        for row, query in zip(rows, queries)
    ]
    return items, sum(query is not None for query in queries)


def kept_fidelity(
    path: Path,
    rows: Sequence[dict[str, Any]],
    *,
    simulator: SearchEngine,
    reference: SearchEngine,
    top_k: int,
    identities: dict[str, Any],
    labels: dict[str, str],
) -> dict[str, Any]:
    """The fidelity of `simulator` against `reference` on the policy's queries in `rows`, measured once.

    Args:
        path: The JSON list of entries, read and rewritten (created when missing).
        rows: Per-example rows of the policy searching `reference` (`policy_examples`).
        simulator: The simulator engine.
        reference: The real retriever.
        top_k: Documents per search.
        identities: What shapes each engine's results, under "simulator" and "reference"; with `top_k` and the
            examples, the entry's `key`.
        labels: Written into the entry (simulator, reference and dataset names).

    Returns:
        `{"key", **labels, "policy_queries", "question_queries", **measure_fidelity(...)}`: the entry kept under
        this key in `path` when there is one, else a new one, appended to `path`.
    """
    items, used = policy_examples(rows)
    key = digest({**identities, "top_k": top_k, "items": [asdict(item) for item in items]})
    saved = {entry["key"]: entry for entry in json.loads(path.read_text())} if path.is_file() else {}
    if key not in saved:
        metrics = measure_fidelity(simulator, items, top_k=top_k, reference=reference)
        saved[key] = {"key": key, **labels, "policy_queries": used, "question_queries": len(items) - used, **metrics}
        path.write_text(json.dumps(list(saved.values()), indent=2) + "\n", encoding="utf-8")
    return saved[key]


def _first_query(row: dict[str, Any]) -> str | None:
    for turn in row["samples"][0]["turns"]:
        if turn.get("executed") and turn.get("query"):
            return turn["query"]
    return None
