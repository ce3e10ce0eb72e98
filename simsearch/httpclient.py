"""Bounded retries, backoff and client-side load balancing for every HTTP client in simsearch.

Connection errors, timeouts, HTTP 408, 429, 5xx and non-object JSON bodies are retried with
backoff; other 4xx answers are not. The final failure raises a `ServiceError` subclass naming
the method, URL(s), attempts and last error, secrets masked.
"""

from __future__ import annotations

import email.utils
import json
import os
import random
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from simsearch.errors import ServiceError

T = TypeVar("T")
R = TypeVar("R")

# 408 Request Timeout and 429 Too Many Requests are transient by definition; any 5xx may be a
# restarting or overloaded server.
_RETRYABLE_4XX = frozenset({408, 429})
_BODY_SNIPPET_CHARS = 300


class SearchServiceError(ServiceError):
    """A search service (Search-R1 `/retrieve`, Serper, SerpAPI) failed after bounded retries."""


class GenerationServiceError(ServiceError):
    """A generation server (vLLM, SGLang) failed after bounded retries or answered nonsense."""


def backoff_delay(retry_index: int, backoff_s: float, max_backoff_s: float, jitter: float) -> float:
    """Seconds before retry `retry_index` (0-based): the doubling backoff, capped, scaled into [1/2, 1) by `jitter`."""
    base = min(max_backoff_s, backoff_s * 2.0**retry_index)
    return base * (0.5 + 0.5 * jitter)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds a `Retry-After` value asks for (HTTP-date against Unix time `now`); None if unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a naive parse means no zone was given
        return None
    return max(0.0, when.timestamp() - now)


def redact(text: str, secrets: Collection[str]) -> str:
    """Replaces every occurrence of each non-empty secret in `text` by `***`."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def env_secret(owner: str, variable: str, hint: str) -> str:
    """The secret held in environment variable `variable`; `ValueError` naming `owner` and `hint` when unset."""
    value = os.environ.get(variable, "")
    if not value:
        raise ValueError(f"{owner}: environment variable {variable} is not set; {hint}")
    return value


def bearer_headers(token: str | None) -> dict[str, str]:
    """`Authorization: Bearer <token>`, or no header without a token."""
    return {"Authorization": f"Bearer {token}"} if token else {}


@dataclass(frozen=True)
class ServerKey:
    """A server's optional API key or bearer token from the environment (`value` never shown in a repr)."""

    value: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, owner: str, variable: str | None, what: str, *, required: bool = False) -> ServerKey:
        """The key held in environment variable `variable` (None: no key).

        Raises:
            ValueError: `variable` is named but unset or empty, or None when `required`; names `owner`.
        """
        if variable is None:
            if required:
                raise ValueError(f"{owner} needs an {what}: name the environment variable holding it with api_key_env=")
            return cls()
        if required:
            hint = (
                f"export your {what} in it (keys are never read from recipes), or name another variable with "
                "api_key_env="
            )
        else:
            hint = f"export the server's {what} in it, or pass api_key_env=None for a server without one"
        return cls(env_secret(owner, variable, hint))

    @property
    def headers(self) -> dict[str, str]:
        return bearer_headers(self.value)

    @property
    def secrets(self) -> tuple[str, ...]:
        return (self.value,) if self.value else ()


