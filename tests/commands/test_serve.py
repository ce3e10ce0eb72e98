"""`simsearch serve` stopped by SIGTERM: the closing line, exit 0, and its accounting in `run_dir/cost.json`;
with a curriculum, the step a client reports and where each client stood."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from simsearch.commands import serve
from simsearch.models import build_tiny_model, save_tiny, train_tokenizer
from simsearch.retrieval.accounting import ClientUsage, EngineUsage

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.slow  # ~5 s: a server process starts and stops
def test_sigterm_shuts_down_with_the_closing_line_and_writes_cost_json(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "1", "contents": "\\"Paris\\"\\nParis is in France."}\n')
    port, run = _free_port(), tmp_path / "run"
    recipe = ROOT / "recipes" / "serve" / "bm25_wiki18.yaml"
    args = ["serve", str(recipe), f"search.corpus={corpus}", "search.index_dir=''", f"port={port}", f"run_dir={run}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "simsearch.cli", *args]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
    while server.poll() is None and time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    answer = _post(f"{url}/retrieve", {"queries": ["paris", "france"], "topk": 1})
    assert len(answer["result"]) == 2
    began = time.monotonic()
    server.send_signal(signal.SIGTERM)
    stdout, stderr = server.communicate(timeout=30)
    assert server.returncode == 0, stderr[-2000:]
    assert time.monotonic() - began < 15  # drain_s=10 bounds the shutdown
    closing = [line for line in stdout.splitlines() if "searches," in line]
    assert len(closing) == 1 and closing[0].startswith("simsearch serve: 2 searches")
    assert f"accounting in {run / 'cost.json'}" in stdout
    cost = json.loads((run / "cost.json").read_text())
    assert cost["engines"]["bm25"]["searches"] == 2


def test_closing_lines_split_the_cost_between_clients_and_say_where_each_curriculum_stood() -> None:
    # 2 h of simulator generation at $2 per GPU hour = $4.00; client a asked 3 of the 4 searches.
    usage = EngineUsage("simulator", price_per_1k_queries=0.0, gpu_hour_price=2.0, simulator_s=7200.0)
    a, b = ClientUsage(), ClientUsage()
    a.record(searches=3, latency_s=0.5, failed=False)
    b.record(searches=1, latency_s=0.25, failed=False)
    place = {"searches": 3, "step": 5, "p_noise": 0.1 + 0.4 / 3, "source": "request"}
    lines = serve.client_lines({"a": a, "b": b}, usage, {"a": place, "(unnamed)": {"step": None}})
    # Latency percentiles are the middle of their log bucket (accounting.LatencyHistogram: within 2.2%).
    assert lines[:2] == [
        "client a: 3 searches in 1 requests, p99 491.3 ms, cost $3.00",
        "client b: 1 searches in 1 requests, p99 245.7 ms, cost $1.00",
    ]
    assert lines[2:] == ["curriculum a: step 5 (request), p_noise 0.233, 3 searches"]


@pytest.fixture(scope="module")
def tiny_simulator(tmp_path_factory) -> Path:
    tokenizer = train_tokenizer(["Doc 1 (Title: Paris) Paris is the capital of France."] * 20, vocab_size=300)
    model = build_tiny_model(tokenizer, hidden=32, layers=1, heads=2, kv_heads=1, ffn=64)
    return save_tiny(model, tokenizer, tmp_path_factory.mktemp("simulator"))


@pytest.mark.slow  # ~15 s: a server process loads a tiny simulator, answers, and stops
def test_a_served_curriculum_answers_by_the_reported_step_and_closes_with_it(tiny_simulator, tmp_path: Path) -> None:
    port, run = _free_port(), tmp_path / "run"
    args = [
        "serve", str(ROOT / "recipes" / "serve" / "zerosearch_simulator_verl.yaml"), f"port={port}", f"run_dir={run}",
        "search.top_k=2", "search.simulator.max_new_tokens=4", "search.simulator.generation.kind=hf",
        f"search.simulator.generation.model.path={tiny_simulator}", "search.simulator.generation.chat=false",
        "search.simulator.preset=zerosearch-prompt", "curriculum.p_start=0.1", "curriculum.total_steps=10",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "simsearch.cli", *args]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
    while server.poll() is None and time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    context = {"question": ["Where is Paris?"], "golden_answers": [["France"]], "client": "run-a"}
    answer = _post(f"{url}/retrieve", {"queries": ["paris"], "step": 5, **context})
    server.send_signal(signal.SIGTERM)
    stdout, stderr = server.communicate(timeout=60)
    assert server.returncode == 0, stderr[-2000:]
    # p_5 = 0.1 + (4^0.5 - 1)/3 * (0.5 - 0.1) = 0.1 + 0.4/3
    assert (answer["step"], answer["p_noise"]) == (5, pytest.approx(0.1 + 0.4 / 3, abs=1e-12))
    assert "curriculum exponential over 10 steps (129920 searches when no step is reported)" in stdout
    assert "simsearch serve: curriculum run-a: step 5 (request), p_noise 0.233, 1 searches" in stdout
    cost = json.loads((run / "cost.json").read_text())
    assert cost["clients"]["run-a"]["searches"] == 1 and cost["clients"]["run-a"]["cost_usd"] is None  # no GPU price
