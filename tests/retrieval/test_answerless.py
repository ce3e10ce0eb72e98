"""The answerless engine: a real retriever's ranking with every passage holding a gold answer taken out."""

from __future__ import annotations

import json

import pytest

from simsearch.errors import RecipeError
from simsearch.factory.build import build_search_engine
from simsearch.retrieval.answerless import AnswerlessSearchEngine
from simsearch.simulator.recipe import SearchConfig
from simsearch.types import Document, Passage, SearchRequest


class Ranked:
    """Returns the first `top_k` of a fixed ranking and remembers what it was asked for."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.asked: list[int] = []

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        self.asked += [r.top_k for r in requests]
        return [[Document(title="", text=t, id=str(i)) for i, t in enumerate(self.texts[: r.top_k])] for r in requests]


RANKING = ["Roru was born in Gesmere.", "Roru is a GLASSBLOWER.", "Roru founded a bank in 1859.", "Tiva, glass-blower.",
           "Mena was born in Ulm.", "Kesh founded a mill in 1700."]  # fmt: skip


def test_passages_holding_an_answer_are_replaced_by_the_next_ones_down() -> None:
    inner = Ranked(RANKING)
    engine = AnswerlessSearchEngine(inner, depth=3)
    request = SearchRequest(query="Roru", top_k=3, golden_answers=["glassblower", "1859"])
    docs = engine.search([request])[0]
    # Normalized as the reward normalizes: neither case ("GLASSBLOWER") nor punctuation ("glass-blower") hides one.
    kept = ["Roru was born in Gesmere.", "Mena was born in Ulm.", "Kesh founded a mill in 1700."]
    assert [d.text for d in docs] == kept
    assert inner.asked == [6]  # top_k + depth


def test_fewer_come_back_when_the_ranking_runs_out_and_the_corpus_bounds_the_depth() -> None:
    inner = Ranked(RANKING[:3])
    engine = AnswerlessSearchEngine(inner, depth=10, limit=3)
    docs = engine.search([SearchRequest(query="Roru", top_k=3, golden_answers=["Gesmere"])])[0]
    assert [d.text for d in docs] == ["Roru is a GLASSBLOWER.", "Roru founded a bank in 1859."]
    assert inner.asked == [3]


def test_a_request_without_gold_answers_is_refused() -> None:
    engine = AnswerlessSearchEngine(Ranked(RANKING))
    with pytest.raises(ValueError, match="needs each question's gold answers"):
        engine.search([SearchRequest(query="Roru", top_k=3, golden_answers=["1859"]), SearchRequest(query="Roru")])


def test_built_from_a_recipe_section_over_real_bm25(tmp_path) -> None:
    passages = [Passage(id=str(i), title="", text=text) for i, text in enumerate(RANKING)]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in passages))
    config = SearchConfig(kind="answerless", corpus=str(corpus), index_dir=str(tmp_path / "index"), top_k=3)
    docs = build_search_engine(config).search([SearchRequest(query="Roru", top_k=3, golden_answers=["1859"])])[0]
    # BM25 finds the three passages naming Roru; the one with the answer is gone.
    assert {d.text for d in docs} == {"Roru was born in Gesmere.", "Roru is a GLASSBLOWER."}
    bm25 = build_search_engine(SearchConfig(kind="bm25", corpus=str(corpus), index_dir=str(tmp_path / "index")))
    assert len(bm25.search([SearchRequest(query="Roru", top_k=3)])[0]) == 3
    with pytest.raises(RecipeError, match=r"search\.kind=answerless needs search\.corpus"):
        SearchConfig(kind="answerless").check("search")


def test_the_cache_keeps_results_apart_by_gold_answers(tmp_path) -> None:
    passages = [Passage(id=str(i), title="", text=text) for i, text in enumerate(RANKING)]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in passages))
    config = SearchConfig(kind="answerless", corpus=str(corpus), top_k=3, cache=str(tmp_path / "cache.sqlite"))
    engine = build_search_engine(config)
    first = engine.search([SearchRequest(query="Roru", top_k=3, golden_answers=["1859"])])[0]
    second = engine.search([SearchRequest(query="Roru", top_k=3, golden_answers=["Gesmere"])])[0]
    assert "Roru founded a bank in 1859." not in {d.text for d in first}
    assert "Roru founded a bank in 1859." in {d.text for d in second}
