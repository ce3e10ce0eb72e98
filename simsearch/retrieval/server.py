"""Any `SearchEngine` behind Search-R1's `POST /retrieve` protocol.

Request: `{"queries": [str], "topk": int | null, "return_scores": bool}`, plus optional
simulator fields aligned with `queries`: `question`, `golden_answers`, `noisy` (per query: a bool,
or how many of top-k) or `p_noise` (one probability, a coin per query); and `step` (the client's
training step) and `client` (a name for its usage and curriculum). Response:
`{"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}` (plain document lists
without `return_scores`), always valid JSON, plus `p_noise` and `step` where the noise came from
the server's curriculum or the request's `p_noise`. An invalid body gets 413 (over the limits) or
422; a `ValueError` from the engine is a 422 for that request only; any other engine failure a 503
for the call's requests, and the server keeps serving.

With a `ServedCurriculum`, a request naming neither `noisy` nor `p_noise` gets its noise from the
client's place on the schedule; `POST /curriculum {"step", "client"?, "metrics"?}` reports a step.
With `context_preset`, a request lacking a question or gold answer for a query is refused (422)
before it reaches the simulator whose prompt needs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import math
import random
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError
from pydantic_core import PydanticSerializationError, to_json

from simsearch.curriculum.served import NoiseDraw, ServedCurriculum
from simsearch.errors import DataError
from simsearch.retrieval.accounting import ClientUsage
from simsearch.retrieval.base import SearchEngine
from simsearch.types import Document, SearchRequest


class RetrieveBody(BaseModel):
    """The JSON body of `POST /retrieve`."""

    queries: list[str] = Field(min_length=1)
    topk: int | None = Field(default=None, ge=1)
    return_scores: bool = False
    question: list[str | None] | None = None
    golden_answers: list[list[str]] | None = None
    noisy: list[bool | int] | None = None
    p_noise: float | None = Field(default=None, ge=0.0, le=1.0)
    step: int | None = Field(default=None, ge=0)
    client: str | None = Field(default=None, min_length=1, max_length=200)


class CurriculumBody(BaseModel):
    """The JSON body of `POST /curriculum`: a client's training step, and for an adaptive schedule its metrics."""

    step: int = Field(ge=0)
    client: str | None = Field(default=None, min_length=1, max_length=200)
    metrics: dict[str, float] | None = None


class _JSONResponse(JSONResponse):
    def render(self, content: object) -> bytes:
        try:
            # pydantic-core's encoder (already there under FastAPI) writes a 16-query answer in
            # a quarter of the time `json.dumps` takes, a third of the server's own CPU per
            # request. Non-finite floats become null, as `_score` already sends them.
            return to_json(content, inf_nan_mode="null")
        except PydanticSerializationError:
            # A lone surrogate (JSON can spell one: a corpus line with "\ud83d") has no UTF-8
            # form; JSON's \u escapes carry it, as they carried it into our corpus.
            return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


def _score(doc: Document) -> float | None:
    # JSON has no NaN or infinity; Search-R1 sends 0.0 for a missing score.
    if doc.score is None:
        return 0.0
    return doc.score if math.isfinite(doc.score) else None


def document_json(doc: Document, index: int) -> dict:
    """A document as Search-R1's server returns it: `contents` = title line + text."""
    return {"id": doc.id if doc.id is not None else str(index), "contents": f"{doc.title}\n{doc.text}"}


@dataclass
class _Pending:
    requests: list[SearchRequest]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


@dataclass
class ServerStats:
    """Counters exposed on `/health`."""

    http_requests: int = 0
    queued: int = 0  # requests waiting for the engine now
    queries: int = 0
    engine_calls: int = 0
    errors: int = 0
    clients: dict[str, ClientUsage] = field(default_factory=dict)  # by `client`, else the peer's address
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def as_dict(self) -> dict[str, int]:
        return {
            "http_requests": self.http_requests,
            "queued": self.queued,
            "queries": self.queries,
            "engine_calls": self.engine_calls,
            "errors": self.errors,
        }

    def record_client(self, name: str, *, searches: int, latency_s: float, failed: bool) -> None:
        """One answered `/retrieve` request of client `name`."""
        with self.lock:
            usage = self.clients.setdefault(name, ClientUsage())
            usage.record(searches=searches, latency_s=latency_s, failed=failed)


