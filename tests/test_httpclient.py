"""Tests for simsearch.httpclient against a scripted HTTP server on 127.0.0.1."""

from __future__ import annotations

import calendar
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from simsearch.errors import ServiceError, SimsearchError
from simsearch.httpclient import (
    GenerationServiceError,
    ReplicaSet,
    SearchServiceError,
    ServerKey,
    backoff_delay,
    bearer_headers,
    env_secret,
    parse_retry_after,
    post_json,
    redact,
    request_json,
    run_concurrently,
)
from tests.servers import (  # the `serve` fixture is in conftest.py
    Seen,
    dead_url,
)


def scripted(*replies: Any) -> Callable[[Seen], Any]:
    """Answers request i with replies[i]; the last reply repeats."""
    count = [0]

    def reply(seen: Seen) -> Any:
        i = min(count[0], len(replies) - 1)
        count[0] += 1
        answer = replies[i]
        return answer(seen) if callable(answer) else answer

    return reply


OK = (200, {"ok": True}, {})
FAIL = (500, b"internal error", {})


@pytest.fixture
def client():
    with httpx.Client() as c:
        yield c


# --- pure helpers


def test_backoff_delay_doubles_caps_and_jitters():
    # base = min(max, backoff * 2**i); delay = base * (0.5 + 0.5 * jitter)
    assert backoff_delay(0, 0.5, 3.0, 0.0) == pytest.approx(0.25)  # 0.5 * 0.5
    assert backoff_delay(1, 0.5, 3.0, 0.0) == pytest.approx(0.5)  # 1.0 * 0.5
    assert backoff_delay(2, 0.5, 3.0, 0.5) == pytest.approx(1.5)  # 2.0 * 0.75
    assert backoff_delay(3, 0.5, 3.0, 0.0) == pytest.approx(1.5)  # min(3, 4) = 3 -> 3 * 0.5
    assert backoff_delay(30, 0.5, 3.0, 1.0) == pytest.approx(3.0)  # capped, full jitter


def test_parse_retry_after_seconds_and_http_date():
    assert parse_retry_after(None, 0.0) is None
    assert parse_retry_after("2", 0.0) == 2.0
    assert parse_retry_after(" 0.25 ", 0.0) == 0.25
    assert parse_retry_after("-5", 0.0) == 0.0
    assert parse_retry_after("soon", 0.0) is None
    when = calendar.timegm((2015, 10, 21, 7, 28, 0))
    # The date is 7 s after `now`.
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", when - 7.0) == pytest.approx(7.0)
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", when + 60.0) == 0.0


def test_redact_masks_every_secret():
    assert redact("key=abc123 again abc123", ("abc123", "")) == "key=*** again ***"


def test_error_classes_are_service_errors():
    assert issubclass(SearchServiceError, ServiceError)
    assert issubclass(GenerationServiceError, SimsearchError)


# --- request_json against a live local server


def test_post_json_sends_payload_and_headers(serve, client):
    server = serve(scripted(lambda seen: (200, {"echo": seen.json()}, {})))
    data = post_json(
        client,
        server.url + "/x",
        {"a": [1, 2]},
        retries=0,
        backoff_s=0.01,
        timeout_s=2.0,
        headers={"X-Test": "yes"},
    )
    assert data == {"echo": {"a": [1, 2]}}
    assert server.seen[0].method == "POST" and server.seen[0].path == "/x"
    assert server.seen[0].headers["x-test"] == "yes"


def test_transient_500s_are_retried_until_success(serve, client):
    server = serve(scripted(FAIL, FAIL, OK))
    data = post_json(client, server.url, {}, retries=3, backoff_s=0.001, timeout_s=2.0)
    assert data == {"ok": True}
    assert len(server.seen) == 3


def test_retries_are_bounded_and_the_error_names_url_attempts_and_cause(serve, client):
    server = serve(scripted(FAIL))
    with pytest.raises(SearchServiceError) as info:
        post_json(
            client,
            server.url + "/retrieve",
            {},
            retries=2,
            backoff_s=0.001,
            timeout_s=2.0,
            error_cls=SearchServiceError,
        )
    assert len(server.seen) == 3  # 1 attempt + 2 retries, then stop
    message = str(info.value)
    assert server.url + "/retrieve" in message
    assert "3 attempt(s)" in message and "HTTP 500" in message and "internal error" in message


def test_client_errors_are_not_retried(serve, client):
    server = serve(scripted((404, b"no such route", {})))
    with pytest.raises(ServiceError, match=r"HTTP 404.*no such route"):
        post_json(client, server.url, {}, retries=5, backoff_s=0.001, timeout_s=2.0)
    assert len(server.seen) == 1


