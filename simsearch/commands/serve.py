"""`simsearch serve RECIPE`: one configured engine behind Search-R1's `POST /retrieve`.

Setup builds the engine (a retriever, the simulator, optionally behind the cache) and the app;
the loop is uvicorn's; cleanup closes the batcher when uvicorn shuts down, and prints what was
served and what it cost (`retrieval.accounting`).
"""

from __future__ import annotations

import os
import socket
import warnings

import uvicorn

from simsearch.commands import preflight
from simsearch.config import ServeRecipe
from simsearch.errors import RecipeError
from simsearch.factory.build import build_search_engine, meter_search_engine
from simsearch.retrieval.accounting import EngineUsage, Ledger, money
from simsearch.retrieval.server import create_app

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
    """Serve the recipe's engine until interrupted."""
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
    engine = meter_search_engine(build_search_engine(recipe.search), recipe.search, ledger, recipe.search.kind)
    assert engine is not None  # ServeRecipe.check refuses kind=self
    app = create_app(
        engine,
        default_top_k=recipe.search.top_k,
        max_batch=recipe.max_batch,
        max_queries_per_request=recipe.max_queries_per_request,
        max_body_bytes=recipe.max_body_bytes,
        max_top_k=recipe.max_top_k,
        token=token,
    )
    print(f"simsearch serve: {recipe.search.kind} engine on http://{recipe.host}:{recipe.port}/retrieve")
    uvicorn.run(app, host=recipe.host, port=recipe.port, log_level="warning")
    print(f"simsearch serve: {usage_line(ledger.total[recipe.search.kind])}", flush=True)


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
