"""OpenAIEngine over several replicas that are real processes on 127.0.0.1.

tests/generation/test_openai.py covers the request mapping, retries, and failover when an in-thread
server closes its port. Here each replica is its own process (a fake of `vllm serve`'s
/v1/completions), so the tests see what a training run sees when a node dies: a process killed
with SIGKILL in the middle of a request (connection reset, no answer), a replica restarted on the
same port, every replica dying mid-run. They also check how work is spread: every replica gets
a share, no replica gets two requests in flight while another idles, a slow replica gets less.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from simsearch.generation.openai import OpenAIEngine
from simsearch.httpclient import GenerationServiceError
from simsearch.types import SamplingParams

# A fake `vllm serve`: POST /v1/completions answers sample j of prompt p with "p#j@PORT" after
# DELAY seconds; GET /stats reports what it answered and its peak concurrency.
SERVER = r"""
import json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, delay = int(sys.argv[1]), float(sys.argv[2])
lock = threading.Lock()
state = {"answered": [], "in_flight": 0, "max_in_flight": 0}

class Handler(BaseHTTPRequestHandler):
    def _send(self, payload):
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        with lock:
            self._send(state if self.path == "/stats" else {})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        with lock:
            state["in_flight"] += 1
            state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
        time.sleep(delay)
        choices = [
            {"index": i * body["n"] + j, "text": f"{p}#{j}@{bound}", "finish_reason": "length",
             "stop_reason": None, "token_ids": [1000 + j]}
            for i, p in enumerate(body["prompt"]) for j in range(body["n"])
        ]
        with lock:
            state["in_flight"] -= 1
            state["answered"].extend(body["prompt"])
        self._send({"choices": choices})

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
bound = server.server_address[1]
print(bound, flush=True)
server.serve_forever()
"""


class Replica:
    """One fake server process; `port=0` lets the OS choose."""

    def __init__(self, delay: float, port: int = 0) -> None:
        self.delay = delay
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(port), str(delay)],
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("fake replica did not start")
        self.port = int(line)
        self.url = f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict[str, Any]:
        return httpx.get(self.url + "/stats", timeout=5).json()

    def kill(self) -> None:
        """SIGKILL: the process dies at once, requests in flight get their connection reset."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture
def replicas() -> Iterator[Any]:
    started: list[Replica] = []

    def start(delay: float, port: int = 0) -> Replica:
        replica = Replica(delay, port)
        started.append(replica)
        return replica

    yield start
    for replica in started:
        replica.kill()


def engine(urls: list[str], **kwargs: Any) -> OpenAIEngine:
    kwargs.setdefault("max_prompts_per_request", 1)  # one request per prompt: countable
    kwargs.setdefault("backoff_s", 0.01)
    kwargs.setdefault("timeout_s", 10.0)
    return OpenAIEngine(urls, "fake-simulator", **kwargs)


def kill_when_busy(replica: Replica, also: Replica | None = None) -> threading.Thread:
    """Kills `replica` (and `also`) as soon as it has a request in flight."""

    def watch() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and replica.stats()["in_flight"] == 0:
            time.sleep(0.005)
        replica.kill()
        if also is not None:
            also.kill()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def prompts(n: int, tag: str = "p") -> list[str]:
    return [f"{tag}{i}" for i in range(n)]


def served_by(texts: list[str]) -> list[int]:
    return [int(t.rsplit("@", 1)[1]) for t in texts]


def test_work_is_spread_over_every_replica_one_request_in_flight_each(replicas):
    group = [replicas(0.05) for _ in range(3)]
    with engine([r.url for r in group], max_concurrency=3) as gen:
        out = gen.generate(prompts(12), SamplingParams(max_new_tokens=8))
    assert [c.text.split("@")[0] for c in out] == [f"p{i}#0" for i in range(12)]
    stats = [r.stats() for r in group]
    # 3 requests in flight over 3 replicas, fewest-in-flight first: never 2 on one replica.
    assert [s["max_in_flight"] for s in stats] == [1, 1, 1]
    assert all(len(s["answered"]) >= 2 for s in stats)
    assert sorted(p for s in stats for p in s["answered"]) == sorted(prompts(12))


def test_a_slow_replica_gets_less_work(replicas):
    slow, fast = replicas(1.0), replicas(0.0)
    with engine([slow.url, fast.url], max_concurrency=2) as gen:
        out = gen.generate(prompts(10), SamplingParams(max_new_tokens=8))
    assert len(out) == 10
    # The slow replica holds its first request for 1 s, while the fast one answers the rest.
    assert len(slow.stats()["answered"]) <= 2
    assert len(fast.stats()["answered"]) >= 8


def test_a_replica_killed_mid_request_fails_over_without_losing_or_repeating_work(replicas):
    doomed, survivor = replicas(0.5), replicas(0.02)
    with engine([doomed.url, survivor.url], max_concurrency=2, max_retries=2, cooldown_s=60.0) as gen:
        watcher = kill_when_busy(doomed)
        out = gen.generate(prompts(8), SamplingParams(max_new_tokens=8))
        watcher.join(timeout=10)
        assert doomed.proc.poll() is not None  # it really died during the call
        assert [c.text for c in out] == [f"p{i}#0@{survivor.port}" for i in range(8)]
        # The killed request was retried once on the survivor: each prompt answered once.
        assert sorted(survivor.stats()["answered"]) == sorted(prompts(8))
        assert gen.replicas.healthy() == [survivor.url]


def test_a_restarted_replica_gets_work_again_after_the_cooldown(replicas):
    first, other = replicas(0.05), replicas(0.05)
    with engine([first.url, other.url], max_concurrency=2, cooldown_s=0.3) as gen:
        first.kill()
        gen.generate(prompts(2, "a"), SamplingParams(max_new_tokens=8))
        assert gen.replicas.healthy() == [other.url]
        back = replicas(0.05, port=first.port)  # same address, new process
        time.sleep(0.35)  # past the cooldown
        out = gen.generate(prompts(6, "b"), SamplingParams(max_new_tokens=8))
    assert back.port in served_by([c.text for c in out])
    assert len(back.stats()["answered"]) >= 1


def test_every_replica_dying_mid_run_is_a_clear_error_not_a_hang(replicas):
    a, b = replicas(0.5), replicas(0.5)
    start = time.monotonic()
    with engine([a.url, b.url], max_concurrency=2, max_retries=3) as gen:
        watcher = kill_when_busy(a, also=b)
        with pytest.raises(GenerationServiceError) as info:
            gen.generate(prompts(4), SamplingParams(max_new_tokens=8))
        watcher.join(timeout=10)
    message = str(info.value)
    assert a.url in message and b.url in message and "attempt(s)" in message
    assert time.monotonic() - start < 15  # bounded retries with backoff, then the error
