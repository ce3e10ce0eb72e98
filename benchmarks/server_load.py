"""The /retrieve server under load: 200 concurrent clients for 30 s against BM25 over 20k passages.

    python -m benchmarks.server_load                              # the published figures
    python -m benchmarks.server_load --clients 50 --duration 10   # a quick run

The server is `simsearch.retrieval.server.create_app` over a real `BM25SearchEngine`, built on a
synthetic corpus generated from `--seed` (60-word passages, 3-word titles, words drawn from a
Zipf distribution over made-up words) and served by uvicorn on 127.0.0.1 in a separate process,
so the load generator does not share its interpreter. The load generator is one asyncio loop of
`--clients` keep-alive HTTP/1.1 connections (a minimal client, see `Connection`), each sending one
Search-R1 request (`--queries-per-request` queries, topk 3) after another until `--duration`
seconds have passed (and never more than `--max-requests` in all); every request has a 30 s
timeout, so the run ends by itself. Alongside, one request per second carries
a body over the server's `max_body_bytes`, which must be refused with 413 without disturbing
the others.

Measured: requests completed, errors (any status but 200, or a transport error), latency
percentiles, the server process's RSS sampled every second (reported at start, middle, end),
and oversize bodies refused with 413. Prints a table, then a JSON line of the figures (last line).

The curriculum arm (`--arm-rounds`, 0 skips it): a second server process over the same corpus runs
a `ServedCurriculum` (ZeroSearch's exponential curve, moved by the searches served, per query a
`num_noisy` draw), and after a discarded 1 s warm-up pass each, passes of `--arm-duration` seconds
alternate between the two servers (plain first in even rounds, second in odd ones), `--arm-rounds`
times each, so both arms see the same machine load. Reported per arm: the median of
the passes' p99 latencies, 5xx answers and other errors; the target is no 5xx and the curriculum
arm's p99 within 10% of the plain one's.

`measure_server_over_direct(engine, queries, queries_per_request)` is the server section of
benchmarks/retrieval.py: the same engine called directly versus behind the server with 32
concurrent clients, the same number of queries per engine call as per HTTP request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import psutil

from simsearch.retrieval.base import SearchEngine
from simsearch.types import Passage, SearchRequest

if TYPE_CHECKING:
    import uvicorn

MODULE = "benchmarks.server_load"  # its server and load processes: `python -m MODULE`, started where this one was
WORDS_PER_PASSAGE = 60
VOCAB_SIZE = 50_000
ZIPF_EXPONENT = 1.07
QUERY_WORDS = 3
COMMON_WORDS_SKIPPED = 100
TOP_K = 3
REQUEST_TIMEOUT_S = 30.0
MAX_BODY_BYTES = 1_000_000


# --------------------------------------------------------------------------- corpus


def synthetic_corpus(num_passages: int, seed: int) -> tuple[list[Passage], list[str]]:
    """Seeded passages over made-up words, and one query per passage (3 of its rarer words)."""
    rng = np.random.default_rng(seed)
    syllables = np.array([c + v for c in "bcdfghjklmnprstvz" for v in "aeiou"])
    vocab: list[str] = []
    seen: set[str] = set()
    while len(vocab) < VOCAB_SIZE:
        word = "".join(rng.choice(syllables, size=rng.integers(2, 5)))
        if word not in seen:
            seen.add(word)
            vocab.append(word)
    words = np.array(vocab)
    p = 1.0 / np.arange(1, VOCAB_SIZE + 1) ** ZIPF_EXPONENT
    p /= p.sum()
    ranks = rng.choice(VOCAB_SIZE, size=(num_passages, WORDS_PER_PASSAGE), p=p)
    titles = rng.choice(VOCAB_SIZE, size=(num_passages, 3), p=p)
    passages = [
        Passage(id=str(i), title=" ".join(words[t]).title(), text=" ".join(words[r]))
        for i, (t, r) in enumerate(zip(titles, ranks, strict=True))
    ]
    queries = []
    for r in ranks:
        rare = r[r >= COMMON_WORDS_SKIPPED]
        queries.append(" ".join(words[rng.choice(rare, size=min(QUERY_WORDS, len(rare)), replace=False)]))
    return passages, queries


# --------------------------------------------------------------------------- the server process


def serve(port: int, passages: int, seed: int, curriculum: bool = False) -> None:
    """Server mode (run in a child process): build BM25 over the corpus and serve it, with the
    curriculum of the curriculum arm when `curriculum`."""
    import uvicorn

    from simsearch.retrieval.bm25 import BM25SearchEngine
    from simsearch.retrieval.server import create_app

    corpus, _ = synthetic_corpus(passages, seed)
    engine = BM25SearchEngine.build(corpus, show_progress=False)
    served = arm_curriculum() if curriculum else None
    app = create_app(engine, default_top_k=TOP_K, max_body_bytes=MAX_BODY_BYTES, curriculum=served)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def arm_curriculum() -> Any:
    """The curriculum arm's schedule: ZeroSearch's exponential 0 -> 0.5 over 200 steps, moved by
    searches served against 200,000 (every request takes the search-count path and a noise draw)."""
    from simsearch.curriculum.schedules import make_schedule
    from simsearch.curriculum.served import ServedCurriculum

    settings = {"p_start": 0.0, "p_end": 0.5, "total_steps": 200, "base": 4.0}
    return ServedCurriculum(
        lambda: make_schedule("exponential", **settings), total_steps=200, total_searches=200_000, granularity="call"
    )


def start_server(port: int, passages: int, seed: int, curriculum: bool) -> subprocess.Popen:
    """This script in server mode, in a child process."""
    command = [sys.executable, "-m", MODULE, "--serve", str(port), "--passages", str(passages), "--seed", str(seed)]
    return subprocess.Popen(command + (["--serve-curriculum"] if curriculum else []))


def stop_server(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(timeout=30)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_healthy(url: str, process: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server process exited with {process.returncode} before answering")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server at {url} did not answer /health within {timeout_s} s")


# --------------------------------------------------------------------------- the load


class Load:
    """Counters shared by the client tasks (one event loop: no lock needed)."""

    def __init__(self) -> None:
        self.latencies_ms: list[float] = []
        self.errors = 0
        self.error_kinds: dict[str, int] = {}
        self.oversize_sent = 0
        self.oversize_rejected = 0
        self.wall_s = 0.0

    def error(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1

    def summary(self) -> dict[str, Any]:
        return {
            "latencies_ms": self.latencies_ms,
            "errors": self.errors,
            "error_kinds": self.error_kinds,
            "oversize_sent": self.oversize_sent,
            "oversize_rejected": self.oversize_rejected,
            "wall_s": self.wall_s,
        }


class Connection:
    """One keep-alive HTTP/1.1 connection speaking just enough of the protocol for POST + JSON.

    A hand-written client rather than httpx: httpx's asyncio client spends about 4 ms of CPU per
    request (measured here), three times what the server spends, so on 2 CPUs it would measure
    the load generator instead of the server.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        status = int(status_line.split()[1])
        length, close = 0, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "connection" and "close" in value.lower():
                close = True
        data = await self.reader.readexactly(length)
        if close:
            await self.close()
        return status, data

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None


