"""HTTPSearchEngine against a fake Search-R1 `POST /retrieve` server on 127.0.0.1."""

from __future__ import annotations

import time
from typing import Any

import pytest

from simsearch.httpclient import SearchServiceError
from simsearch.retrieval.http import HTTPSearchEngine, parse_document
from simsearch.types import Document, SearchRequest
from tests.servers import (  # the `serve` fixture is in conftest.py
    Seen,
    dead_url,
)

# --- a fake Search-R1 /retrieve server over a tiny wiki-18 style corpus

CORPUS = [
    {"id": "0", "contents": '"Paris"\nParis is the capital of France.\nIt lies on the Seine.'},
    {"id": "1", "contents": '"Lyon"\nLyon is a city in France.'},
    {"id": "2", "contents": '"Berlin"\nBerlin is the capital of Germany.'},
    {"id": "3", "contents": '"Rome"\nRome is the capital of Italy.'},
    {"id": "4", "contents": '"Madrid"\nMadrid is the capital of Spain.'},
    {"id": "5", "contents": '"Vienna"\nVienna is the capital of Austria.'},
]


def retrieve(seen: Seen, *, extra: int = 0) -> Any:
    """Query i gets documents i, i+1, ... (mod 6), `topk + extra` of them, scored 1/(rank+1)."""
    body = seen.json()
    result = []
    for i, _query in enumerate(body["queries"]):
        docs = [CORPUS[(i + r) % len(CORPUS)] for r in range(body["topk"] + extra)]
        if body["return_scores"]:
            result.append([{"document": d, "score": 1.0 / (r + 1)} for r, d in enumerate(docs)])
        else:
            result.append(docs)
    return 200, {"result": result}, {}


def engine(url: str, **kwargs: Any) -> HTTPSearchEngine:
    kwargs.setdefault("backoff_s", 0.001)
    kwargs.setdefault("timeout_s", 2.0)
    return HTTPSearchEngine(url, **kwargs)


def test_parse_document_keeps_the_title_line_as_stored():
    entry = {"document": CORPUS[0], "score": 0.5}
    doc = parse_document(entry, "http://x/retrieve")
    assert doc == Document(
        title='"Paris"',
        text="Paris is the capital of France.\nIt lies on the Seine.",
        score=0.5,
        source="http",
        id="0",
    )
    # Plain documents (return_scores false) and title/text corpora.
    assert parse_document(CORPUS[1], "u") == Document('"Lyon"', "Lyon is a city in France.", None, "http", "1")
    assert parse_document({"id": 7, "title": "T", "text": "body"}, "u") == Document("T", "body", None, "http", "7")
    message = "http://x/retrieve returned a document without 'contents'"
    with pytest.raises(SearchServiceError, match=message):
        parse_document({"document": {"id": "9"}}, "http://x/retrieve")


def test_one_post_per_distinct_top_k_and_results_in_request_order(serve):
    server = serve(retrieve)
    requests = [SearchRequest(q, top_k=k) for q, k in [("a", 2), ("b", 3), ("c", 2)]]
    out = engine(server.url + "/retrieve").search(requests)

    bodies = [s.json() for s in server.seen]
    assert [s.path for s in server.seen] == ["/retrieve", "/retrieve"]
    assert bodies == [
        {"queries": ["a", "c"], "topk": 2, "return_scores": True},
        {"queries": ["b"], "topk": 3, "return_scores": True},
    ]
    # "a" is query 0 of the first POST -> docs 0, 1; "c" is query 1 -> docs 1, 2;
    # "b" is query 0 of the second POST -> docs 0, 1, 2.
    assert [[d.id for d in docs] for docs in out] == [["0", "1"], ["0", "1", "2"], ["1", "2"]]
    assert [d.score for d in out[1]] == pytest.approx([1.0, 0.5, 1.0 / 3])
    assert out[0][0].title == '"Paris"' and out[0][0].source == "http"


def test_simulator_context_travels_aligned_with_queries(serve):
    server = serve(retrieve)
    requests = [
        SearchRequest("q1", top_k=3, question="Capital of France?", golden_answers=["Paris"], num_noisy=3),
        SearchRequest("q2", top_k=3),
    ]
    engine(server.url + "/retrieve").search(requests)
    body = server.seen[0].json()
    assert body["question"] == ["Capital of France?", None]
    assert body["golden_answers"] == [["Paris"], []]
    assert body["noisy"] == [3, 0]

    engine(server.url + "/retrieve").search([SearchRequest("q3", top_k=3)])
    assert set(server.seen[1].json()) == {"queries", "topk", "return_scores"}


def test_batch_size_splits_large_groups(serve):
    server = serve(retrieve)
    out = engine(server.url + "/retrieve", batch_size=2).search([SearchRequest(f"q{i}", top_k=1) for i in range(5)])
    assert [len(s.json()["queries"]) for s in server.seen] == [2, 2, 1]
    # Within each POST query j gets doc j: batches (0, 1), (2, 3), (4).
    assert [docs[0].id for docs in out] == ["0", "1", "0", "1", "0"]


def test_more_documents_than_asked_are_cut_to_top_k(serve):
    server = serve(lambda seen: retrieve(seen, extra=2))
    out = engine(server.url + "/retrieve").search([SearchRequest("a", top_k=2)])
    assert [d.id for d in out[0]] == ["0", "1"]


def test_empty_batch_sends_nothing(serve):
    server = serve(retrieve)
    assert engine(server.url + "/retrieve").search([]) == []
    assert server.seen == []


def test_server_errors_are_retried_within_the_bound_then_reported(serve):
    server = serve(lambda seen: (503, b"index loading", {}))
    url = server.url + "/retrieve"
    with pytest.raises(SearchServiceError) as info:
        engine(url, max_retries=2).search([SearchRequest("a")])
    assert len(server.seen) == 3
    assert url in str(info.value) and "3 attempt(s)" in str(info.value)
    assert "index loading" in str(info.value)


def test_result_count_mismatch_is_a_clear_error(serve):
    server = serve(lambda seen: (200, {"result": [[]]}, {}))
    with pytest.raises(SearchServiceError, match="2 queries with 1 result lists"):
        engine(server.url + "/retrieve").search([SearchRequest("a"), SearchRequest("b")])


def test_dead_server_fails_fast():
    url = dead_url() + "/retrieve"
    start = time.monotonic()
    with pytest.raises(SearchServiceError, match="ConnectError"):
        engine(url, max_retries=2, timeout_s=30.0).search([SearchRequest("a")])
    assert time.monotonic() - start < 10.0  # a refused connection is not waited on: far under one 30 s timeout


def test_url_must_have_a_scheme():
    with pytest.raises(ValueError, match="http://"):
        HTTPSearchEngine("127.0.0.1:8000/retrieve")
