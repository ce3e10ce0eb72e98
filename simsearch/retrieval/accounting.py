"""What search cost: counts, latency and estimated dollars per engine, for every run.

A `Ledger` holds one `EngineUsage` per engine, fed by `MeteredSearchEngine` (outermost:
searches, latency, cache hits), `SentCounter` (in front of the engine: queries that reached it)
and `MeteredGenerator` (a simulator's calls, tokens and seconds). An unknown price is `None`
("unknown"), never 0. A `/retrieve` server shared by several trainers also keeps a `ClientUsage`
per client, and `client_costs` splits the engine's cost between them by their searches.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simsearch.types import Completion, Document, SamplingParams, SearchRequest

if TYPE_CHECKING:
    from simsearch.generation.base import GenerationEngine
    from simsearch.retrieval.base import SearchEngine

QUERY_PRICES: dict[str, tuple[float | None, str]] = {
    "bm25": (0.0, "local index"),
    "dense": (0.0, "local index"),
    "empty": (0.0, "finds nothing"),
    "random": (0.0, "passages drawn from a local corpus"),
    "answerless": (0.0, "local index"),
    "oracle": (0.0, "local index"),
    "simulator": (0.0, "no per-query price: its cost is its GPU time (gpu_hour_price)"),
    "http": (None, "whatever serves the URL: set price_per_1k_queries"),
    # Read 2026-11-23 from third-party pages quoting SerpAPI's plans (Developer: $75 a month for
    # 5,000 searches); serpapi.com/pricing itself was not read. Larger plans cost less a query.
    "serpapi": (15.0, "SerpAPI Developer plan, $75 / 5,000 searches (third-party pages, read 2026-11-23)"),
    # No stored page gave Serper's published price when this table was written: unknown.
    "serper": (None, "not known to simsearch: set price_per_1k_queries from serper.dev's pricing"),
}
"""Engine kind -> (default $ per 1,000 queries sent, where it comes from). None = unknown."""

PERCENTILES: tuple[int, ...] = (50, 95, 99)
_BUCKETS_PER_DOUBLING = 16
_SMALLEST_S = 1e-6


def default_query_price(kind: str) -> float | None:
    """The documented default price per 1,000 queries of an engine kind (None = unknown)."""
    return QUERY_PRICES.get(kind, (None, ""))[0]


@dataclass
class LatencyHistogram:
    """Call latencies in log-spaced buckets: mergeable, bounded memory, percentiles within 2.2%."""

    buckets: dict[int, int] = field(default_factory=dict)

    def add(self, seconds: float) -> None:
        """Records one latency (values under 1 µs count as 1 µs)."""
        index = max(0, math.floor(math.log2(max(seconds, _SMALLEST_S) / _SMALLEST_S) * _BUCKETS_PER_DOUBLING))
        self.buckets[index] = self.buckets.get(index, 0) + 1

    def merge(self, other: LatencyHistogram) -> None:
        for index, count in other.buckets.items():
            self.buckets[index] = self.buckets.get(index, 0) + count

    @property
    def count(self) -> int:
        return sum(self.buckets.values())

    def percentile(self, q: float) -> float | None:
        """The nearest-rank q-th percentile in seconds (the bucket's geometric middle); None if empty."""
        total = self.count
        if not total:
            return None
        rank = max(1, math.ceil(q / 100.0 * total))
        seen = 0
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if seen >= rank:
                return _SMALLEST_S * 2.0 ** ((index + 0.5) / _BUCKETS_PER_DOUBLING)
        raise AssertionError("unreachable: rank <= total")


@dataclass
class EngineUsage:
    """What one engine was asked and did, and what it is priced at."""

    kind: str
    price_per_1k_queries: float | None = None  # $ per 1,000 queries sent; None = unknown
    gpu_hour_price: float | None = None  # simulator: $ per hour of its GPUs; None = unknown
    searches: int = 0  # requests asked of the engine (cache hits included)
    search_calls: int = 0  # batched `search` calls
    cache_hits: int = 0
    queries_sent: int = 0  # requests that reached the engine itself (what a web API bills)
    simulator_calls: int = 0  # generate calls of a simulator
    prompt_tokens: int = 0
    uncounted_prompts: int = 0  # string prompts without a tokenizer to count them
    completion_tokens: int = 0
    simulator_s: float = 0.0
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)

    def merge(self, other: EngineUsage) -> None:
        """Adds another usage's counts (prices are kept)."""
        for name in COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.latency.merge(other.latency)

    def query_cost(self) -> float | None:
        """Dollars for the queries sent, or None when the price is unknown."""
        if self.price_per_1k_queries is None:
            return None
        return self.queries_sent * self.price_per_1k_queries / 1000.0

    def simulator_cost(self) -> float | None:
        """Dollars of simulator GPU time, or None when no GPU-hour price is set."""
        if self.gpu_hour_price is None:
            return None
        return self.simulator_s / 3600.0 * self.gpu_hour_price

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record: counts, latency percentiles, prices and costs (None = unknown)."""
        record: dict[str, Any] = {"kind": self.kind}
        record.update({name: getattr(self, name) for name in COUNTERS})
        record["prompt_tokens_complete"] = self.uncounted_prompts == 0
        for q in PERCENTILES:
            record[f"latency_p{q}_s"] = self.latency.percentile(q)
        record["price_per_1k_queries"] = self.price_per_1k_queries
        record["gpu_hour_price"] = self.gpu_hour_price
        record["query_cost_usd"] = self.query_cost()
        record["simulator_cost_usd"] = self.simulator_cost() if self.kind == "simulator" else 0.0
        record["latency_buckets"] = {str(k): v for k, v in sorted(self.latency.buckets.items())}
        return record

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> EngineUsage:
        """Reads `to_dict`'s record back (derived fields are recomputed)."""
        usage = cls(
            kind=record["kind"],
            price_per_1k_queries=record.get("price_per_1k_queries"),
            gpu_hour_price=record.get("gpu_hour_price"),
            latency=LatencyHistogram({int(k): int(v) for k, v in record.get("latency_buckets", {}).items()}),
        )
        for name in COUNTERS:
            setattr(usage, name, type(getattr(usage, name))(record.get(name, 0)))
        return usage

    def metrics(self, name: str) -> dict[str, float]:
        """Flat namespaced metrics; unknown costs and empty percentiles are left out, never 0."""
        out = {
            f"search/{name}/searches": float(self.searches),
            f"search/{name}/cache_hits": float(self.cache_hits),
            f"search/{name}/queries": float(self.queries_sent),
        }
        for q in PERCENTILES:
            value = self.latency.percentile(q)
            if value is not None:
                out[f"search/{name}/latency_p{q}_s"] = value
        if self.kind == "simulator":
            out[f"simulator/{name}/calls"] = float(self.simulator_calls)
            out[f"simulator/{name}/completion_tokens"] = float(self.completion_tokens)
            out[f"simulator/{name}/seconds"] = self.simulator_s
            if self.uncounted_prompts == 0:
                out[f"simulator/{name}/prompt_tokens"] = float(self.prompt_tokens)
        costs = [self.query_cost(), self.simulator_cost() if self.kind == "simulator" else 0.0]
        if all(c is not None for c in costs):
            out[f"cost/{name}/usd"] = float(sum(c for c in costs if c is not None))
        return out


