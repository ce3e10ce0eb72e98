"""Per-client usage of a shared /retrieve server: cost shares by searches, and cost.json across sessions."""

from __future__ import annotations

import json
from pathlib import Path

from simsearch.retrieval.accounting import ClientUsage, EngineUsage, client_costs, write_cost


def _client(searches: int, requests: int = 1) -> ClientUsage:
    usage = ClientUsage()
    for _ in range(requests):
        usage.record(searches=searches // requests, latency_s=0.1, failed=False)
    return usage


def test_the_engine_cost_is_split_by_searches() -> None:
    # 0.5 h at $8 per GPU hour = $4 of simulator time, plus 10 queries sent at $15 / 1,000 = $0.15.
    engine = EngineUsage(
        "simulator", price_per_1k_queries=15.0, gpu_hour_price=8.0, simulator_s=1800.0, queries_sent=10
    )
    costs = client_costs({"a": _client(6), "b": _client(2), "idle": ClientUsage()}, engine)
    assert costs == {"a": 4.15 * 6 / 8, "b": 4.15 * 2 / 8, "idle": 0.0}
    assert client_costs({"a": _client(6)}, EngineUsage("simulator", 0.0, None)) == {"a": None}  # GPU price unknown


def test_cost_json_adds_each_session_s_clients(tmp_path: Path) -> None:
    engine = EngineUsage("simulator", price_per_1k_queries=0.0, gpu_hour_price=2.0, simulator_s=3600.0)
    write_cost(tmp_path, None, {"simulator": engine}, {"a": _client(3)})
    first = json.loads((tmp_path / "cost.json").read_text())
    assert first["clients"]["a"]["searches"] == 3 and first["clients"]["a"]["cost_usd"] == 2.0
    write_cost(tmp_path, first, {"simulator": engine}, {"a": _client(1), "b": _client(4, requests=2)})
    second = json.loads((tmp_path / "cost.json").read_text())["clients"]
    # Two sessions of 1 h at $2: $4 in all, split 4 : 4 between a (3 + 1 searches) and b (4).
    assert {name: (c["requests"], c["searches"], c["cost_usd"]) for name, c in second.items()} == {
        "a": (2, 4, 2.0),
        "b": (2, 4, 2.0),
    }
    write_cost(tmp_path / "train", None, {"simulator": engine})  # a train run has no clients
    assert set(json.loads((tmp_path / "train" / "cost.json").read_text())) == {"engines"}