def test_backoff_grows_between_retries(serve, client):
    server = serve(scripted(FAIL))
    delays: list[float] = []
    with pytest.raises(ServiceError):
        request_json(client, "POST", server.url, retries=3, backoff_s=0.1, timeout_s=2.0, sleep=delays.append)
    # Retry i sleeps in [0.1 * 2**i / 2, 0.1 * 2**i).
    assert len(delays) == 3
    for i, delay in enumerate(delays):
        assert 0.05 * 2**i <= delay < 0.1 * 2**i


def test_429_retry_after_is_honoured_and_capped(serve, client):
    server = serve(scripted((429, b"slow down", {"Retry-After": "0.7"}), OK))
    delays: list[float] = []
    data = request_json(client, "GET", server.url, retries=2, backoff_s=5.0, timeout_s=2.0, sleep=delays.append)
    assert data == {"ok": True} and delays == [0.7]  # the server's 0.7 s, not the 5 s backoff

    server = serve(scripted((429, b"slow down", {"Retry-After": "100"}), OK))
    delays = []
    request_json(
        client,
        "GET",
        server.url,
        retries=2,
        backoff_s=5.0,
        timeout_s=2.0,
        max_retry_after_s=0.05,
        sleep=delays.append,
    )
    assert delays == [0.05]


def test_malformed_json_is_retried_then_reported(serve, client):
    server = serve(scripted((200, b"{not json", {}), OK))
    assert post_json(client, server.url, {}, retries=1, backoff_s=0.001, timeout_s=2.0) == {"ok": True}
    assert len(server.seen) == 2

    server = serve(scripted((200, b"{not json", {})))
    with pytest.raises(ServiceError, match="malformed JSON"):
        post_json(client, server.url, {}, retries=2, backoff_s=0.001, timeout_s=2.0)
    assert len(server.seen) == 3

    server = serve(scripted((200, b"[1, 2]", {})))
    with pytest.raises(ServiceError, match="expected a JSON object, got list"):
        post_json(client, server.url, {}, retries=0, backoff_s=0.001, timeout_s=2.0)


def test_slow_server_times_out_fast_and_bounded(serve, client):
    def slow(seen: Seen) -> Any:
        time.sleep(5.0)
        return OK

    server = serve(slow)
    start = time.monotonic()
    with pytest.raises(ServiceError, match=r"ReadTimeout.*timeout_s=0.2"):
        post_json(client, server.url, {}, retries=1, backoff_s=0.001, timeout_s=0.2)
    # two 0.2 s timeouts (0.4 s), 10x under the bound for a loaded machine; waiting for the server's
    # answer even once would take 5 s
    assert time.monotonic() - start < 4.0
    assert len(server.seen) == 2


def test_dead_port_fails_fast_with_a_clear_error(client):
    url = dead_url()
    start = time.monotonic()
    with pytest.raises(ServiceError) as info:
        post_json(client, url + "/v1/completions", {}, retries=2, backoff_s=0.01, timeout_s=30.0)
    assert time.monotonic() - start < 10.0  # a refused connection is not waited on: far under one 30 s timeout
    message = str(info.value)
    assert url in message and "ConnectError" in message and "3 attempt(s)" in message


def test_url_without_scheme_is_not_retried(client):
    with pytest.raises(ServiceError, match="http:// or https://"):
        post_json(client, "localhost:1/x", {}, retries=5, backoff_s=1.0, timeout_s=2.0)


def test_secrets_never_reach_error_messages(serve, client):
    # A hostile server echoes the Authorization header in its error body.
    server = serve(lambda seen: (401, seen.headers["authorization"].encode(), {}))
    with pytest.raises(ServiceError) as info:
        post_json(
            client,
            server.url,
            {},
            retries=0,
            backoff_s=0.001,
            timeout_s=2.0,
            headers={"Authorization": "Bearer sk-topsecret"},
            secrets=("sk-topsecret",),
        )
    assert "sk-topsecret" not in str(info.value) and "Bearer ***" in str(info.value)


def test_bad_bounds_are_rejected(client):
    with pytest.raises(ValueError, match="retries"):
        post_json(client, "http://127.0.0.1:1", {}, retries=-1, backoff_s=0.1, timeout_s=1.0)
    with pytest.raises(ValueError, match="timeout_s"):
        post_json(client, "http://127.0.0.1:1", {}, retries=0, backoff_s=0.1, timeout_s=0.0)


# --- replicas


def test_replica_set_balances_by_load_and_cools_down_failures():
    replicas = ReplicaSet(["http://a", "http://b"], cooldown_s=0.05)
    first, fresh = replicas.acquire()
    second, _ = replicas.acquire()
    assert fresh and {first, second} == {"http://a", "http://b"}  # least in flight
    replicas.release(first, failed=True)
    replicas.release(second, failed=False)
    assert replicas.healthy() == [second]
    for _ in range(3):  # every pick avoids the failed replica while it cools down
        url, _ = replicas.acquire()
        assert url == second
        replicas.release(url, failed=False)
    time.sleep(0.06)
    assert replicas.healthy() == ["http://a", "http://b"]


