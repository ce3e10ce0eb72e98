"""The /retrieve server speaks Search-R1's protocol, rejects bad input with 4xx, and batches."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from simsearch.retrieval.server import create_app
from simsearch.types import Document, SearchRequest
from tests.servers import serve_in_thread


class RecordingEngine:
    """Returns `top_k` documents naming the query; records every call."""

    def __init__(self, delay_s: float = 0.0, fail: bool = False) -> None:
        self.calls: list[list[SearchRequest]] = []
        self.delay_s = delay_s
        self.fail = fail
        self.lock = threading.Lock()

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        with self.lock:
            self.calls.append(list(requests))
        time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("index unavailable")
        return [
            [
                Document(
                    title=f'"{r.query}"',
                    text=f"passage {i} noisy={r.num_noisy}",
                    score=1.0 / (i + 1),
                    id=f"{r.query}-{i}",
                )
                for i in range(r.top_k)
            ]
            for r in requests
        ]


def test_search_r1_response_shape_with_and_without_scores() -> None:
    engine = RecordingEngine()
    with serve_in_thread(create_app(engine, default_top_k=2)) as url:
        scored = httpx.post(
            f"{url}/retrieve", json={"queries": ["alpha", "beta"], "topk": 2, "return_scores": True}
        ).json()
        plain = httpx.post(f"{url}/retrieve", json={"queries": ["alpha"], "topk": None}).json()
    assert scored == {
        "result": [
            [
                {"document": {"id": "alpha-0", "contents": '"alpha"\npassage 0 noisy=0'}, "score": 1.0},
                {"document": {"id": "alpha-1", "contents": '"alpha"\npassage 1 noisy=0'}, "score": 0.5},
            ],
            [
                {"document": {"id": "beta-0", "contents": '"beta"\npassage 0 noisy=0'}, "score": 1.0},
                {"document": {"id": "beta-1", "contents": '"beta"\npassage 1 noisy=0'}, "score": 0.5},
            ],
        ]
    }
    # topk null -> the server's default; plain lists of documents without scores.
    assert plain == {
        "result": [
            [
                {"id": "alpha-0", "contents": '"alpha"\npassage 0 noisy=0'},
                {"id": "alpha-1", "contents": '"alpha"\npassage 1 noisy=0'},
            ]
        ]
    }


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{not json", 422, "invalid request"),
        (b'{"queries": []}', 422, "queries"),
        (b'{"queries": "alpha"}', 422, "queries"),
        (b'{"queries": ["a"], "topk": 0}', 422, "topk"),
        (b'{"queries": ["a"], "topk": "three"}', 422, "topk"),
        (b'{"queries": ["a", "b"], "noisy": [true]}', 422, "'noisy' has 1 entries for 2 queries"),
        (b'{"queries": ["a"], "topk": 2, "noisy": [5]}', 422, "noisy[0]=5"),
        (b'{"queries": ["a"] }' + b" " * 5000, 413, "over 4096 bytes"),
        (b'{"queries": ["a", "b", "c", "d", "e"]}', 413, "over the limit of 4"),
    ],
)
def test_bad_requests_get_4xx_with_a_message(body: bytes, status: int, fragment: str) -> None:
    engine = RecordingEngine()
    app = create_app(engine, max_body_bytes=4096, max_queries_per_request=4)
    with serve_in_thread(app) as url:
        response = httpx.post(f"{url}/retrieve", content=body, headers={"content-type": "application/json"})
        healthy = httpx.get(f"{url}/health").json()
    assert response.status_code == status
    assert fragment in response.json()["error"]
    assert engine.calls == [] and healthy["status"] == "ok"


def test_simulator_fields_reach_the_engine() -> None:
    engine = RecordingEngine()
    with serve_in_thread(create_app(engine)) as url:
        httpx.post(
            f"{url}/retrieve",
            json={
                "queries": ["q1", "q2"],
                "topk": 3,
                "question": ["Who?", None],
                "golden_answers": [["Ann"], []],
                "noisy": [True, 1],
            },
        )
        httpx.post(f"{url}/retrieve", json={"queries": ["q3"], "topk": 3, "p_noise": 1.0})
    first, second = engine.calls
    assert [(r.query, r.question, r.golden_answers, r.num_noisy) for r in first] == [
        ("q1", "Who?", ["Ann"], 3),
        ("q2", None, [], 1),
    ]
    assert second[0].num_noisy == 3  # p_noise=1: every coin says noisy, all of top-k


class GatedEngine(RecordingEngine):
    """Holds its first call until the other `expected - 1` HTTP requests wait in the server's queue."""

    def __init__(self, expected: int) -> None:
        super().__init__()
        self.expected = expected
        self.app = None

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        if not self.calls:
            deadline = time.monotonic() + 20
            while self.app.state.stats.queued < self.expected - 1 and time.monotonic() < deadline:
                time.sleep(0.01)
        return super().search(requests)


def test_concurrent_requests_are_coalesced_into_fewer_engine_calls() -> None:
    engine = GatedEngine(expected=16)
    engine.app = app = create_app(engine, max_batch=64)
    with serve_in_thread(app) as url:

        def one(i: int) -> int:
            response = httpx.post(f"{url}/retrieve", json={"queries": [f"q{i}"], "topk": 1}, timeout=30)
            assert response.json()["result"][0][0]["id"] == f"q{i}-0"  # each gets its own answer
            return response.status_code

        with ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(one, range(16)))
    assert codes == [200] * 16
    # The first call waits until the other 15 requests are queued; they then go to the engine
    # together: 16 requests, 2 engine calls.
    assert len(engine.calls) == 2
    assert sum(len(call) for call in engine.calls) == 16
    assert app.state.stats.queued == 0


def test_bearer_token_guards_retrieve() -> None:
    engine = RecordingEngine()
    with serve_in_thread(create_app(engine, token="s3cret")) as url:
        denied = httpx.post(f"{url}/retrieve", json={"queries": ["a"]})
        wrong = httpx.post(f"{url}/retrieve", json={"queries": ["a"]}, headers={"Authorization": "Bearer nope"})
        allowed = httpx.post(f"{url}/retrieve", json={"queries": ["a"]}, headers={"Authorization": "Bearer s3cret"})
    assert (denied.status_code, wrong.status_code, allowed.status_code) == (401, 401, 200)
    assert "s3cret" not in denied.text


def test_engine_failure_is_a_503_and_the_server_keeps_serving() -> None:
    engine = RecordingEngine(fail=True)
    with serve_in_thread(create_app(engine)) as url:
        first = httpx.post(f"{url}/retrieve", json={"queries": ["a"]})
        engine.fail = False
        second = httpx.post(f"{url}/retrieve", json={"queries": ["a"]})
        health = httpx.get(f"{url}/health").json()
    assert first.status_code == 503 and "index unavailable" in first.json()["error"]
    assert second.status_code == 200
    assert health["errors"] == 1 and health["engine_calls"] == 2
