"""`simsearch serve RECIPE`: one configured engine behind Search-R1's `POST /retrieve`.

Setup builds the engine (a retriever, the simulator, optionally behind the cache), the noise
curriculum of a recipe with a `curriculum` section (`curriculum.served`: each client's step, as it
reports it or as its searches count it) and the app (`build_app`); the loop is uvicorn's; cleanup
closes the batcher when uvicorn shuts down, and prints what was served and what it cost
(`retrieval.accounting`), per client too, and where each client's curriculum stood; also into
`run_dir/cost.json` when the recipe gives a `run_dir` (added to what earlier sessions left there).

SIGTERM shuts down as Ctrl-C does: uvicorn stops accepting, lets the requests in flight finish for
up to `drain_s` seconds, then cancels them; the closing line follows and the exit status is 0.
(uvicorn re-raises the signal it caught after its shutdown; `_signals_recorded` takes that
re-raise, which would otherwise kill the process before the closing line.)
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from simsearch.commands import preflight
from simsearch.config import SearchConfig, ServeRecipe
from simsearch.curriculum.served import ServedCurriculum
from simsearch.errors import RecipeError
from simsearch.factory.build import build_schedule, build_search_engine, meter_search_engine
from simsearch.retrieval import accounting
from simsearch.retrieval.accounting import ClientUsage, EngineUsage, Ledger, client_costs, money
from simsearch.retrieval.server import create_app
from simsearch.simulator.prompts import PRESETS

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def bearer_token(env_name: str) -> str | None:
    """The bearer token from the environment variable the recipe names (never from the recipe)."""
    if not env_name:
        return None
    token = os.environ.get(env_name, "")
    if not token:
        raise RecipeError(f"token_env={env_name!r}: that environment variable is empty or unset; export it")
    return token


def check_port(host: str, port: int) -> None:
    """Refuses a port something already listens on, before the engine loads.

    Raises:
        RecipeError: The address is taken (or cannot be bound), naming `port` and the fix.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a closing socket does not block
        try:
            probe.bind((host, port))
        except OSError as err:
            raise RecipeError(
                f"port={port}: cannot listen on {host}:{port} ({err.strerror or err}); pick a free port "
                f"(e.g. port={port + 1}) or stop what listens there"
            ) from None


def main(recipe: ServeRecipe) -> None:
    """Serve the recipe's engine until SIGTERM or SIGINT; then the closing line (and `run_dir/cost.json`)."""
    preflight.set_threads(recipe.threads)
    preflight.check_paths(recipe)
    check_port(recipe.host, recipe.port)
    token = bearer_token(recipe.token_env)
    if recipe.host not in LOOPBACK:
        warnings.warn(
            f"serving on {recipe.host}: reachable from other machines"
            + ("" if token else "; set token_env to require a bearer token"),
            stacklevel=1,
        )
    ledger = Ledger()
    app = build_app(recipe, ledger, token)
    previous = accounting.read_cost(recipe.run_dir) if recipe.run_dir else None
    print(f"simsearch serve: {recipe.search.kind} engine on http://{recipe.host}:{recipe.port}/retrieve", flush=True)
    if recipe.curriculum is not None:
        print(f"simsearch serve: curriculum {recipe.curriculum.kind} over {recipe.curriculum.total_steps} steps"
              f" ({recipe.curriculum_total_searches} searches when no step is reported)", flush=True)  # fmt: skip
    with _signals_recorded():
        uvicorn.run(app, host=recipe.host, port=recipe.port, log_level="warning",
                    timeout_graceful_shutdown=recipe.drain_s or None)  # fmt: skip
    usage = ledger.total[recipe.search.kind]
    print(f"simsearch serve: {usage_line(usage)}", flush=True)
    clients: dict[str, ClientUsage] = app.state.stats.clients
    for line in client_lines(clients, usage, app.state.curriculum.state() if app.state.curriculum else {}):
        print(f"simsearch serve: {line}", flush=True)
    if recipe.run_dir:
        Path(recipe.run_dir).mkdir(parents=True, exist_ok=True)
        accounting.write_cost(recipe.run_dir, previous, ledger.total, clients)
        print(f"simsearch serve: accounting in {Path(recipe.run_dir) / accounting.COST_FILE}", flush=True)


def build_app(recipe: ServeRecipe, ledger: Ledger, token: str | None = None) -> FastAPI:
    """The recipe's engine, metered into `ledger`, behind `/retrieve` with its curriculum and preset checks."""
    engine = meter_search_engine(build_search_engine(recipe.search), recipe.search, ledger, recipe.search.kind)
    assert engine is not None  # ServeRecipe.check refuses kind=self
    return create_app(
        engine,
        default_top_k=recipe.search.top_k,
        max_batch=recipe.max_batch,
        max_queries_per_request=recipe.max_queries_per_request,
        max_body_bytes=recipe.max_body_bytes,
        max_top_k=recipe.max_top_k,
        token=token,
        curriculum=served_curriculum(recipe),
        context_preset=context_preset(recipe.search),
    )


def served_curriculum(recipe: ServeRecipe) -> ServedCurriculum | None:
    """The recipe's `curriculum` as the server runs it (one schedule per client); None without one."""
    cfg = recipe.curriculum
    if cfg is None:
        return None
    return ServedCurriculum(
        lambda: build_schedule(cfg),
        total_steps=cfg.total_steps,
        total_searches=recipe.curriculum_total_searches,
        granularity=cfg.granularity,
    )


def context_preset(search: SearchConfig) -> str:
    """The simulator preset whose prompts need each query's question and gold answer ("" = none)."""
    if search.kind != "simulator" or not PRESETS[search.simulator.preset].always_shows_context:
        return ""
    return search.simulator.preset


@contextmanager
def _signals_recorded() -> Iterator[list[int]]:
    """SIGTERM and SIGINT only recorded while it lasts (uvicorn installs its own while it serves)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {sig: signal.signal(sig, lambda signum, _: received.append(signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}  # fmt: skip
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def client_lines(clients: dict[str, ClientUsage], usage: EngineUsage, curriculum: dict[str, Any]) -> list[str]:
    """One closing line per client: its searches, request latency and share of the cost, and where
    its curriculum stood (clients that named themselves share their name with the curriculum)."""
    costs = client_costs(clients, usage)
    lines = []
    for name, client in sorted(clients.items()):
        p99 = client.latency.percentile(99)
        line = (f"client {name}: {client.searches:,} searches in {client.requests:,} requests"
                f"{'' if p99 is None else f', p99 {1000 * p99:.1f} ms'}, cost {money(costs[name])}")  # fmt: skip
        lines.append(line)
    for name, place in curriculum.items():
        if place["step"] is not None:
            lines.append(f"curriculum {name}: step {place['step']} ({place['source']}), p_noise "
                         f"{place['p_noise']:.3f}, {place['searches']:,} searches")  # fmt: skip
    return lines


def usage_line(usage: EngineUsage) -> str:
    """What a serve session answered and cost, printed when it stops (a server has no run directory)."""
    p50, p99 = usage.latency.percentile(50), usage.latency.percentile(99)
    latency = "" if p50 is None or p99 is None else f", latency p50 {1000 * p50:.1f} ms / p99 {1000 * p99:.1f} ms"
    line = (
        f"{usage.searches:,} searches, {usage.cache_hits:,} cache hits, {usage.queries_sent:,} queries sent"
        f"{latency}, query cost {money(usage.query_cost())}"
    )
    if usage.kind == "simulator":
        line += f", simulator cost {money(usage.simulator_cost())} ({usage.simulator_s / 3600:.3f} h of generation)"
    return line