def chunked(queries: list[str], size: int) -> list[list[str]]:
    """`queries` in consecutive groups of `size`, dropping the last group if it is short."""
    if not 1 <= size <= len(queries):
        raise ValueError(f"queries_per_request={size} must lie in [1, {len(queries)}] (the number of queries)")
    return [queries[i : i + size] for i in range(0, len(queries) - size + 1, size)]


async def client_loop(
    host: str, port: int, groups: list[list[str]], offset: int, stop_at: float, budget: list[int], load: Load
) -> None:
    """Sends one group of queries per request, from `offset` on, while time and `budget` last."""
    connection = Connection(host, port)
    i = offset
    while time.monotonic() < stop_at and budget[0] > 0:
        budget[0] -= 1
        group = groups[i % len(groups)]
        body = json.dumps({"queries": group, "topk": TOP_K, "return_scores": True}).encode()
        i += 1
        start = time.perf_counter()
        try:
            status, data = await asyncio.wait_for(connection.post("/retrieve", body), REQUEST_TIMEOUT_S)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, IndexError) as err:
            load.error(type(err).__name__)
            await connection.close()
            continue
        elapsed_ms = (time.perf_counter() - start) * 1000
        if status != 200:
            load.error(f"HTTP {status}")
            continue
        result = json.loads(data)["result"]
        if len(result) != len(group) or not all(0 < len(docs) <= TOP_K for docs in result):
            load.error("wrong result shape")
            continue
        load.latencies_ms.append(elapsed_ms)
    await connection.close()