class _Batcher:
    """Coalesces queued requests into engine calls of at most `max_batch` queries, on one worker thread."""

    def __init__(self, engine: SearchEngine, max_batch: int, stats: ServerStats) -> None:
        self.engine = engine
        self.max_batch = max_batch
        self.stats = stats
        self._queue: list[_Pending] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="simsearch-batcher", daemon=True)
        self._thread.start()

    def submit(self, pending: _Pending) -> None:
        with self._cond:
            self._queue.append(pending)
            with self.stats.lock:
                self.stats.queued = len(self._queue)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)

    def _take(self) -> list[_Pending]:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            batch: list[_Pending] = []
            size = 0
            while self._queue and (not batch or size + len(self._queue[0].requests) <= self.max_batch):
                item = self._queue.pop(0)
                batch.append(item)
                size += len(item.requests)
            with self.stats.lock:
                self.stats.queued = len(self._queue)
            return batch

    def _work(self) -> None:
        while True:
            batch = self._take()
            if not batch:
                return
            for item, (value, error) in zip(batch, self._run(batch)):
                # RuntimeError: that request's event loop is closed, nobody is waiting.
                with contextlib.suppress(RuntimeError):
                    item.loop.call_soon_threadsafe(_resolve, item.future, value, error)

    def _run(self, batch: list[_Pending]) -> list[tuple[list[list[Document]] | None, Exception | None]]:
        flat = [request for item in batch for request in item.requests]
        try:
            results = self.engine.search(flat)
            if len(results) != len(flat):
                raise RuntimeError(f"engine returned {len(results)} result lists for {len(flat)} queries")
        except Exception as err:
            with self.stats.lock:
                self.stats.engine_calls += 1
                self.stats.errors += 1
            if _is_request_error(err) and len(batch) > 1:
                # One request the engine cannot honour must not fail the others coalesced with
                # it: find whose it is. Engines validate before working, so this is cheap.
                return [outcome for item in batch for outcome in self._run([item])]
            return [(None, err)] * len(batch)
        with self.stats.lock:
            self.stats.engine_calls += 1
        outcomes: list[tuple[list[list[Document]] | None, Exception | None]] = []
        start = 0
        for item in batch:
            outcomes.append((results[start : start + len(item.requests)], None))
            start += len(item.requests)
        return outcomes


def _is_request_error(err: Exception) -> bool:
    """A ValueError is the engine refusing a request; a DataError is its own data being bad."""
    return isinstance(err, ValueError) and not isinstance(err, DataError)


def _resolve(future: asyncio.Future, value: object, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)


def _error(status: int, message: str) -> JSONResponse:
    return _JSONResponse(status_code=status, content={"error": message})


def build_requests(body: RetrieveBody, default_top_k: int, rng: random.Random) -> list[SearchRequest]:
    """Engine requests from a validated body; `ValueError` on misaligned fields."""
    n = len(body.queries)
    for name in ("question", "golden_answers", "noisy"):
        values = getattr(body, name)
        if values is not None and len(values) != n:
            raise ValueError(f"'{name}' has {len(values)} entries for {n} queries; align them")
    if body.noisy is not None and body.p_noise is not None:
        raise ValueError("give either 'noisy' or 'p_noise', not both")
    top_k = body.topk or default_top_k
    requests = []
    for i, query in enumerate(body.queries):
        if body.noisy is not None:
            flag = body.noisy[i]
            num_noisy = top_k if flag is True else 0 if flag is False else int(flag)
        elif body.p_noise is not None:
            num_noisy = top_k if rng.random() < body.p_noise else 0
        else:
            num_noisy = 0
        if not 0 <= num_noisy <= top_k:
            raise ValueError(f"noisy[{i}]={num_noisy} must lie in [0, topk={top_k}]")
        requests.append(
            SearchRequest(
                query=query,
                top_k=top_k,
                question=body.question[i] if body.question else None,
                golden_answers=list(body.golden_answers[i]) if body.golden_answers else [],
                num_noisy=num_noisy,
            )
        )
    return requests


@dataclass(frozen=True)
class _Limits:
    """What `/retrieve` refuses before any search: a wrong token, or a body too big to serve."""

    token: str | None
    max_body_bytes: int
    max_queries_per_request: int
    max_top_k: int


