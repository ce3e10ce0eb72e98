"""Web search through Serper and SerpAPI (Google results): title + snippet documents.

Both engines send one HTTP request per query, concurrently (at most `max_concurrency` in flight)
for a batch, with the bounded retries of `simsearch.httpclient` (429 rate limits included,
`Retry-After` honoured up to a cap). The top-k documents are the first k organic results in the
order the service returns them: deterministic, unlike SSRL's real-search evaluation, which
randomly kept 1 to 3 snippets. Documents are `Document(title, text=snippet, source, id=link)`.

API keys are read only from an environment variable named in the constructor (never from a
recipe, so they never land in a saved run directory), and never appear in a repr, a log line or
an error message. SerpAPI takes its key in the query string; it is added below the client's
logging layer (httpx logs every request URL at INFO level), see `_QueryKeyTransport`.
"""

from __future__ import annotations

import urllib.parse
import urllib.request
from typing import Any

import httpx

from simsearch.httpclient import SearchServiceError, env_secret, redact, request_json, run_concurrently
from simsearch.types import Document, SearchRequest

SERPER_URL = "https://google.serper.dev/search"
SERPAPI_URL = "https://serpapi.com/search"


def _read_key(engine: str, api_key_env: str) -> str:
    return env_secret(
        engine,
        api_key_env,
        "export your API key in it (keys are never read from recipes), or name another variable with api_key_env=",
    )


def _organic_documents(organic: Any, top_k: int, source: str, url: str, query: str, api_key: str) -> list[Document]:
    """The first `top_k` organic results, in the service's order, as documents."""
    if not isinstance(organic, list):
        raise SearchServiceError(
            f"{source} at {url} returned organic results that are not a list for query "
            f"{query!r}: {redact(str(organic), (api_key,))[:300]}"
        )
    documents = []
    for result in organic[:top_k]:
        if not isinstance(result, dict) or not isinstance(result.get("title"), str):
            raise SearchServiceError(
                f"{source} at {url} returned an organic result without a title for query "
                f"{query!r}: {redact(str(result), (api_key,))[:300]}"
            )
        link = result.get("link")
        documents.append(
            Document(
                title=result["title"],
                text=str(result.get("snippet", "")),
                source=source,
                id=None if link is None else str(link),
            )
        )
    return documents


def _check_bounds(engine: str, timeout_s: float, max_retries: int, max_concurrency: int) -> None:
    if timeout_s <= 0 or max_retries < 0 or max_concurrency < 1:
        raise ValueError(
            f"{engine} needs timeout_s > 0, max_retries >= 0 and max_concurrency >= 1; got "
            f"{timeout_s}, {max_retries}, {max_concurrency}"
        )


class SerperSearchEngine:
    """Google results through Serper: `POST {base_url}` with `X-API-KEY`, body `{"q", "num"}`."""

    def __init__(
        self,
        *,
        api_key_env: str = "SERPER_API_KEY",
        base_url: str = SERPER_URL,
        timeout_s: float = 20.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        max_concurrency: int = 4,
        max_retry_after_s: float = 60.0,
    ) -> None:
        """Creates the client and reads the API key from the environment.

        Args:
            api_key_env: name of the environment variable holding the Serper key.
            base_url: the search endpoint (tests point it at a local server).
            timeout_s: timeout of each connect / read / write.
            max_retries: retries of a failed query before raising.
            backoff_s: base of the exponential backoff between retries.
            max_concurrency: queries in flight at once.
            max_retry_after_s: cap on an honoured `Retry-After`.

        Raises:
            ValueError: when the variable is not set, or on a non-positive bound.
        """
        _check_bounds("SerperSearchEngine", timeout_s, max_retries, max_concurrency)
        self._api_key = _read_key("SerperSearchEngine", api_key_env)
        self.api_key_env = api_key_env
        self.base_url = base_url
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_concurrency = max_concurrency
        self.max_retry_after_s = max_retry_after_s
        self._client = httpx.Client(limits=httpx.Limits(max_connections=max_concurrency))

    def __repr__(self) -> str:
        # Never the API key: only the name of the variable that holds it.
        return f"SerperSearchEngine(base_url={self.base_url!r}, api_key_env={self.api_key_env!r})"

    def close(self) -> None:
        """Closes the connection pool."""
        self._client.close()

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        """One Serper query per request, sent concurrently; the first top-k organic results.

        Raises:
            SearchServiceError: when a query fails after the bounded retries.
        """
        return run_concurrently(self._search_one, requests, self.max_concurrency)

    def _search_one(self, request: SearchRequest) -> list[Document]:
        data = request_json(
            self._client,
            "POST",
            self.base_url,
            json_body={"q": request.query, "num": request.top_k},
            headers={"X-API-KEY": self._api_key},
            retries=self.max_retries,
            backoff_s=self.backoff_s,
            timeout_s=self.timeout_s,
            max_retry_after_s=self.max_retry_after_s,
            error_cls=SearchServiceError,
            secrets=(self._api_key,),
        )
        # No "organic" key: Google had no organic result for the query.
        return _organic_documents(
            data.get("organic", []), request.top_k, "serper", self.base_url, request.query, self._api_key
        )


