"""Faults in the middle of a run: servers that die, hang, answer 500s or garbage; kills mid-checkpoint.

Every server here is local (127.0.0.1, a free port) and started by the test. A run that meets a
fault must either carry on (a transient fault, a malformed generation) or stop with a
`ServiceError` naming the URL after bounded retries, within a wall time the test asserts, and
lose nothing already finished. The trainer's own faults (a dead server mid-training, SIGKILL
and resume) are tested in tests/commands/test_train.py.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from simsearch.commands import evaluate
from simsearch.config import EvalRecipe, load_recipe
from simsearch.data.templates import SEARCH_R1_TEMPLATE
from simsearch.errors import ServiceError
from simsearch.generation.openai import OpenAIEngine
from simsearch.httpclient import GenerationServiceError, SearchServiceError
from simsearch.models import train_tokenizer
from simsearch.retrieval.http import HTTPSearchEngine
from simsearch.retrieval.server import create_app
from simsearch.simulator.engine import PAD_TEXT, SimulatedSearchEngine
from simsearch.tinyworld.world import build_world
from simsearch.training.checkpoint import STATE_FILE, latest_checkpoint, load_state, save_checkpoint
from simsearch.types import Completion, SearchRequest
from tests.servers import serve_in_thread

ROOT = Path(__file__).resolve().parents[2]

# Client bounds used throughout: 3 attempts of at most TIMEOUT_S each, short backoff between.
TIMEOUT_S = 0.5
RETRIES = 2
BACKOFF_S = 0.05
# Worst case: 3 attempts x 0.5 s + backoff (0.05 + 0.1 s at most) = 1.65 s. The bound leaves 7x that for a
# loaded 2-core machine and still fails a timeout applied 10x too long (3 x 5 s = 15 s) or not at all (a
# hung request is held until the test ends).
WALL_BOUND_S = 12.0

FAULTS = ["dies", "hangs", "500s", "malformed_json", "drops_connection"]


# --------------------------------------------------------------------------- a scriptable server


class FaultyServer:
    """A threaded HTTP server on 127.0.0.1 answering `answer(body)` for its first `healthy`
    requests, then showing `fault` (up to request `until`, when given, and healthy again after):

    - dies: the request that meets it is dropped and the server closes its port (connection refused);
    - hangs: the request is held until the test ends (the client must time out);
    - 500s: HTTP 500 with a JSON error body;
    - malformed_json: HTTP 200 with a truncated JSON body;
    - drops_connection: the connection is closed without an answer.
    """

    def __init__(
        self, answer: Callable[[dict], Any], *, healthy: int, fault: str | None, until: int | None, port: int
    ) -> None:
        self.answer, self.healthy, self.fault, self.until = answer, healthy, fault, until
        self.requests = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"null")
                with outer.lock:
                    outer.requests += 1
                    number = outer.requests
                faulty = number > outer.healthy and (outer.until is None or number <= outer.until)
                fault = outer.fault if faulty else None
                if fault == "dies":
                    self.close_connection = True
                    threading.Thread(target=outer.stop, daemon=True).start()
                    return
                if fault == "hangs":
                    outer.release.wait(30)
                    return
                if fault == "drops_connection":
                    self.close_connection = True
                    return
                if fault == "500s":
                    self._send(500, b'{"error": "CUDA out of memory"}')
                elif fault == "malformed_json":
                    self._send(200, json.dumps(outer.answer(body)).encode()[:25])
                else:
                    self._send(200, json.dumps(outer.answer(body)).encode())

            def _send(self, status: int, data: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up first

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()
        self._stopped = False

    def stop(self) -> None:
        with self.lock:
            if self._stopped:
                return
            self._stopped = True
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers():
    started: list[FaultyServer] = []

    def start(
        answer: Callable[[dict], Any],
        *,
        healthy: int = 10**9,
        fault: str | None = None,
        until: int | None = None,
        port: int = 0,
    ) -> FaultyServer:
        server = FaultyServer(answer, healthy=healthy, fault=fault, until=until, port=port)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def simulator_answer(body: dict) -> dict:
    """An OpenAI-compatible /v1/completions answer: three documents per prompt."""
    text = "\n".join(f"Doc {i} (Title: Page {i}) fact number {i}." for i in (1, 2, 3))
    return {"choices": [{"index": i, "text": text, "finish_reason": "stop"} for i in range(len(body["prompt"]))]}


def retrieve_answer(body: dict) -> dict:
    """A Search-R1 /retrieve answer: `topk` documents per query."""
    return {
        "result": [
            [
                {"document": {"id": f"{q}-{i}", "contents": f'"{q}"\npassage {i}'}, "score": 1.0}
                for i in range(body["topk"])
            ]
            for q in body["queries"]
        ]
    }


def simulator(url: str) -> SimulatedSearchEngine:
    # One request per search call (both prompts in it), so requests can be counted.
    client = OpenAIEngine(
        [url], "simulator", timeout_s=TIMEOUT_S, max_retries=RETRIES, backoff_s=BACKOFF_S, max_concurrency=1
    )
    return SimulatedSearchEngine(client, preset="simsearch", seed=0)


REQUESTS = [
    SearchRequest(
        "capital of France", top_k=3, question="What is the capital of France?", golden_answers=["Paris"], num_noisy=n
    )
    for n in (0, 3)
]


def timed_failure(call: Callable[[], Any], error: type[Exception]) -> tuple[Exception, float]:
    start = time.monotonic()
    with pytest.raises(error) as info:
        call()
    return info.value, time.monotonic() - start


# --------------------------------------------------------------------------- the simulator server


@pytest.mark.parametrize("fault", FAULTS)
def test_simulator_server_fault_mid_run_is_a_bounded_clear_error(servers, fault: str) -> None:
    server = servers(simulator_answer, healthy=2, fault=fault)
    engine = simulator(server.url)
    for _ in range(2):  # the run is under way: two search calls answered
        results = engine.search(REQUESTS)
        assert [[d.title for d in docs] for docs in results] == [["Page 1", "Page 2", "Page 3"]] * 2

    err, elapsed = timed_failure(lambda: engine.search(REQUESTS), GenerationServiceError)
    assert elapsed < WALL_BOUND_S
    message = str(err)
    assert server.url in message and "3 attempt(s)" in message
    if fault == "hangs":
        assert elapsed >= (RETRIES + 1) * TIMEOUT_S * 0.9  # each attempt waited out its timeout
        assert "timeout" in message
    if fault != "dies":  # every attempt reached the server: bounded retries, not one more
        assert server.requests == 2 + RETRIES + 1
    expected = {"500s": "HTTP 500", "malformed_json": "malformed JSON", "drops_connection": "RemoteProtocolError"}.get(
        fault
    )
    if expected:
        assert expected in message


@pytest.mark.parametrize("fault", ["hangs", "500s", "malformed_json", "drops_connection"])
def test_simulator_recovers_from_a_transient_fault_without_losing_a_request(servers, fault: str) -> None:
    # Requests 3 and 4 fail (the third search call and its first retry); the second retry succeeds.
    server = servers(simulator_answer, healthy=2, fault=fault, until=4)
    engine = simulator(server.url)
    first = [engine.search(REQUESTS) for _ in range(2)]
    start = time.monotonic()
    third = engine.search(REQUESTS)
    assert time.monotonic() - start < WALL_BOUND_S
    assert server.requests == 5
    assert third == first[0]  # the same documents as a healthy call: nothing lost or padded
    assert all(d.text != PAD_TEXT for docs in third for d in docs)


@pytest.mark.parametrize(
    ("text", "padded"),
    [
        ("", 3),
        ("I cannot help with that.", 2),
        ("Doc 1 (Title: A) a\nDoc 2 (Title: B) b\nDoc 9 x\nDoc 4 overflow", 0),
        ("\x00\ufffd<information></search>", 2),
    ],
)
def test_a_malformed_generation_still_gives_top_k_documents(servers, text: str, padded: int) -> None:
    def answer(body: dict) -> dict:
        return {"choices": [{"index": i, "text": text, "finish_reason": "length"} for i in range(len(body["prompt"]))]}

    engine = simulator(servers(answer).url)
    results = engine.search(REQUESTS)
    assert [len(docs) for docs in results] == [3, 3]
    assert [sum(d.text == PAD_TEXT for d in docs) for docs in results] == [padded, padded]
    assert engine.stats["simulator/sets"] == 2


def test_a_response_that_is_not_a_completion_is_a_clear_error_not_a_retry_loop(servers) -> None:
    server = servers(lambda body: {"object": "error", "message": "model not loaded"})
    err, elapsed = timed_failure(lambda: simulator(server.url).search(REQUESTS), GenerationServiceError)
    assert elapsed < WALL_BOUND_S
    assert server.url in str(err) and "expected 2 choices" in str(err)


# --------------------------------------------------------------------------- the /retrieve server


def retriever(url: str) -> HTTPSearchEngine:
    return HTTPSearchEngine(f"{url}/retrieve", timeout_s=TIMEOUT_S, max_retries=RETRIES, backoff_s=BACKOFF_S)


@pytest.mark.parametrize("fault", FAULTS)
def test_retrieve_server_fault_mid_run_is_a_bounded_clear_error(servers, fault: str) -> None:
    server = servers(retrieve_answer, healthy=3, fault=fault)
    engine = retriever(server.url)
    for i in range(3):
        assert [d.id for d in engine.search([SearchRequest(f"q{i}", top_k=2)])[0]] == [f"q{i}-0", f"q{i}-1"]

    err, elapsed = timed_failure(lambda: engine.search([SearchRequest("q3", top_k=2)]), SearchServiceError)
    assert elapsed < WALL_BOUND_S
    assert f"{server.url}/retrieve" in str(err) and "3 attempt(s)" in str(err)
    if fault != "dies":
        assert server.requests == 3 + RETRIES + 1


def test_dead_simulator_behind_our_retrieve_server_gives_503s_then_a_clear_error_and_the_server_lives(servers) -> None:
    """HTTP client -> `simsearch serve` app -> simulator engine -> OpenAI-compatible server that dies."""
    backend = servers(simulator_answer, healthy=1, fault="dies")
    app = create_app(simulator(backend.url), default_top_k=3)
    with serve_in_thread(app) as url:
        client = retriever(url)
        first = client.search(REQUESTS[:1])
        assert [d.title for d in first[0]] == ["Page 1", "Page 2", "Page 3"]

        err, elapsed = timed_failure(lambda: client.search(REQUESTS[:1]), SearchServiceError)
        # Three client attempts, each a 503 after the simulator client's own bounded retries
        # against a refused port (fast): well within the bound.
        assert elapsed < 2 * WALL_BOUND_S
        assert f"{url}/retrieve" in str(err) and "HTTP 503" in str(err)
        assert backend.url in str(err)  # the 503 names the simulator that failed

        # The simulator comes back on the same port: the same server answers again.
        port = int(backend.url.rsplit(":", 1)[1])
        servers(simulator_answer, port=port)
        again = client.search(REQUESTS[:1])
        assert [d.title for d in again[0]] == ["Page 1", "Page 2", "Page 3"]
        health = httpx.get(f"{url}/health").json()
    assert health["status"] == "ok" and health["errors"] == RETRIES + 1


# --------------------------------------------------------------------------- mid-evaluation


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    built = build_world(seed=0, n_entities=12, n_train_entities=8, n_cities=5)
    paths = built.write(tmp_path_factory.mktemp("world"))
    tokenizer = train_tokenizer(built.texts_for_tokenizer(200) + [SEARCH_R1_TEMPLATE] * 5, vocab_size=400)
    return paths, tokenizer


class SearchThenAnswer:
    """A policy that searches once, then answers "x"; records the questions it was asked."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.questions: list[str] = []

    def generate(self, prompts, params):
        out = []
        for prompt in prompts:
            context = self.tokenizer.decode(prompt, skip_special_tokens=False)
            tail = context[context.rindex("Question: ") :]
            if "<information>" in tail:
                text = "<answer> x </answer>"
            else:
                self.questions.append(tail.split("\n", 1)[0])
                text = "<search> capital </search>"
            stop = "</answer>" if text.endswith("</answer>") else "</search>"
            out.append(Completion(self.tokenizer.encode(text, add_special_tokens=False), text, "stop", stop))
        return out