COUNTERS: tuple[str, ...] = (
    "searches",
    "search_calls",
    "cache_hits",
    "queries_sent",
    "simulator_calls",
    "prompt_tokens",
    "uncounted_prompts",
    "completion_tokens",
    "simulator_s",
)
"""The additive fields of `EngineUsage`."""


class Ledger:
    """Usage per engine name: the run's totals, and a window since the last `take_window`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total: dict[str, EngineUsage] = {}
        self._window: dict[str, EngineUsage] = {}

    def register(
        self, name: str, kind: str, *, price_per_1k_queries: float | None, gpu_hour_price: float | None
    ) -> None:
        """Declares an engine and its prices (before anything is recorded for it)."""
        with self._lock:
            for book in (self.total, self._window):
                book[name] = EngineUsage(kind, price_per_1k_queries, gpu_hour_price)

    def record(self, name: str, *, latency_s: float | None = None, **counts: float) -> None:
        """Adds `counts` (fields of `COUNTERS`) and a latency to engine `name`."""
        with self._lock:
            for book in (self.total, self._window):
                usage = book[name]
                for key, value in counts.items():
                    setattr(usage, key, getattr(usage, key) + value)
                if latency_s is not None:
                    usage.latency.add(latency_s)

    def take_window(self) -> dict[str, EngineUsage]:
        """The usage since the previous call (per step), and a fresh window."""
        with self._lock:
            window = self._window
            self._window = {name: _empty_like(usage) for name, usage in window.items()}
            return window

    def step_metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, usage in self.take_window().items():
            out.update(usage.metrics(name))
        return out


@dataclass
class ClientUsage:
    """What one client of a `/retrieve` server asked: requests, searches, failures and latency."""

    requests: int = 0
    searches: int = 0  # queries in its requests
    failed: int = 0  # requests the engine failed (503 / 422 from the engine)
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)  # of whole requests

    def record(self, *, searches: int, latency_s: float, failed: bool) -> None:
        self.requests += 1
        self.searches += searches
        self.failed += int(failed)
        self.latency.add(latency_s)

    def merge(self, other: ClientUsage) -> None:
        self.requests += other.requests
        self.searches += other.searches
        self.failed += other.failed
        self.latency.merge(other.latency)

    def summary(self) -> dict[str, Any]:
        """Counts and request latency percentiles (None while empty), for `/health` and `cost.json`."""
        record: dict[str, Any] = {"requests": self.requests, "searches": self.searches, "failed": self.failed}
        for q in PERCENTILES:
            record[f"latency_p{q}_s"] = self.latency.percentile(q)
        return record

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "latency_buckets": {str(k): v for k, v in sorted(self.latency.buckets.items())}}

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> ClientUsage:
        buckets = {int(k): int(v) for k, v in record.get("latency_buckets", {}).items()}
        return cls(int(record["requests"]), int(record["searches"]), int(record["failed"]), LatencyHistogram(buckets))


def client_costs(clients: Mapping[str, ClientUsage], engine: EngineUsage) -> dict[str, float | None]:
    """Each client's share of `engine`'s cost (queries and simulator time), by its share of the
    searches; None for all when a price is unknown."""
    costs = [engine.query_cost(), engine.simulator_cost() if engine.kind == "simulator" else 0.0]
    total = sum(usage.searches for usage in clients.values())
    if any(c is None for c in costs):
        return dict.fromkeys(clients)
    cost = sum(c for c in costs if c is not None)
    return {name: cost * usage.searches / total if total else 0.0 for name, usage in clients.items()}


def _empty_like(usage: EngineUsage) -> EngineUsage:
    return EngineUsage(usage.kind, usage.price_per_1k_queries, usage.gpu_hour_price)


class SentCounter:
    """A `SearchEngine` in front of the engine itself that counts the queries it is sent."""

    def __init__(self, engine: SearchEngine, ledger: Ledger, name: str) -> None:
        self.engine, self.ledger, self.name = engine, ledger, name

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        results = self.engine.search(requests)
        self.ledger.record(self.name, queries_sent=len(requests))
        return results


class MeteredSearchEngine:
    """The outermost layer: searches, call latency and the hits of `cache` (directly behind), into `ledger`."""

    def __init__(self, engine: SearchEngine, ledger: Ledger, name: str, *, cache: Any = None) -> None:
        self.engine, self.ledger, self.name, self.cache = engine, ledger, name, cache

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        hits_before = self.cache.hits if self.cache is not None else 0
        began = time.perf_counter()
        results = self.engine.search(requests)
        latency = time.perf_counter() - began
        hits = self.cache.hits - hits_before if self.cache is not None else 0
        self.ledger.record(self.name, latency_s=latency, searches=len(requests), search_calls=1, cache_hits=hits)
        return results


class MeteredGenerator:
    """A `GenerationEngine` that counts a simulator's calls, tokens (string prompts via `tokenizer`) and seconds."""

    def __init__(self, generator: GenerationEngine, ledger: Ledger, name: str, *, tokenizer: Any = None) -> None:
        self.generator, self.ledger, self.name, self.tokenizer = generator, ledger, name, tokenizer

    def generate(self, prompts: list[list[int]] | list[str], params: SamplingParams) -> list[Completion]:
        began = time.perf_counter()
        completions = self.generator.generate(prompts, params)
        seconds = time.perf_counter() - began
        prompt_tokens, uncounted = 0, 0
        for prompt in prompts:
            if not isinstance(prompt, str):
                prompt_tokens += len(prompt)
            elif self.tokenizer is not None:
                prompt_tokens += len(self.tokenizer.encode(prompt, add_special_tokens=False))
            else:
                uncounted += 1
        self.ledger.record(
            self.name,
            simulator_calls=1,
            prompt_tokens=prompt_tokens,  # n samples of a prompt share its prefill
            uncounted_prompts=uncounted,
            completion_tokens=sum(len(c.token_ids) for c in completions),
            simulator_s=seconds,
        )
        return completions