class ReplicaSet:
    """Equivalent servers behind one endpoint, balanced on the client side; thread-safe.

    Each request goes to the healthy replica with the fewest requests in flight; a failed replica
    is avoided for `cooldown_s` seconds.
    """

    def __init__(self, base_urls: Sequence[str], *, cooldown_s: float = 10.0) -> None:
        if not base_urls:
            raise ValueError("ReplicaSet needs at least one base URL")
        if len(set(base_urls)) != len(base_urls):
            raise ValueError(f"ReplicaSet got duplicate base URLs: {list(base_urls)}")
        self.base_urls = list(base_urls)
        self.cooldown_s = cooldown_s
        self._lock = threading.Lock()
        self._in_flight = dict.fromkeys(self.base_urls, 0)
        self._down_until = dict.fromkeys(self.base_urls, 0.0)
        self._cursor = 0

    def acquire(self, tried: Collection[str] = ()) -> tuple[str, bool]:
        """Chooses a replica not in `tried` and counts it in flight; returns (base URL, fresh: no backoff needed)."""
        with self._lock:
            now = time.monotonic()
            n = len(self.base_urls)
            # Rotate the scan start so ties in load are broken round-robin.
            order = [self.base_urls[(self._cursor + i) % n] for i in range(n)]
            self._cursor = (self._cursor + 1) % n
            healthy = [u for u in order if self._down_until[u] <= now]
            fresh = [u for u in healthy if u not in tried]
            if fresh:
                chosen = min(fresh, key=lambda u: self._in_flight[u])
            elif healthy:
                chosen = min(healthy, key=lambda u: self._in_flight[u])
            else:
                chosen = min(order, key=lambda u: self._down_until[u])
            self._in_flight[chosen] += 1
            return chosen, bool(fresh)

    def release(self, base_url: str, *, failed: bool) -> None:
        """Ends an attempt on `base_url`; a failure marks the replica down for the cooldown."""
        with self._lock:
            self._in_flight[base_url] -= 1
            # A success proves the replica is up again, whatever an earlier failure said.
            self._down_until[base_url] = time.monotonic() + self.cooldown_s if failed else 0.0

    def healthy(self) -> list[str]:
        with self._lock:
            now = time.monotonic()
            return [u for u in self.base_urls if self._down_until[u] <= now]


class _Retryable(Exception):
    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class _Fatal(Exception):
    """One attempt failed in a way no retry can fix (a 4xx, a malformed URL)."""


@dataclass(frozen=True)
class _Request:
    """What every attempt of one `request_json` call sends, the URL aside."""

    method: str
    path: str
    json_body: Any
    params: Mapping[str, Any] | None
    headers: Mapping[str, str] | None
    timeout_s: float
    secrets: Collection[str]


@dataclass(frozen=True)
class _Backoff:
    backoff_s: float
    max_backoff_s: float
    max_retry_after_s: float

    def delay(self, retry_index: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_retry_after_s)
        return backoff_delay(retry_index, self.backoff_s, self.max_backoff_s, random.random())


def _one_attempt(client: httpx.Client, url: str, request: _Request, *, now: Callable[[], float]) -> dict[str, Any]:
    timeout_s, secrets = request.timeout_s, request.secrets
    try:
        response = client.request(
            request.method,
            url,
            json=request.json_body,
            params=request.params,
            headers=request.headers,
            timeout=httpx.Timeout(timeout_s),
        )
    except httpx.UnsupportedProtocol as exc:
        raise _Fatal(f"{type(exc).__name__}: {exc} (URLs must start with http:// or https://)") from exc
    except httpx.TimeoutException as exc:
        raise _Retryable(f"{type(exc).__name__}: no answer within timeout_s={timeout_s} ({exc})") from exc
    except httpx.RequestError as exc:
        raise _Retryable(f"{type(exc).__name__}: {exc}") from exc

    status = response.status_code
    # Masked before the cut: a secret straddling the cut would otherwise leave its head unmasked.
    snippet = redact(response.text, secrets)[:_BODY_SNIPPET_CHARS]
    if status in _RETRYABLE_4XX or status >= 500:
        retry_after = parse_retry_after(response.headers.get("retry-after"), now())
        raise _Retryable(f"HTTP {status}: {snippet}", retry_after)
    if status >= 400:
        raise _Fatal(f"HTTP {status} (client errors are not retried): {snippet}")
    try:
        data = json.loads(response.content)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _Retryable(f"malformed JSON in the HTTP {status} response ({exc}): {snippet!r}") from exc
    if not isinstance(data, dict):
        raise _Retryable(f"expected a JSON object, got {type(data).__name__}: {snippet!r}")
    return data