async def _read_body(request: Request, limits: _Limits) -> RetrieveBody | JSONResponse:
    """The validated body of a request, or the 401 / 413 / 422 answer refusing it."""
    if not _authorized(request, limits):
        return _error(401, "missing or wrong bearer token in the Authorization header")
    max_body_bytes = limits.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        return _error(413, f"request body over {max_body_bytes} bytes; send fewer queries per request")
    raw = await request.body()
    if len(raw) > max_body_bytes:
        return _error(413, f"request body over {max_body_bytes} bytes; send fewer queries per request")
    try:
        body = RetrieveBody.model_validate_json(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        return _error(422, f"invalid request at '{where}': {first['msg']}")
    if len(body.queries) > limits.max_queries_per_request:
        return _error(
            413, f"{len(body.queries)} queries over the limit of {limits.max_queries_per_request} per request"
        )
    if body.topk is not None and body.topk > limits.max_top_k:
        return _error(422, f"topk={body.topk} is over this server's limit of {limits.max_top_k} documents per query")
    return body


async def _search(batcher: _Batcher, requests: list[SearchRequest]) -> list[list[Document]] | JSONResponse:
    """The engine's answer through the batcher, or the 422 / 503 answer naming its failure."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    batcher.submit(_Pending(requests, future, loop))
    try:
        results: list[list[Document]] = await future
    except Exception as err:
        if _is_request_error(err):
            return _error(422, f"the search engine cannot answer this request: {err}")
        return _error(503, f"search engine failed: {type(err).__name__}: {err}")
    return results


def _result_payload(results: list[list[Document]], return_scores: bool) -> list[list[dict]]:
    if return_scores:
        return [[{"document": document_json(d, i), "score": _score(d)} for i, d in enumerate(docs)] for docs in results]
    return [[document_json(d, i) for i, d in enumerate(docs)] for docs in results]


def missing_context(requests: list[SearchRequest]) -> str | None:
    """What the first request lacking a question or a gold answer misses, or None when all have both."""
    for i, request in enumerate(requests):
        lacking = [
            name
            for name, present in (
                ("question", bool(request.question and request.question.strip())),
                ("golden_answers", any(answer.strip() for answer in request.golden_answers)),
            )
            if not present
        ]
        if lacking:
            return f"query {i} ({request.query!r}) came without {' or '.join(repr(n) for n in lacking)}"
    return None


@dataclass
class _Serving:
    """What `/retrieve` answers with: the batcher, the limits and the noise decisions."""

    batcher: _Batcher
    limits: _Limits
    default_top_k: int
    rng: random.Random
    curriculum: ServedCurriculum | None
    context_preset: str


def create_app(
    engine: SearchEngine,
    *,
    default_top_k: int = 3,
    max_batch: int = 256,
    max_queries_per_request: int = 512,
    max_body_bytes: int = 1_000_000,
    max_top_k: int = 100,
    token: str | None = None,
    seed: int = 0,
    curriculum: ServedCurriculum | None = None,
    context_preset: str = "",
) -> FastAPI:
    """A FastAPI app serving `engine` over `POST /retrieve`, `POST /curriculum` and `GET /health`.

    Args:
        default_top_k: Documents per query when a request leaves `topk` null.
        max_batch: Queries per engine call; concurrent requests are coalesced up to this.
        max_queries_per_request: Larger requests get 413.
        max_body_bytes: Larger bodies get 413 before they are parsed.
        max_top_k: A larger `topk` gets 422.
        token: When set, `/retrieve` and `/curriculum` require `Authorization: Bearer <token>`.
        seed: Seeds the coin flips of `p_noise` requests.
        curriculum: The noise of requests naming neither `noisy` nor `p_noise`; None = no noise.
        context_preset: The simulator preset whose prompts need each query's question and gold
            answer ("" = none): requests without them get 422 naming the query.
    """
    if not 1 <= default_top_k <= max_top_k:
        raise ValueError(f"default_top_k={default_top_k} must lie in [1, max_top_k={max_top_k}]")
    stats = ServerStats()
    batcher = _Batcher(engine, max_batch, stats)
    limits = _Limits(token, max_body_bytes, max_queries_per_request, max_top_k)
    serving = _Serving(batcher, limits, default_top_k, random.Random(seed), curriculum, context_preset)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        batcher.close()

    app = FastAPI(title="simsearch retrieval server", lifespan=lifespan)
    app.state.stats, app.state.curriculum = stats, curriculum

    @app.exception_handler(Exception)
    async def internal_error(_: Request, err: Exception) -> JSONResponse:
        # A bug of ours still answers in JSON, so clients can read and report it.
        return _error(500, f"internal server error: {type(err).__name__}: {err}")

    @app.get("/health")
    async def health() -> dict:
        return _health(stats, curriculum)

    @app.post("/retrieve")
    async def retrieve(request: Request) -> JSONResponse:
        return await _retrieve(request, serving)

    @app.post("/curriculum")
    async def report_step(request: Request) -> JSONResponse:
        return await _report_step(request, serving)

    return app


def _health(stats: ServerStats, curriculum: ServedCurriculum | None) -> dict:
    """`/health`: the counters, each client's usage, and with a curriculum each client's place."""
    with stats.lock:
        clients = {name: usage.summary() for name, usage in sorted(stats.clients.items())}
    extra = {"curriculum": curriculum.state()} if curriculum is not None else {}
    return {"status": "ok", **stats.as_dict(), "clients": clients, **extra}


def _authorized(request: Request, limits: _Limits) -> bool:
    if limits.token is None:
        return True
    given = request.headers.get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {limits.token}".encode())


async def _report_step(request: Request, serving: _Serving) -> JSONResponse:
    """Answers `POST /curriculum`: records a client's training step; 409 without a curriculum."""
    if not _authorized(request, serving.limits):
        return _error(401, "missing or wrong bearer token in the Authorization header")
    if serving.curriculum is None:
        return _error(409, "this server runs no curriculum; serve it with a `curriculum` section")
    try:
        body = CurriculumBody.model_validate_json(await request.body())
    except ValidationError as err:
        first = err.errors()[0]
        return _error(422, f"invalid request at '{'.'.join(str(p) for p in first['loc']) or 'body'}': {first['msg']}")
    try:
        draw = serving.curriculum.report(body.client or "", body.step, body.metrics)
    except ValueError as err:
        return _error(422, str(err))
    return _JSONResponse({"step": draw.step, "p_noise": draw.p_noise})


def _with_noise(
    body: RetrieveBody, requests: list[SearchRequest], curriculum: ServedCurriculum | None
) -> tuple[list[SearchRequest], NoiseDraw | None]:
    """`requests` with the curriculum's noisy documents, and its step and p_noise; unchanged (and
    None) without a curriculum or where the body decides the noise itself."""
    if curriculum is None or body.noisy is not None or body.p_noise is not None:
        return requests, None
    draw = curriculum.draw(body.client or "", len(requests), body.step)
    counts = curriculum.noisy_counts(draw.p_noise, requests[0].top_k, len(requests))
    return [replace(r, num_noisy=n) for r, n in zip(requests, counts, strict=True)], draw


async def _retrieve(request: Request, serving: _Serving) -> JSONResponse:
    """Answers one `POST /retrieve`: the body checked against the limits, its queries searched by the batcher."""
    stats = serving.batcher.stats
    began = time.perf_counter()
    with stats.lock:
        stats.http_requests += 1
    body = await _read_body(request, serving.limits)
    if isinstance(body, JSONResponse):
        return body
    try:
        requests = build_requests(body, serving.default_top_k, serving.rng)
    except ValueError as err:
        return _error(422, str(err))
    lacking = missing_context(requests) if serving.context_preset else None
    if lacking:
        return _error(
            422,
            f"preset {serving.context_preset!r} writes results from the question and its gold answers: {lacking}; "
            "send 'question' and 'golden_answers' for every query, or serve an answer-blind preset (simsearch)",
        )
    requests, draw = _with_noise(body, requests, serving.curriculum)
    results = await _search(serving.batcher, requests)
    client = body.client or (request.client.host if request.client else "unknown")
    stats.record_client(client, searches=len(requests), latency_s=time.perf_counter() - began,
                        failed=isinstance(results, JSONResponse))  # fmt: skip
    if isinstance(results, JSONResponse):
        return results
    with stats.lock:
        stats.queries += len(requests)
    payload: dict[str, object] = {"result": _result_payload(results, body.return_scores)}
    if draw is not None:
        payload |= {"p_noise": draw.p_noise, "step": draw.step}
    elif body.p_noise is not None:
        payload["p_noise"] = body.p_noise
    return _JSONResponse(payload)
