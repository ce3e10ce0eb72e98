"""Cost and latency accounting: counts through cache and simulator, prices, percentiles, totals."""

from __future__ import annotations

import json

import pytest

from simsearch.errors import RecipeError
from simsearch.factory.build import meter_search_engine, unmetered
from simsearch.retrieval import accounting
from simsearch.retrieval.accounting import EngineUsage, LatencyHistogram, Ledger
from simsearch.retrieval.cache import CachedSearchEngine
from simsearch.simulator.engine import SimulatedSearchEngine
from simsearch.simulator.recipe import SearchConfig
from simsearch.types import Completion, Document, SamplingParams, SearchRequest


class CountingEngine:
    """A real-engine double: one document per request, and the requests it saw."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def search(self, requests):
        self.seen.extend(r.query for r in requests)
        return [[Document(title=r.query, text="t", source="bm25")] for r in requests]


class ScriptedGenerator:
    """A simulator generator: three-token completions, writing three numbered documents."""

    tokenizer = None

    def generate(self, prompts, params):
        return [Completion([1, 2, 3], "Doc 1: a\nDoc 2: b\nDoc 3: c", "stop") for _ in prompts]


def test_cache_hits_and_sent_queries_are_counted_apart(tmp_path):
    inner = CountingEngine()
    cached = CachedSearchEngine(inner, tmp_path / "c.sqlite", namespace="t")
    ledger = Ledger()
    engine = meter_search_engine(cached, SearchConfig(kind="serpapi", price_per_1k_queries=2.0), ledger, "web")
    engine.search([SearchRequest("a"), SearchRequest("b")])
    engine.search([SearchRequest("a"), SearchRequest("c"), SearchRequest("c")])
    usage = ledger.total["web"]
    # 5 asked; "a" was cached on the second call (1 hit); sent: a, b, then c once (deduplicated).
    assert (usage.searches, usage.search_calls, usage.cache_hits, usage.queries_sent) == (5, 2, 1, 3)
    assert inner.seen == ["a", "b", "c"]
    assert usage.query_cost() == pytest.approx(3 * 2.0 / 1000)  # the recipe's price wins over the default
    assert usage.latency.count == 2  # one latency per search call


def test_simulator_tokens_seconds_and_noisy_flags():
    sim = SimulatedSearchEngine(ScriptedGenerator(), preset="simsearch", seed=0)
    ledger = Ledger()
    engine = meter_search_engine(sim, SearchConfig(kind="simulator", gpu_hour_price=3.6), ledger, "sim")
    requests = [SearchRequest(q, top_k=3, question="Q?", num_noisy=k) for q, k in (("q1", 0), ("q2", 3))]
    results = engine.search(requests)
    assert [d.noisy for d in results[0]] == [False] * 3
    assert [d.noisy for d in results[1]] == [True] * 3
    usage = ledger.total["sim"]
    assert (usage.simulator_calls, usage.completion_tokens) == (1, 6)  # one generate call, 2 x 3 tokens
    assert usage.uncounted_prompts == 2  # string prompts, no tokenizer: prompt tokens unknown
    assert "simulator/sim/prompt_tokens" not in usage.metrics("sim")
    assert usage.simulator_cost() == pytest.approx(usage.simulator_s / 3600 * 3.6)
    assert unmetered(engine) is sim  # fidelity still sees the simulator and its parse statistics


def test_mixed_noisy_positions_are_flagged():
    sim = SimulatedSearchEngine(ScriptedGenerator(), preset="simsearch", seed=0)
    (docs,) = sim.search([SearchRequest("q", top_k=3, question="Q?", num_noisy=1)])
    from simsearch.simulator.engine import noisy_positions

    assert [i for i, d in enumerate(docs) if d.noisy] == noisy_positions("q", 3, 1)


def test_prices_default_by_kind_and_unknown_is_never_zero():
    ledger = Ledger()
    for name, kind in (("b", "bm25"), ("s", "serper"), ("h", "http")):
        meter_search_engine(CountingEngine(), SearchConfig(kind=kind, corpus="x", url="u"), ledger, name)
    assert ledger.total["b"].price_per_1k_queries == 0.0
    assert ledger.total["s"].price_per_1k_queries is None  # no documented default
    assert ledger.total["h"].query_cost() is None
    assert accounting.money(None) == "unknown" and accounting.money(0.0) == "$0.00"
    assert "cost/s/usd" not in ledger.total["s"].metrics("s")
    assert ledger.total["b"].metrics("b")["cost/b/usd"] == 0.0


def test_negative_price_is_refused():
    with pytest.raises(RecipeError, match=r"search.price_per_1k_queries"):
        SearchConfig(kind="bm25", corpus="x", price_per_1k_queries=-1.0).check("search")


def test_percentiles_within_bucket_resolution():
    hist = LatencyHistogram()
    samples = [0.001 * (i + 1) for i in range(100)]  # 1 ms .. 100 ms
    for s in samples:
        hist.add(s)
    # Nearest rank: p50 is the 50th sample (50 ms), p95 the 95th, p99 the 99th.
    for q, expected in ((50, 0.050), (95, 0.095), (99, 0.099)):
        assert hist.percentile(q) == pytest.approx(expected, rel=0.022)
    assert LatencyHistogram().percentile(50) is None


def test_window_resets_and_totals_merge_with_a_previous_invocation(tmp_path):
    ledger = Ledger()
    ledger.register("bm25", "bm25", price_per_1k_queries=0.0, gpu_hour_price=None)
    ledger.record("bm25", latency_s=0.01, searches=4, search_calls=1, queries_sent=4)
    assert ledger.step_metrics()["search/bm25/searches"] == 4.0
    ledger.record("bm25", latency_s=0.02, searches=2, search_calls=1, queries_sent=2)
    assert ledger.step_metrics()["search/bm25/searches"] == 2.0  # the window restarted
    previous = json.loads(json.dumps(accounting.cost_record({"bm25": ledger.total["bm25"]})))
    merged = accounting.merged_totals(previous, ledger.total)["bm25"]
    assert (merged.searches, merged.queries_sent, merged.latency.count) == (12, 12, 4)
    assert EngineUsage.from_dict(previous["engines"]["bm25"]).searches == 6


def test_simulator_line_prices_the_served_searches():
    usage = EngineUsage("simulator", 0.0, None, searches=2000, simulator_s=1800.0)
    line = accounting.simulator_line({"sim": usage})
    assert line.startswith("searches served by the simulator: 2,000")
    assert "an estimated $30.00 at serpapi's price ($15 / 1,000)" in line  # 2000 x 15 / 1000
    assert "serper's price unknown" in line
    assert "the simulator's own cost: unknown (0.500 h of generation)" in line
    usage.gpu_hour_price = 4.0
    assert "the simulator's own cost: $2.00" in accounting.simulator_line({"sim": usage})  # 0.5 h x $4
    assert accounting.simulator_line({"b": EngineUsage("bm25")}) == ""


def test_metered_generator_counts_token_prompts():
    ledger = Ledger()
    ledger.register("g", "simulator", price_per_1k_queries=0.0, gpu_hour_price=None)
    gen = accounting.MeteredGenerator(ScriptedGenerator(), ledger, "g")
    gen.generate([[1, 2], [3, 4, 5]], SamplingParams())
    usage = ledger.total["g"]
    assert (usage.prompt_tokens, usage.completion_tokens, usage.uncounted_prompts) == (5, 6, 0)


def test_serve_prints_what_it_served_and_cost():
    from simsearch.commands.serve import usage_line

    usage = EngineUsage("serpapi", 15.0, None, searches=30, cache_hits=10, queries_sent=20)
    assert usage_line(usage) == "30 searches, 10 cache hits, 20 queries sent, query cost $0.30"  # 20 x 15 / 1000
    sim = EngineUsage("simulator", 0.0, None, searches=2, queries_sent=2, simulator_s=36.0)
    assert usage_line(sim).endswith("simulator cost unknown (0.010 h of generation)")
