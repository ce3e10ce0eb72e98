"""simsearch.experiments.variants: the leakage probe builds each simulator as RL does, its answers kept.

The variants' stages themselves run end to end in the ablations' smoke test (tests/benchmarks/test_ablations.py).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from simsearch.experiments import variants

TRAIN = Path(__file__).resolve().parents[2] / "recipes" / "quickstart" / "train.yaml"


def test_leakage_builds_each_simulator_as_rl_does_with_its_answers_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Any] = []

    def build(search: Any, seed: int = 0) -> str:
        built.append((search, seed))
        return f"engine {search.simulator.generation.model.path}"

    def leakage(engine: str, world: Any, *, n: int, top_k: int) -> dict[str, Any]:
        return {"no_name": 0.5, "noisy": 0.25, "engine": engine, "n": n, "top_k": top_k}

    monkeypatch.setattr(variants, "build_search_engine", build)
    monkeypatch.setattr(variants, "answer_leakage", leakage)
    monkeypatch.setattr(variants.BM25SearchEngine, "build", lambda passages, show_progress: "bm25 engine")
    simulators = {"simulator": ("models/fit", False), "told_prompt": ("models/told", True)}
    leak = variants.leakage(TRAIN, SimpleNamespace(passages=[]), simulators, n=3, seed=7)
    searches = [search for search, seed in built if seed == 7]
    assert [s.simulator.generation.model.path for s in searches] == ["models/fit", "models/told"]
    # A told simulator is asked as it was trained: the question and the gold answer in its prompt.
    assert [(s.simulator.show_question, s.simulator.show_answer) for s in searches] == [(False, False), (True, True)]
    # What the simulator writes, before the RL recipe's redaction, and never from a cache.
    assert all(s.simulator.noisy_answers == "keep" and s.cache == "" for s in searches)
    assert leak["told_prompt"]["engine"] == "engine models/told" and leak["told_prompt"]["n"] == 3
    assert leak["simulator"]["top_k"] == searches[0].top_k > 0
    assert leak["bm25"] == {"no_name": 0.5}  # a real engine has no noisy mode: its no-name share alone
