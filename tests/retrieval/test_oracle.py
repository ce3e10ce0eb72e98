"""The oracle engine: the question's answer passage on every search, whatever the query, and random others."""

from __future__ import annotations

import json

import pytest

from simsearch.errors import RecipeError
from simsearch.factory.build import build_search_engine
from simsearch.retrieval.oracle import OracleSearchEngine
from simsearch.simulator.recipe import SearchConfig
from simsearch.types import Passage, SearchRequest

TEXTS = [
    "Roru was born in Gesmere and works as a baker.",
    "Roru founded a bank in 1859.",
    "Roru once visited Ulmwick in 1790 to meet a potter.",
    "Mena was born in Gesmere and works as a weaver.",  # the same city: an answer, but not the asked person's
    "Mena founded a mill in 1700.",
    "Kesh was born in Ulmwick and works as a tanner.",
    "Gesmere is a quiet town near the river.",
    "Tiva founded a theatre in 1801.",
]
PASSAGES = [Passage(id=str(i), title="", text=text) for i, text in enumerate(TEXTS)]
ROR_BIRTH = SearchRequest(query="", top_k=3, question="Where was Roru born?", golden_answers=["Gesmere"])


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in PASSAGES))
    return path


def _oracle(corpus, tmp_path, seed: int = 0) -> OracleSearchEngine:
    config = SearchConfig(kind="oracle", corpus=str(corpus), index_dir=str(tmp_path / "index"), top_k=3)
    engine = build_search_engine(config, seed=seed)
    assert isinstance(engine, OracleSearchEngine)
    return engine


def _asking(query: str, request: SearchRequest = ROR_BIRTH) -> SearchRequest:
    return SearchRequest(query=query, top_k=request.top_k, question=request.question,
                         golden_answers=request.golden_answers)  # fmt: skip


def test_every_search_shows_the_asked_persons_answer_passage_whatever_the_query(corpus, tmp_path) -> None:
    engine = _oracle(corpus, tmp_path)
    # A query naming the person, one naming someone else, one about nothing in the corpus, and none at all.
    queries = ["Roru born", "Mena founded mill", "xyzzy", ""]
    results = engine.search([_asking(q) for q in queries])
    for docs in results:
        assert len(docs) == 3 and len({d.id for d in docs}) == 3  # distinct passages
        # Roru's passage (Mena's holds "Gesmere" too, but may only come as a random one): the question names Roru.
        assert TEXTS[0] in {d.text for d in docs}
        assert all(d.source == "oracle" for d in docs)


def test_query_blind_two_queries_of_one_question_get_the_same_answer_passage(corpus, tmp_path) -> None:
    engine = _oracle(corpus, tmp_path)
    good, bad = engine.search([_asking("Roru Where was Roru born"), _asking("Kesh tanner Ulmwick")])
    assert TEXTS[0] in {d.text for d in good} and TEXTS[0] in {d.text for d in bad}
    # The query moves nothing: a fresh engine with the same seed, asked with other queries, gives the same documents.
    again = _oracle(corpus, tmp_path).search([_asking("a"), _asking("b")])
    assert [[d.id for d in docs] for docs in again] == [[d.id for d in good], [d.id for d in bad]]


def test_another_question_gets_its_own_answer_and_the_rest_are_random(corpus, tmp_path) -> None:
    year = SearchRequest(query="Roru", top_k=3, question="When did Mena found the mill?", golden_answers=["1700"])
    engine = _oracle(corpus, tmp_path)
    results = engine.search([year] * 40)
    assert all(TEXTS[4] in {d.text for d in docs} for docs in results)
    # The two other places are drawn from the rest of the corpus (7 passages), and the answer's rank varies.
    others = {d.id for docs in results for d in docs if d.text != TEXTS[4]}
    assert len(others) >= 5
    assert {[d.text for d in docs].index(TEXTS[4]) for docs in results} == {0, 1, 2}


def test_a_request_without_question_or_answers_or_a_holder_is_refused(corpus, tmp_path) -> None:
    engine = _oracle(corpus, tmp_path)
    with pytest.raises(ValueError, match="needs each question and its gold answers"):
        engine.search([SearchRequest(query="Roru", top_k=3, golden_answers=["Gesmere"])])
    with pytest.raises(ValueError, match="needs each question and its gold answers"):
        engine.search([SearchRequest(query="Roru", top_k=3, question="Where was Roru born?")])
    with pytest.raises(ValueError, match="holds a gold answer"):
        engine.search([SearchRequest(query="Roru", top_k=3, question="Where was Roru born?", golden_answers=["Oslo"])])
    with pytest.raises(RecipeError, match=r"search\.kind=oracle needs search\.corpus"):
        SearchConfig(kind="oracle").check("search")
