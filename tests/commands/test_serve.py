"""`simsearch serve` stopped by SIGTERM: the closing line, exit 0, and its accounting in `run_dir/cost.json`."""

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