def test_retrieve_server_dying_mid_evaluation_loses_no_finished_chunk(world, servers, tmp_path, monkeypatch) -> None:
    paths, tokenizer = world
    # Chunks of 2 questions, one /retrieve POST per chunk: the server dies on the second chunk.
    server = servers(retrieve_answer, healthy=1, fault="dies")
    recipe = load_recipe(
        EvalRecipe,
        None,
        [
            f"run_dir={tmp_path / 'run'}",
            "policy.model.path=scripted",
            "sampling.max_new_tokens=32",
            "chunk_size=2",
            "fidelity_size=0",
            f"datasets=[{{name: heldout, path: {paths['test']}, limit: 6}}]",
            "engines.remote.kind=http",
            f"engines.remote.url={server.url}/retrieve",
            f"engines.remote.timeout_s={TIMEOUT_S}",
            f"engines.remote.max_retries={RETRIES}",
            f"engines.remote.backoff_s={BACKOFF_S}",
        ],
    )
    policy = SearchThenAnswer(tokenizer)
    monkeypatch.setattr(evaluate, "build_generation_engine", lambda cfg, **_: (policy, tokenizer, None))

    err, elapsed = timed_failure(lambda: evaluate.main(recipe), ServiceError)
    assert elapsed < WALL_BOUND_S + 5  # the bound, plus the eval's own setup
    assert f"{server.url}/retrieve" in str(err)
    rows_file = tmp_path / "run" / "examples" / "remote" / "heldout.jsonl"
    first_chunk = [json.loads(line)["id"] for line in rows_file.read_text().splitlines()]
    assert len(first_chunk) == 2

    # The server is back (same port): the evaluation resumes and runs only what was not finished.
    port = int(server.url.rsplit(":", 1)[1])
    servers(retrieve_answer, port=port)
    resumed = SearchThenAnswer(tokenizer)
    monkeypatch.setattr(evaluate, "build_generation_engine", lambda cfg, **_: (resumed, tokenizer, None))
    summary = evaluate.main(recipe)
    ids = [json.loads(line)["id"] for line in rows_file.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 6 and ids[:2] == first_chunk
    assert len(resumed.questions) == 4
    assert summary["rows"]["remote"]["results"]["heldout"]["questions"] == 6


# --------------------------------------------------------------------------- SIGKILL mid-checkpoint

KILLED_WRITER = r"""
# Imports torch once, then forks one writer per phase: each stops at its kill point until the
# test SIGKILLs it. The parent reports each child's pid, then how each one ended.
import os, shutil, sys, time
from pathlib import Path
import torch
from simsearch.training import checkpoint

base, phases = Path(sys.argv[1]), sys.argv[2:]

def writer(run, phase):
    def killed_here():
        (run / "KILL_ME").write_text("")
        time.sleep(120)  # the test SIGKILLs us now

    class Model:
        def __init__(self, killed=False):
            self.killed = killed
        def save_pretrained(self, path, safe_serialization=True):
            path.mkdir(parents=True)
            with open(path / "model.safetensors", "wb") as f:
                f.write(b"w" * 4096)
                if self.killed:
                    f.flush()
                    killed_here()

    class Tokenizer:
        def save_pretrained(self, path):
            (path / "tokenizer.json").write_text("{}")

    def save(step, model=None):
        checkpoint.save_checkpoint(
            run, step, model=model or Model(), tokenizer=Tokenizer(), state={"x": step}, keep_last=2
        )

    save(1)
    save(2)
    if phase == "model":
        save(3, Model(killed=True))
    elif phase == "state":
        def half_written(obj, f):
            Path(f).write_bytes(b"PK\x03\x04 half a trainer state")
            killed_here()
        checkpoint.torch.save = half_written
        save(3)
    elif phase in ("replace", "prune"):
        real_rmtree = shutil.rmtree
        def half_deleted(path, ignore_errors=False):
            path = Path(path)
            if (path / "model").is_dir():
                real_rmtree(path / "model")  # the model goes first, the trainer state is still there
                killed_here()
            real_rmtree(path, ignore_errors=ignore_errors)
        shutil.rmtree = half_deleted
        # replace: the same step written again (a re-save at the end of a run); prune: a new
        # step whose save deletes the oldest checkpoint.
        save(2 if phase == "replace" else 3)
    os._exit(3)  # never reached: the kill point sleeps until the kill

children = {}
for phase in phases:
    pid = os.fork()
    if pid == 0:
        try:
            writer(base / phase, phase)
        finally:
            os._exit(4)
    children[pid] = phase
    print(phase, pid, flush=True)
for _ in phases:
    pid, status = os.wait()
    code = os.WTERMSIG(status) if os.WIFSIGNALED(status) else -os.WEXITSTATUS(status)
    print(children[pid], "ended", code, flush=True)
"""


def complete(checkpoint_path: Path) -> bool:
    model = checkpoint_path / "model" / "model.safetensors"
    return model.is_file() and model.stat().st_size == 4096 and (checkpoint_path / "model" / "tokenizer.json").is_file()


PHASES = {"model": 2, "state": 2, "replace": 2, "prune": 3}  # where the kill lands -> the step left latest


@pytest.fixture(scope="module")
def killed_runs(tmp_path_factory) -> dict[str, Path]:
    """One writer process per phase, each SIGKILLed at its kill point; their run directories."""
    base = tmp_path_factory.mktemp("killed")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(base), *PHASES],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pids = {}
        for _ in PHASES:
            line = parent.stdout.readline()
            assert line, f"the writer failed before forking: {parent.stderr.read()}"
            phase, pid = line.split()
            pids[phase] = int(pid)
        deadline = time.monotonic() + 120
        for phase, pid in pids.items():
            while not (base / phase / "KILL_ME").exists():
                assert time.monotonic() < deadline, f"the {phase} writer never reached its kill point"
                time.sleep(0.02)
            os.kill(pid, signal.SIGKILL)
        ended = dict(line.split(" ended ") for line in parent.stdout.read().splitlines())
        assert parent.wait(timeout=30) == 0, parent.stderr.read()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=30)
    assert ended == {phase: str(int(signal.SIGKILL)) for phase in PHASES}, ended
    return {phase: base / phase for phase in PHASES}