def request_json(
    client: httpx.Client,
    method: str,
    target: str | ReplicaSet,
    *,
    path: str = "",
    json_body: Any = None,
    params: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    retries: int,
    backoff_s: float,
    timeout_s: float,
    max_backoff_s: float = 30.0,
    max_retry_after_s: float = 60.0,
    error_cls: type[ServiceError] = ServiceError,
    secrets: Collection[str] = (),
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Sends one JSON request with bounded retries and returns the decoded JSON object.

    Args:
        target: A full URL, or a `ReplicaSet` whose base URLs are joined with `path`.
        headers: Extra headers; never written into errors.
        retries: Retries after the first attempt (0 = one attempt).
        timeout_s: Timeout of each connect / write / read / pool wait.
        max_retry_after_s: Cap on an honoured `Retry-After`.
        error_cls: The `ServiceError` subclass raised on failure.
        secrets: Strings masked as `***` in error messages.

    Raises:
        ServiceError: `error_cls`, naming the method, URL(s), attempts and the last error.
        ValueError: A negative `retries` or a non-positive `timeout_s`.
    """
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}: a request needs a timeout")
    replicas = target if isinstance(target, ReplicaSet) else ReplicaSet([target], cooldown_s=0.0)
    request = _Request(method, path, json_body, params, headers, timeout_s, secrets)
    backoff = _Backoff(backoff_s, max_backoff_s, max_retry_after_s)
    return _send_with_retries(client, replicas, request, retries, backoff, error_cls, sleep)


def _send_with_retries(
    client: httpx.Client,
    replicas: ReplicaSet,
    request: _Request,
    retries: int,
    backoff: _Backoff,
    error_cls: type[ServiceError],
    sleep: Callable[[float], None],
) -> dict[str, Any]:
    method, path, secrets = request.method, request.path, request.secrets
    tried: list[str] = []
    last_error = ""
    last_retry_after: float | None = None
    attempts = 0
    for attempt in range(retries + 1):
        base_url, fresh = replicas.acquire(tried)
        if attempt > 0 and not fresh:
            sleep(backoff.delay(attempt - 1, last_retry_after))
        url = base_url.rstrip("/") + path if path else base_url
        attempts += 1
        try:
            data = _one_attempt(client, url, request, now=time.time)
        except _Retryable as exc:
            replicas.release(base_url, failed=True)
            tried.append(base_url)
            last_error = f"from {url}: {exc.reason}"
            last_retry_after = exc.retry_after
            continue
        except _Fatal as exc:
            replicas.release(base_url, failed=False)
            message = f"{method} {url} failed: {exc}"
            raise error_cls(redact(message, secrets)) from None
        replicas.release(base_url, failed=False)
        return data
    where = ", ".join(replicas.base_urls) if len(replicas.base_urls) > 1 else replicas.base_urls[0]
    endpoint = f"{path} on {where}" if path else where
    message = (
        f"{method} {endpoint} failed after {attempts} attempt(s) (retries={retries}); "
        f"last error {last_error}. Check that the server is running and reachable at that "
        f"address, or raise the retry count / timeout_s if it is only slow."
    )
    raise error_cls(redact(message, secrets))


def post_json(
    client: httpx.Client,
    url: str,
    payload: Any,
    *,
    retries: int,
    backoff_s: float,
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
    error_cls: type[ServiceError] = ServiceError,
    secrets: Collection[str] = (),
) -> dict[str, Any]:
    """POSTs `payload` to `url` with `request_json`'s bounded retries."""
    return request_json(
        client,
        "POST",
        url,
        json_body=payload,
        headers=headers,
        retries=retries,
        backoff_s=backoff_s,
        timeout_s=timeout_s,
        error_cls=error_cls,
        secrets=secrets,
    )


def run_concurrently(fn: Callable[[T], R], items: Sequence[T], max_workers: int) -> list[R]:
    """`[fn(item) for item in items]` on up to `max_workers` threads; the first exception propagates."""
    if max_workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {max_workers}")
    if len(items) <= 1 or max_workers == 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(max_workers, len(items))) as pool:
        futures = [pool.submit(fn, item) for item in items]
        try:
            return [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            raise