# --------------------------------------------------------------------------- run-directory totals

COST_FILE = "cost.json"


def merged_totals(previous: Mapping[str, Any] | None, current: Mapping[str, EngineUsage]) -> dict[str, EngineUsage]:
    """This invocation's totals added to those of earlier invocations left in `cost.json` (current prices)."""
    totals = {name: _empty_like(usage) for name, usage in current.items()}
    for name, usage in current.items():
        totals[name].merge(usage)
    for name, record in ((previous or {}).get("engines") or {}).items():
        if name in totals:
            totals[name].merge(EngineUsage.from_dict(record))
        else:
            totals[name] = EngineUsage.from_dict(record)
    return totals


def cost_record(totals: Mapping[str, EngineUsage], clients: Mapping[str, ClientUsage] | None = None) -> dict[str, Any]:
    """`cost.json`'s content: per engine `EngineUsage.to_dict`; a server's also per client
    `ClientUsage.to_dict` with its `cost_usd` share of the (one) engine's cost."""
    record: dict[str, Any] = {"engines": {name: usage.to_dict() for name, usage in totals.items()}}
    if clients:
        shares = client_costs(clients, next(iter(totals.values()))) if len(totals) == 1 else dict.fromkeys(clients)
        record["clients"] = {name: {**usage.to_dict(), "cost_usd": shares[name]} for name, usage in clients.items()}
    return record


