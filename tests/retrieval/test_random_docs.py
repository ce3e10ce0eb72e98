"""The random-documents engine: query-blind draws from the corpus, seeded, built from a recipe."""

from __future__ import annotations

import json

import pytest

from simsearch.errors import RecipeError
from simsearch.factory.build import build_search_engine
from simsearch.retrieval.random_docs import RandomDocumentsEngine
from simsearch.simulator.recipe import SearchConfig
from simsearch.types import Passage, SearchRequest

PASSAGES = [Passage(id=str(i), title=f"T{i}", text=f"text {i}") for i in range(20)]


def test_draws_distinct_passages_whatever_the_query() -> None:
    engine = RandomDocumentsEngine(PASSAGES, seed=3)
    results = engine.search([SearchRequest(query="T1", top_k=3), SearchRequest(query="T1", top_k=3)])
    for docs in results:
        assert len(docs) == 3 and len({d.id for d in docs}) == 3
        assert all(d.source == "random" and d.text == f"text {d.id}" for d in docs)
    # The same query twice gets two independent draws: the query plays no part.
    assert [d.id for d in results[0]] != [d.id for d in results[1]]


def test_the_same_seed_and_calls_give_the_same_documents() -> None:
    def ids(seed: int) -> list[list[str | None]]:
        engine = RandomDocumentsEngine(PASSAGES, seed=seed)
        return [[d.id for d in docs] for docs in engine.search([SearchRequest(query=q) for q in "abcd"])]

    assert ids(0) == ids(0)
    assert ids(0) != ids(1)


def test_top_k_above_the_corpus_returns_the_whole_corpus() -> None:
    docs = RandomDocumentsEngine(PASSAGES[:2]).search([SearchRequest(query="x", top_k=5)])[0]
    assert sorted(d.id for d in docs) == ["0", "1"]


def test_built_from_a_recipe_section(tmp_path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in PASSAGES))
    engine = build_search_engine(SearchConfig(kind="random", corpus=str(corpus), top_k=2))
    docs = engine.search([SearchRequest(query="anything", top_k=2)])[0]
    assert len(docs) == 2 and {d.id for d in docs} <= {p.id for p in PASSAGES}
    with pytest.raises(RecipeError, match=r"search\.kind=random needs search\.corpus"):
        SearchConfig(kind="random").check("search")