def _environment_proxy(url: str) -> str | None:
    """The proxy the standard environment variables (HTTPS_PROXY, NO_PROXY, ...) give `url`."""
    split = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass(split.hostname or ""):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(split.scheme) or proxies.get("all")


class _QueryKeyTransport(httpx.BaseTransport):
    """Adds `api_key=...` to each request's query string just before it is sent.

    httpx logs `request.url` at INFO level after each request; the client only ever sees the
    URL without the key, so neither that log line nor an exception shows it. A client with its
    own transport ignores the proxy environment variables, so the proxy is resolved here.
    """

    def __init__(self, api_key: str, *, proxy: str | None, max_connections: int) -> None:
        self._api_key = api_key
        self._inner = httpx.HTTPTransport(proxy=proxy, limits=httpx.Limits(max_connections=max_connections))

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        keyed = httpx.Request(
            request.method,
            request.url.copy_add_param("api_key", self._api_key),
            headers=request.headers,
            stream=request.stream,
            extensions=request.extensions,  # carries the timeouts
        )
        return self._inner.handle_request(keyed)

    def close(self) -> None:
        self._inner.close()


class SerpAPISearchEngine:
    """Google results through SerpAPI: `GET {base_url}?engine=google&q=..&num=..&api_key=..`."""

    def __init__(
        self,
        *,
        api_key_env: str = "SERPAPI_API_KEY",
        base_url: str = SERPAPI_URL,
        timeout_s: float = 30.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        max_concurrency: int = 4,
        max_retry_after_s: float = 60.0,
    ) -> None:
        """Creates the client and reads the API key from the environment.

        Args:
            api_key_env: name of the environment variable holding the SerpAPI key.
            base_url: the search endpoint (tests point it at a local server).
            timeout_s: timeout of each connect / read / write.
            max_retries: retries of a failed query before raising.
            backoff_s: base of the exponential backoff between retries.
            max_concurrency: queries in flight at once.
            max_retry_after_s: cap on an honoured `Retry-After`.

        Raises:
            ValueError: when the variable is not set, or on a non-positive bound.
        """
        _check_bounds("SerpAPISearchEngine", timeout_s, max_retries, max_concurrency)
        self._api_key = _read_key("SerpAPISearchEngine", api_key_env)
        self.api_key_env = api_key_env
        self.base_url = base_url
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_concurrency = max_concurrency
        self.max_retry_after_s = max_retry_after_s
        transport = _QueryKeyTransport(
            self._api_key, proxy=_environment_proxy(base_url), max_connections=max_concurrency
        )
        self._client = httpx.Client(transport=transport)

    def __repr__(self) -> str:
        return f"SerpAPISearchEngine(base_url={self.base_url!r}, api_key_env={self.api_key_env!r})"

    def close(self) -> None:
        """Closes the connection pool."""
        self._client.close()

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        """One SerpAPI query per request, sent concurrently; the first top-k organic results.

        Raises:
            SearchServiceError: when a query fails after the bounded retries, or SerpAPI
                reports an error other than "no results".
        """
        return run_concurrently(self._search_one, requests, self.max_concurrency)

    def _search_one(self, request: SearchRequest) -> list[Document]:
        data = request_json(
            self._client,
            "GET",
            self.base_url,
            params={"engine": "google", "q": request.query, "num": request.top_k},
            retries=self.max_retries,
            backoff_s=self.backoff_s,
            timeout_s=self.timeout_s,
            max_retry_after_s=self.max_retry_after_s,
            error_cls=SearchServiceError,
            secrets=(self._api_key,),
        )
        if "organic_results" not in data and "error" in data:
            # SerpAPI answers HTTP 200 with an "error" both when Google found nothing (an empty
            # result, not a failure) and for account problems (a failure).
            error = str(data["error"])
            if "hasn't returned any results" in error:
                return []
            raise SearchServiceError(
                f"GET {self.base_url} (SerpAPI) reported an error for query "
                f"{request.query!r}: {redact(error, (self._api_key,))}"
            )
        organic = data.get("organic_results", [])
        return _organic_documents(organic, request.top_k, "serpapi", self.base_url, request.query, self._api_key)