def merged_clients(previous: Mapping[str, Any] | None, current: Mapping[str, ClientUsage]) -> dict[str, ClientUsage]:
    """This server session's clients added to those earlier sessions left in `cost.json`."""
    totals = {name: ClientUsage() for name in current}
    for name, usage in current.items():
        totals[name].merge(usage)
    for name, record in ((previous or {}).get("clients") or {}).items():
        totals.setdefault(name, ClientUsage()).merge(ClientUsage.from_dict(record))
    return totals


def money(value: float | None) -> str:
    """Dollars for a report: "unknown" when no price was set, never "$0" for that."""
    if value is None:
        return "unknown"
    return f"${value:,.2f}" if value >= 0.01 or value == 0 else f"${value:.4f}"


def simulator_line(totals: Mapping[str, EngineUsage]) -> str:
    """A train run's summary line of simulated search and its cost; empty when no simulator served searches."""
    sims = [u for u in totals.values() if u.kind == "simulator"]
    if not sims:
        return ""
    served = sum(u.searches for u in sims)
    parts = [f"searches served by the simulator: {served:,}"]
    for kind in ("serpapi", "serper"):
        price = default_query_price(kind)
        if price is not None:
            parts.append(f"an estimated {money(served * price / 1000.0)} at {kind}'s price (${price:g} / 1,000)")
        else:
            parts.append(f"{kind}'s price unknown")
    own = [u.simulator_cost() for u in sims]
    seconds = sum(u.simulator_s for u in sims)
    own_cost = None if any(c is None for c in own) else sum(c for c in own if c is not None)
    parts.append(f"the simulator's own cost: {money(own_cost)} ({seconds / 3600.0:.3f} h of generation)")
    return "; ".join(parts)


def read_cost(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The `cost.json` a previous invocation left in `run_dir`, or None."""
    path = Path(run_dir) / COST_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def write_cost(
    run_dir: str | os.PathLike,
    previous: Mapping[str, Any] | None,
    current: Mapping[str, EngineUsage],
    clients: Mapping[str, ClientUsage] | None = None,
) -> dict[str, EngineUsage]:
    """Writes `cost.json` atomically (`previous` plus this invocation's totals, and a server's
    `clients`); returns the merged totals."""
    totals = merged_totals(previous, current)
    every_client = merged_clients(previous, clients) if clients is not None else None
    path = Path(run_dir) / COST_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.tmp")
    partial.write_text(json.dumps(cost_record(totals, every_client), indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return totals