def test_replica_set_when_all_down_tries_the_soonest_back():
    replicas = ReplicaSet(["http://a", "http://b"], cooldown_s=10.0)
    replicas.acquire()
    replicas.acquire()
    replicas.release("http://b", failed=True)
    time.sleep(0.01)
    replicas.release("http://a", failed=True)
    url, fresh = replicas.acquire()
    assert (url, fresh) == ("http://b", False)


def test_failover_to_a_live_replica_is_immediate(serve, client):
    server = serve(scripted(OK))
    dead = dead_url()
    replicas = ReplicaSet([dead, server.url], cooldown_s=30.0)
    delays: list[float] = []
    for _ in range(3):
        data = request_json(
            client,
            "POST",
            replicas,
            path="/v1/completions",
            retries=2,
            backoff_s=1.0,
            timeout_s=2.0,
            sleep=delays.append,
        )
        assert data == {"ok": True}
    assert delays == []  # switching to an untried healthy replica needs no backoff
    assert replicas.healthy() == [server.url]
    assert len(server.seen) == 3 and server.seen[0].path == "/v1/completions"


def test_all_replicas_down_names_them_all():
    dead_a, dead_b = dead_url(), dead_url()
    with httpx.Client() as client, pytest.raises(GenerationServiceError) as info:
        request_json(
            client,
            "POST",
            ReplicaSet([dead_a, dead_b]),
            path="/v1/completions",
            retries=3,
            backoff_s=0.001,
            timeout_s=2.0,
            error_cls=GenerationServiceError,
        )
    message = str(info.value)
    assert dead_a in message and dead_b in message and "4 attempt(s)" in message


# --- concurrency


def test_run_concurrently_keeps_order_and_bounds_concurrency():
    lock = threading.Lock()
    in_flight = [0, 0]  # current, max

    def work(x: int) -> int:
        with lock:
            in_flight[0] += 1
            in_flight[1] = max(in_flight[1], in_flight[0])
        time.sleep(0.02 * (5 - x))  # later items finish first
        with lock:
            in_flight[0] -= 1
        return x * x

    assert run_concurrently(work, [0, 1, 2, 3, 4], max_workers=2) == [0, 1, 4, 9, 16]
    assert in_flight[1] == 2


def test_run_concurrently_propagates_the_first_error():
    def work(x: int) -> int:
        if x == 2:
            raise SearchServiceError("boom at 2")
        return x

    with pytest.raises(SearchServiceError, match="boom at 2"):
        run_concurrently(work, [0, 1, 2, 3], max_workers=2)


def test_env_secret_reads_the_variable_and_names_it_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIMSEARCH_TEST_KEY", "k-123")
    assert env_secret("Client", "SIMSEARCH_TEST_KEY", "export it") == "k-123"
    monkeypatch.setenv("SIMSEARCH_TEST_KEY", "")  # empty counts as unset
    with pytest.raises(ValueError, match=r"^Client: environment variable SIMSEARCH_TEST_KEY is not set; export it$"):
        env_secret("Client", "SIMSEARCH_TEST_KEY", "export it")


def test_bearer_headers() -> None:
    assert bearer_headers("t0k") == {"Authorization": "Bearer t0k"}
    assert bearer_headers(None) == {} and bearer_headers("") == {}


def test_server_key_from_the_environment_or_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIMSEARCH_TEST_KEY", "k-123")
    key = ServerKey.from_env("Client", "SIMSEARCH_TEST_KEY", "bearer token")
    assert key.headers == {"Authorization": "Bearer k-123"} and key.secrets == ("k-123",)
    assert "k-123" not in repr(key)
    none = ServerKey.from_env("Client", None, "bearer token")  # a server without a key: nothing read
    assert none.value is None and none.headers == {} and none.secrets == ()
    monkeypatch.delenv("SIMSEARCH_TEST_KEY")
    hint = "export the server's bearer token in it, or pass api_key_env=None for a server without one"
    with pytest.raises(ValueError, match=rf"^Client: environment variable SIMSEARCH_TEST_KEY is not set; {hint}$"):
        ServerKey.from_env("Client", "SIMSEARCH_TEST_KEY", "bearer token")


def test_a_required_server_key_must_be_named_and_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIMSEARCH_TEST_KEY", "k-123")
    assert ServerKey.from_env("Web", "SIMSEARCH_TEST_KEY", "API key", required=True).value == "k-123"
    monkeypatch.delenv("SIMSEARCH_TEST_KEY")
    hint = r"export your API key in it \(keys are never read from recipes\), or name another variable with api_key_env="
    with pytest.raises(ValueError, match=rf"^Web: environment variable SIMSEARCH_TEST_KEY is not set; {hint}$"):
        ServerKey.from_env("Web", "SIMSEARCH_TEST_KEY", "API key", required=True)
    with pytest.raises(ValueError, match=r"^Web needs an API key: name the environment variable holding it"):
        ServerKey.from_env("Web", None, "API key", required=True)