async def oversize_loop(host: str, port: int, stop_at: float, load: Load) -> None:
    """One request per second whose body is over the server's limit (it must get 413)."""
    body = json.dumps({"queries": ["x" * (MAX_BODY_BYTES + 1000)]}).encode()
    while time.monotonic() < stop_at:
        load.oversize_sent += 1
        connection = Connection(host, port)
        try:
            status, _ = await asyncio.wait_for(connection.post("/retrieve", body), REQUEST_TIMEOUT_S)
            load.oversize_rejected += status == 413
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            pass
        await connection.close()
        await asyncio.sleep(1.0)


async def drive(
    url: str,
    queries: list[str],
    clients: int,
    duration_s: float,
    max_requests: int,
    oversize: bool,
    queries_per_request: int = 1,
) -> Load:
    """`clients` concurrent clients, each sending one request of `queries_per_request` queries
    after another, for `duration_s` seconds or `max_requests` requests in all, whichever ends first."""
    split = urlsplit(url)
    host, port = split.hostname or "127.0.0.1", split.port or 80
    load = Load()
    stop_at = time.monotonic() + duration_s
    budget = [max_requests]
    groups = chunked(queries, queries_per_request)
    step = max(1, len(groups) // clients)
    tasks = [client_loop(host, port, groups, c * step, stop_at, budget, load) for c in range(clients)]
    if oversize:
        tasks.append(oversize_loop(host, port, stop_at, load))
    began = time.perf_counter()
    await asyncio.gather(*tasks)
    load.wall_s = time.perf_counter() - began
    return load


def drive_in_subprocess(
    url: str, queries: list[str], clients: int, duration_s: float, max_requests: int, queries_per_request: int
) -> dict[str, Any]:
    """Runs `drive` in a child process (so it does not share the server's interpreter)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(queries, f)
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                MODULE,
                "--drive",
                url,
                "--queries-file",
                f.name,
                "--clients",
                str(clients),
                "--duration",
                str(duration_s),
                "--max-requests",
                str(max_requests),
                "--queries-per-request",
                str(queries_per_request),
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=duration_s + 3 * REQUEST_TIMEOUT_S + 60,
        )
    finally:
        os.unlink(f.name)
    return json.loads(out.stdout.splitlines()[-1])


def sample_rss(pid: int, stop: threading.Event, samples: list[tuple[float, float]]) -> None:
    process = psutil.Process(pid)
    start = time.monotonic()
    while not stop.is_set():
        samples.append((time.monotonic() - start, process.memory_info().rss / 2**20))
        stop.wait(1.0)


# --------------------------------------------------------------------------- server vs direct


def measure_server_over_direct(
    engine: SearchEngine,
    queries: list[str],
    queries_per_request: int,
    clients: int = 32,
    top_k: int = 3,
    max_seconds: float = 60.0,
    repeats: int = 1,
) -> dict[str, float]:
    """Queries/s of `engine` called directly vs behind the /retrieve server with concurrent clients.

    The work unit is the same on both sides: `queries` cut into groups of `queries_per_request`
    (a last short group is dropped). Direct: one `engine.search` call per group, one after
    another. Server: the same engine behind `create_app`, served by uvicorn on 127.0.0.1 in a
    thread of this process, and `clients` concurrent clients in a child process, each POSTing one
    group per request (as Search-R1's client and our rollout send a turn's queries in one POST);
    the server coalesces concurrent requests into batched engine calls. A pass sends every group
    once, and stops after `max_seconds`. Direct and server passes alternate `repeats` times and
    the fastest pass of each mode counts (as `timeit` takes the minimum): on a machine other jobs
    keep busy, a pass that lost its CPU to them measures them, not the server.

    Args:
        engine: any SearchEngine, already built.
        queries: the queries to send (each once per pass).
        queries_per_request: queries per HTTP request, and per direct `search` call.
        clients: concurrent HTTP clients.
        top_k: documents per query.
        max_seconds: time bound of each pass.
        repeats: passes of each mode.

    Returns:
        `direct_qps`, `server_qps` (queries answered per second, best pass),
        `server_over_direct` (server / direct), `server_over_direct_cpu` (direct CPU time per
        query over the server process's, best pass: what the ratio would be with a core each for
        the server and the clients and no other load), and over all passes
        `server_failed_requests` (non-200 answers, transport errors or malformed results) and
        `server_requests`.
    """
    groups = [[SearchRequest(q, top_k=top_k) for q in group] for group in chunked(queries, queries_per_request)]
    engine.search(groups[0])  # warm-up
    server, thread, port = serve_in_thread(engine, top_k)
    try:
        return alternate_passes(
            engine, groups, f"http://127.0.0.1:{port}", queries, clients, max_seconds, queries_per_request, repeats
        )
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def serve_in_thread(engine: SearchEngine, top_k: int) -> tuple[uvicorn.Server, threading.Thread, int]:
    """`create_app(engine)` served by uvicorn on 127.0.0.1 in a daemon thread of this process, once it has
    started; returns the server, its thread and its port."""
    import uvicorn

    from simsearch.retrieval.server import create_app

    port = free_port()
    app = create_app(engine, default_top_k=top_k)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the benchmark server did not start within 30 s")
        time.sleep(0.01)
    return server, thread, port


def direct_pass(engine: SearchEngine, groups: list[list[SearchRequest]], max_seconds: float) -> tuple[float, float]:
    """One `engine.search` call per group until `max_seconds`: queries/s and this process's CPU seconds per query."""
    start, start_cpu = time.perf_counter(), time.process_time()
    done = 0
    for group in groups:
        engine.search(group)
        done += len(group)
        if time.perf_counter() - start > max_seconds:
            break
    return done / (time.perf_counter() - start), (time.process_time() - start_cpu) / done


def alternate_passes(
    engine: SearchEngine,
    groups: list[list[SearchRequest]],
    url: str,
    queries: list[str],
    clients: int,
    max_seconds: float,
    queries_per_request: int,
    repeats: int,
) -> dict[str, float]:
    """`repeats` direct passes alternating with server passes against `url`; the figures of
    `measure_server_over_direct`."""
    direct_qps = server_qps = 0.0
    direct_cpu_s = server_cpu_s = math.inf  # CPU seconds per query, this process only
    failed = requests = 0
    for _ in range(repeats):
        qps, cpu_s = direct_pass(engine, groups, max_seconds)
        direct_qps = max(direct_qps, qps)
        direct_cpu_s = min(direct_cpu_s, cpu_s)

        # This process's CPU meanwhile is the server's alone: this thread waits on the child.
        start_cpu = time.process_time()
        load = drive_in_subprocess(url, queries, clients, max_seconds, len(groups), queries_per_request)
        answered = len(load["latencies_ms"])
        server_qps = max(server_qps, answered * queries_per_request / load["wall_s"])
        server_cpu_s = min(server_cpu_s, (time.process_time() - start_cpu) / max(answered * queries_per_request, 1))
        failed += load["errors"]
        requests += answered + load["errors"]
    return {
        "direct_qps": direct_qps,
        "server_qps": server_qps,
        "server_over_direct": server_qps / direct_qps,
        "server_over_direct_cpu": direct_cpu_s / server_cpu_s,
        "server_failed_requests": float(failed),
        "server_requests": float(requests),
    }


# --------------------------------------------------------------------------- the curriculum arm


def server_errors(load: Load) -> int:
    """The 5xx answers among a load's errors."""
    return sum(count for kind, count in load.error_kinds.items() if kind.startswith("HTTP 5"))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def curriculum_arms(plain_url: str, plain_pid: int, queries: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Passes alternating between the plain server (`plain_url`, process `plain_pid`) and a
    curriculum server started here over the same corpus, `args.arm_rounds` of each; per arm the
    median p99 and server CPU per request, 5xx and errors."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(port, args.passages, args.seed, curriculum=True)
    p99: dict[str, list[float]] = {"plain": [], "curriculum": []}
    cpu_ms: dict[str, list[float]] = {"plain": [], "curriculum": []}
    fivexx = dict.fromkeys(p99, 0)
    errors = dict.fromkeys(p99, 0)
    pids = {"plain": plain_pid, "curriculum": server.pid}
    try:
        wait_until_healthy(url, server)
        for target in (plain_url, url):  # a discarded warm-up pass each: page faults, caches
            asyncio.run(drive(target, queries, args.clients, 1.0, args.max_requests, oversize=False))
        for round_index in range(args.arm_rounds):
            order = [("plain", plain_url), ("curriculum", url)]
            for arm, target in order if round_index % 2 == 0 else order[::-1]:  # ABBA: neither arm always second
                began_cpu = cpu_seconds(pids[arm])
                load = asyncio.run(
                    drive(target, queries, args.clients, args.arm_duration, args.max_requests, oversize=False,
                          queries_per_request=args.queries_per_request)
                )  # fmt: skip
                p99[arm].append(float(np.percentile(load.latencies_ms or [math.nan], 99)))
                cpu_ms[arm].append(1000 * (cpu_seconds(pids[arm]) - began_cpu) / max(len(load.latencies_ms), 1))
                fivexx[arm] += server_errors(load)
                errors[arm] += load.errors
        place = httpx.get(f"{url}/health", timeout=10).json()["curriculum"]["(unnamed)"]
    finally:
        stop_server(server)
    medians = {arm: float(np.median(values)) for arm, values in p99.items()}
    return {
        "arm_p99_ms": {arm: round(value, 2) for arm, value in medians.items()},
        "arm_p99_passes_ms": {arm: [round(v, 2) for v in values] for arm, values in p99.items()},
        "arm_5xx": fivexx,
        "arm_errors": errors,
        "arm_p99_ratio": round(medians["curriculum"] / medians["plain"], 3),
        "arm_cpu_ms_per_request": {arm: round(float(np.median(values)), 3) for arm, values in cpu_ms.items()},
        "arm_curriculum_at": place,
    }


# --------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=200, help="concurrent clients")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load")
    parser.add_argument("--max-requests", type=int, default=2_000_000, help="bound on requests sent in all")
    parser.add_argument(
        "--queries-per-request", type=int, default=1, help="queries in each request's body (and per direct engine call)"
    )
    parser.add_argument("--passages", type=int, default=20_000, help="synthetic corpus size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--direct-queries",
        type=int,
        default=2_000,
        help="queries for the server-over-direct section (32 clients); 0 skips it",
    )
    parser.add_argument("--arm-rounds", type=int, default=3, help="curriculum arm: passes per arm (0 skips it)")
    parser.add_argument("--arm-duration", type=float, default=10.0, help="curriculum arm: seconds per pass")
    parser.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)  # child mode: the port
    parser.add_argument("--serve-curriculum", action="store_true", help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--drive", default="", help=argparse.SUPPRESS)  # child mode: the server URL
    parser.add_argument("--queries-file", default="", help=argparse.SUPPRESS)
    return parser.parse_args()


def drive_child(args: argparse.Namespace) -> None:
    """Load-generator child mode: drives `args.drive` with the queries of `--queries-file`, prints the load's JSON."""
    queries = json.loads(Path(args.queries_file).read_text())
    load = asyncio.run(
        drive(
            args.drive,
            queries,
            args.clients,
            args.duration,
            args.max_requests,
            oversize=False,
            queries_per_request=args.queries_per_request,
        )
    )
    print(json.dumps(load.summary()))


@dataclass
class LoadRun:
    """The main load against the plain server, with what was sampled alongside and the curriculum arms."""

    load: Load
    queries: list[str]
    rss_mb: list[float]
    health: dict[str, Any]
    arms: dict[str, Any]


def run_load(args: argparse.Namespace) -> LoadRun:
    """Starts the plain server, warms it up, drives it while sampling its RSS, then runs the curriculum arms."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(port, args.passages, args.seed, curriculum=False)
    arms: dict[str, Any] = {}
    try:
        wait_until_healthy(url, server)
        _, queries = synthetic_corpus(args.passages, args.seed)
        # Warm-up: a few requests, so the first figures are not import or page-fault time.
        for query in queries[:20]:
            httpx.post(f"{url}/retrieve", json={"queries": [query], "topk": TOP_K}, timeout=REQUEST_TIMEOUT_S)
        samples: list[tuple[float, float]] = []
        stop = threading.Event()
        sampler = threading.Thread(target=sample_rss, args=(server.pid, stop, samples), daemon=True)
        sampler.start()
        load = asyncio.run(
            drive(
                url,
                queries,
                args.clients,
                args.duration,
                args.max_requests,
                oversize=True,
                queries_per_request=args.queries_per_request,
            )
        )
        stop.set()
        sampler.join(timeout=5)
        health = httpx.get(f"{url}/health", timeout=10).json()
        if args.arm_rounds:
            arms = curriculum_arms(url, server.pid, queries, args)
    finally:
        stop_server(server)
    return LoadRun(load, queries, [mb for _, mb in samples], health, arms)


def load_results(args: argparse.Namespace, run: LoadRun) -> dict[str, Any]:
    """The main load's figures (the JSON line's keys before the server-over-direct ones)."""
    load, rss, wall_s = run.load, run.rss_mb, run.load.wall_s
    latencies = np.array(load.latencies_ms) if load.latencies_ms else np.array([float("nan")])
    requests = len(load.latencies_ms) + load.errors
    return {
        "clients": args.clients,
        "duration_s": round(wall_s, 2),
        "requests": requests,
        "errors": load.errors,
        "requests_per_s": round(requests / wall_s, 1),
        "p50_ms": round(float(np.percentile(latencies, 50)), 2),
        "p95_ms": round(float(np.percentile(latencies, 95)), 2),
        "p99_ms": round(float(np.percentile(latencies, 99)), 2),
        "max_ms": round(float(latencies.max()), 2),
        "rss_start_mb": round(rss[0], 1),
        "rss_mid_mb": round(rss[len(rss) // 2], 1),
        "rss_end_mb": round(rss[-1], 1),
        "rss_max_mb": round(max(rss), 1),
        "oversize_sent": load.oversize_sent,
        "oversize_rejected": load.oversize_rejected,
        "engine_calls": run.health["engine_calls"],
        "queries_per_request": args.queries_per_request,
        "passages": args.passages,
        **run.arms,
    }


def server_over_direct(args: argparse.Namespace, queries: list[str]) -> dict[str, float]:
    """`measure_server_over_direct` on BM25 over the same corpus, the first `--direct-queries` queries."""
    from simsearch.retrieval.bm25 import BM25SearchEngine

    corpus, _ = synthetic_corpus(args.passages, args.seed)
    engine = BM25SearchEngine.build(corpus, show_progress=False)
    return measure_server_over_direct(engine, queries[: args.direct_queries], args.queries_per_request)


def print_table(args: argparse.Namespace, run: LoadRun, results: dict[str, Any], direct: dict[str, float]) -> None:
    """The load's table, with the server-over-direct and curriculum-arm rows when they ran."""
    load, arms = run.load, run.arms
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print(
        f"| /retrieve, BM25 over {args.passages} passages, topk {TOP_K}, "
        f"{args.queries_per_request} queries per request | |"
    )
    print("|---|---|")
    print(f"| clients x duration | {args.clients} x {load.wall_s:.1f} s |")
    print(
        f"| requests (per s) | {results['requests']} ({results['requests_per_s']}/s) "
        f"in {run.health['engine_calls']} engine calls |"
    )
    print(f"| errors | {load.errors} {load.error_kinds or ''} |")
    print(
        f"| latency p50 / p95 / p99 / max | {results['p50_ms']} / {results['p95_ms']} / {results['p99_ms']} / "
        f"{results['max_ms']} ms |"
    )
    print(
        f"| server RSS start / middle / end (max) | {results['rss_start_mb']} / {results['rss_mid_mb']} / "
        f"{results['rss_end_mb']} ({results['rss_max_mb']}) MB |"
    )
    print(f"| oversize bodies refused with 413 | {load.oversize_rejected} of {load.oversize_sent} |")
    if direct:
        print(f"| direct engine, {args.queries_per_request} queries per call | {direct['direct_qps']:.0f} q/s |")
        print(
            f"| behind the server, 32 clients | {direct['server_qps']:.0f} q/s "
            f"({direct['server_over_direct']:.2f}x direct, {direct['server_failed_requests']:.0f} failed) |"
        )
    if arms:
        passes = f"median of {args.arm_rounds} alternating passes of {args.arm_duration:g} s"
        print(f"| p99 plain / with the curriculum ({passes}) | {arms['arm_p99_ms']['plain']} / "
              f"{arms['arm_p99_ms']['curriculum']} ms ({arms['arm_p99_ratio']:.2f}x) |")  # fmt: skip
        print(f"| 5xx plain / with the curriculum | {arms['arm_5xx']['plain']} / {arms['arm_5xx']['curriculum']} |")
        cpu = arms["arm_cpu_ms_per_request"]
        print(f"| server CPU per request, plain / with the curriculum | {cpu['plain']} / {cpu['curriculum']} ms |")


def main() -> None:
    args = parse_args()
    if args.serve:
        serve(args.serve, args.passages, args.seed, curriculum=args.serve_curriculum)
        return
    if args.drive:
        drive_child(args)
        return
    run = run_load(args)
    results = load_results(args, run)
    direct: dict[str, float] = {}
    if args.direct_queries:
        direct = server_over_direct(args, run.queries)
        results |= {k: round(v, 3) for k, v in direct.items()}
    print_table(args, run, results, direct)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
