"""Serper and SerpAPI engines against local fakes of those services (no live call, ever)."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from simsearch.httpclient import SearchServiceError
from simsearch.retrieval.web import SerpAPISearchEngine, SerperSearchEngine
from simsearch.types import Document, SearchRequest
from tests.servers import (  # the `serve` fixture is in conftest.py
    Seen,
)

# --- fakes speaking Serper's and SerpAPI's documented response shapes

SERPER_KEY = "serper-key-123"
SERPAPI_KEY = "serpapi-key-456"


def organic(query: str, count: int) -> list[dict[str, Any]]:
    return [
        {
            "title": f"{query} result {p}",
            "link": f"https://example.org/{query}/{p}",
            "snippet": f"Snippet {p} about {query}.",
            "position": p,
        }
        for p in range(1, count + 1)
    ]


def serper(seen: Seen) -> Any:
    if seen.headers.get("x-api-key") != SERPER_KEY:
        return 403, {"message": "Unauthorized.", "statusCode": 403}, {}
    body = seen.json()
    time.sleep(0.05)
    # Serper returns its usual 10 results whatever `num` asks, in position order.
    return 200, {"searchParameters": {"q": body["q"]}, "organic": organic(body["q"], 10)}, {}


def serpapi(seen: Seen) -> Any:
    params = {k: v[0] for k, v in seen.query.items()}
    if params.get("api_key") != SERPAPI_KEY:
        return 401, {"error": "Invalid API key. Your API key should be here: ..."}, {}
    if params["q"] == "nothing":
        return 200, {"error": "Google hasn't returned any results for this query."}, {}
    results = organic(params["q"], 8)
    return 200, {"search_metadata": {"status": "Success"}, "organic_results": results}, {}


@pytest.fixture
def keys(monkeypatch):
    monkeypatch.setenv("SERPER_API_KEY", SERPER_KEY)
    monkeypatch.setenv("SERPAPI_API_KEY", SERPAPI_KEY)


def fast(**kwargs: Any) -> dict[str, Any]:
    return {"backoff_s": 0.001, "timeout_s": 2.0, **kwargs}


def test_serper_returns_the_first_k_organic_results_in_order(serve, keys):
    server = serve(serper)
    web = SerperSearchEngine(base_url=server.url + "/search", **fast())
    out = web.search([SearchRequest("paris", top_k=3), SearchRequest("rome", top_k=2)])

    assert [d.title for d in out[0]] == ["paris result 1", "paris result 2", "paris result 3"]
    assert out[1][1] == Document(
        title="rome result 2",
        text="Snippet 2 about rome.",
        source="serper",
        id="https://example.org/rome/2",
    )
    bodies = sorted((s.json() for s in server.seen), key=lambda b: b["q"])
    assert bodies == [{"q": "paris", "num": 3}, {"q": "rome", "num": 2}]
    assert {s.method for s in server.seen} == {"POST"}
    # Deterministic: the same batch gives the same documents (no random truncation).
    assert web.search([SearchRequest("paris", top_k=3)]) == [out[0]]


def test_serper_batch_is_one_request_per_query_with_bounded_concurrency(serve, keys):
    server = serve(serper)
    web = SerperSearchEngine(base_url=server.url, max_concurrency=3, **fast())
    queries = [f"q{i}" for i in range(7)]
    out = web.search([SearchRequest(q, top_k=1) for q in queries])
    assert [docs[0].title for docs in out] == [f"{q} result 1" for q in queries]
    assert len(server.seen) == 7
    assert 2 <= server.max_in_flight <= 3


def test_serper_without_organic_results_is_empty(serve, keys):
    server = serve(lambda seen: (200, {"searchParameters": {}}, {}))
    web = SerperSearchEngine(base_url=server.url, **fast())
    assert web.search([SearchRequest("zzzz")]) == [[]]


def test_rate_limits_are_retried_within_the_bound(serve, keys):
    replies = iter([(429, b"Too many requests", {"Retry-After": "0"})] * 2)
    server = serve(lambda seen: next(replies, None) or serper(seen))
    web = SerperSearchEngine(base_url=server.url, max_retries=3, **fast())
    assert web.search([SearchRequest("x", top_k=1)])[0][0].title == "x result 1"
    assert len(server.seen) == 3

    limited = serve(lambda seen: (429, b"Too many requests", {}))
    web = SerperSearchEngine(base_url=limited.url, max_retries=2, **fast())
    start = time.monotonic()
    with pytest.raises(SearchServiceError, match=r"3 attempt\(s\).*HTTP 429"):
        web.search([SearchRequest("x")])
    # bounded by the count (3 attempts); without a Retry-After the waits are the 0.001 s backoffs, far under
    # the 30 s backoff cap or the 60 s Retry-After cap a misread header would wait
    assert len(limited.seen) == 3 and time.monotonic() - start < 10.0


def test_missing_key_names_the_variable(monkeypatch):
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    monkeypatch.delenv("MY_SERP_KEY", raising=False)
    with pytest.raises(ValueError, match="SERPER_API_KEY"):
        SerperSearchEngine()
    with pytest.raises(ValueError, match="MY_SERP_KEY"):
        SerpAPISearchEngine(api_key_env="MY_SERP_KEY")


def test_keys_stay_out_of_reprs_and_errors(serve, keys):
    # A hostile server echoes the key it received into its error body.
    echo = serve(lambda seen: (400, f"bad key {seen.headers['x-api-key']}".encode(), {}))
    web = SerperSearchEngine(base_url=echo.url, **fast())
    assert SERPER_KEY not in repr(web) and "SERPER_API_KEY" in repr(web)
    with pytest.raises(SearchServiceError) as info:
        web.search([SearchRequest("x")])
    assert SERPER_KEY not in str(info.value) and "bad key ***" in str(info.value)

    echo_q = serve(lambda seen: (500, f"failed for {seen.query}".encode(), {}))
    web2 = SerpAPISearchEngine(base_url=echo_q.url, max_retries=0, **fast())
    assert SERPAPI_KEY not in repr(web2)
    with pytest.raises(SearchServiceError) as info:
        web2.search([SearchRequest("x")])
    assert SERPAPI_KEY not in str(info.value) and echo_q.url in str(info.value)


def test_serpapi_sends_the_documented_query_and_reads_organic_results(serve, keys, caplog):
    server = serve(serpapi)
    web = SerpAPISearchEngine(base_url=server.url + "/search", **fast())
    with caplog.at_level(logging.INFO, logger="httpx"):
        out = web.search([SearchRequest("berlin", top_k=4)])
    assert [d.title for d in out[0]] == [f"berlin result {p}" for p in range(1, 5)]
    assert out[0][0].source == "serpapi" and out[0][0].text == "Snippet 1 about berlin."
    seen = server.seen[0]
    assert seen.method == "GET" and seen.path == "/search"
    assert {k: v[0] for k, v in seen.query.items()} == {
        "engine": "google",
        "q": "berlin",
        "num": "4",
        "api_key": SERPAPI_KEY,
    }
    # httpx logs every request URL at INFO; the key is added below that layer.
    messages = [r.getMessage() for r in caplog.records]
    assert any(server.url in m for m in messages)
    assert not any(SERPAPI_KEY in m for m in messages)


def test_serpapi_no_results_is_empty_but_account_errors_raise(serve, keys):
    server = serve(serpapi)
    web = SerpAPISearchEngine(base_url=server.url, **fast())
    assert web.search([SearchRequest("nothing")]) == [[]]

    account = serve(lambda seen: (200, {"error": "Your account has run out of searches."}, {}))
    web = SerpAPISearchEngine(base_url=account.url, **fast())
    with pytest.raises(SearchServiceError, match="run out of searches"):
        web.search([SearchRequest("x")])


def test_serpapi_bad_key_is_not_retried(serve, monkeypatch):
    monkeypatch.setenv("SERPAPI_API_KEY", "wrong-key")
    server = serve(serpapi)
    web = SerpAPISearchEngine(base_url=server.url, max_retries=3, **fast())
    with pytest.raises(SearchServiceError, match=r"HTTP 401.*Invalid API key"):
        web.search([SearchRequest("x")])
    assert len(server.seen) == 1


def test_serpapi_goes_through_the_environment_proxy_with_its_key(serve, keys, monkeypatch):
    # The fake plays an HTTP proxy: httpx sends it the absolute target URL.
    proxy = serve(serpapi)
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    web = SerpAPISearchEngine(base_url="http://serpapi.invalid/search", **fast())
    assert web.search([SearchRequest("oslo", top_k=1)])[0][0].title == "oslo result 1"
    assert proxy.seen[0].query["api_key"] == [SERPAPI_KEY]