@pytest.mark.parametrize("phase", list(PHASES))
def test_sigkill_mid_checkpoint_leaves_the_latest_complete_and_no_partial_files(killed_runs, phase: str) -> None:
    run, latest_step = killed_runs[phase], PHASES[phase]
    latest = latest_checkpoint(run)
    assert latest is not None and latest.name == f"step_{latest_step:07d}"
    assert load_state(latest) == {"x": latest_step, "step": latest_step}
    # Whatever the kill interrupted is hidden (a dot-name); every visible checkpoint is whole.
    visible = [p for p in (run / "checkpoints").iterdir() if not p.name.startswith(".")]
    assert visible and all((p / STATE_FILE).is_file() and complete(p) for p in visible), [p.name for p in visible]
    assert any(p.name.startswith(".") for p in (run / "checkpoints").iterdir())  # the kill did leave debris

    # The next save of the restarted run sweeps the leftovers away.
    class Model:
        def save_pretrained(self, path: Path, safe_serialization: bool = True) -> None:
            path.mkdir(parents=True)
            (path / "model.safetensors").write_bytes(b"w" * 4096)

    class Tokenizer:
        def save_pretrained(self, path: Path) -> None:
            (path / "tokenizer.json").write_text("{}")

    save_checkpoint(run, 4, model=Model(), tokenizer=Tokenizer(), state={"x": 4}, keep_last=2)
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == [f"step_{latest_step:07d}", "step_0000004"]
