"""Web search through Serper and SerpAPI (Google results): title + snippet documents.

One HTTP request per query, concurrently, with `simsearch.httpclient`'s bounded retries; the
top-k documents are the first k organic results. API keys come only from the environment
variable named in the constructor and never appear in a repr, a log line or an error.
"""

from __future__ import annotations

import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import httpx

from simsearch.httpclient import SearchServiceError, ServerKey, redact, request_json, run_concurrently
from simsearch.types import Document, SearchRequest

SERPER_URL = "https://google.serper.dev/search"
SERPAPI_URL = "https://serpapi.com/search"


def _environment_proxy(url: str) -> str | None:
    """The proxy the standard environment variables (HTTPS_PROXY, NO_PROXY, ...) give `url`."""
    split = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass(split.hostname or ""):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(split.scheme) or proxies.get("all")


class _QueryKeyTransport(httpx.BaseTransport):
    """Adds `api_key=...` to each request's query string below httpx's request logging."""

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


@dataclass(frozen=True)
class _Bounds:
    timeout_s: float
    max_retries: int
    backoff_s: float
    max_concurrency: int
    max_retry_after_s: float


class _WebClient:
    """What both web engines are made of: the API key, the retry bounds and the connection pool.

    `key_in_query` sends the key as an `api_key` query parameter (SerpAPI). Raises `ValueError`
    when the variable is unset or a bound is not positive.
    """

    def __init__(self, engine: str, api_key_env: str, base_url: str, bounds: _Bounds, *, key_in_query: bool) -> None:
        if bounds.timeout_s <= 0 or bounds.max_retries < 0 or bounds.max_concurrency < 1:
            raise ValueError(
                f"{engine} needs timeout_s > 0, max_retries >= 0 and max_concurrency >= 1; got "
                f"{bounds.timeout_s}, {bounds.max_retries}, {bounds.max_concurrency}"
            )
        self.engine = engine
        key = ServerKey.from_env(engine, api_key_env, "API key", required=True).value
        assert key is not None  # required: from_env raised otherwise
        self.api_key = key
        self.api_key_env = api_key_env
        self.base_url = base_url
        self.bounds = bounds
        if key_in_query:
            proxy = _environment_proxy(base_url)
            transport = _QueryKeyTransport(self.api_key, proxy=proxy, max_connections=bounds.max_concurrency)
            self.client = httpx.Client(transport=transport)
        else:
            self.client = httpx.Client(limits=httpx.Limits(max_connections=bounds.max_concurrency))

    def __repr__(self) -> str:
        # Never the API key: only the name of the variable that holds it.
        return f"{self.engine}(base_url={self.base_url!r}, api_key_env={self.api_key_env!r})"

    def request(self, method: str, **body: Any) -> dict[str, Any]:
        return request_json(
            self.client,
            method,
            self.base_url,
            retries=self.bounds.max_retries,
            backoff_s=self.bounds.backoff_s,
            timeout_s=self.bounds.timeout_s,
            max_retry_after_s=self.bounds.max_retry_after_s,
            error_cls=SearchServiceError,
            secrets=(self.api_key,),
            **body,
        )

    def documents(self, organic: Any, request: SearchRequest, source: str) -> list[Document]:
        """The first `request.top_k` organic results, in order, as documents."""
        if not isinstance(organic, list):
            raise SearchServiceError(
                f"{source} at {self.base_url} returned organic results that are not a list for query "
                f"{request.query!r}: {redact(str(organic), (self.api_key,))[:300]}"
            )
        documents = []
        for result in organic[: request.top_k]:
            if not isinstance(result, dict) or not isinstance(result.get("title"), str):
                raise SearchServiceError(
                    f"{source} at {self.base_url} returned an organic result without a title for query "
                    f"{request.query!r}: {redact(str(result), (self.api_key,))[:300]}"
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
        """Creates the client and reads the Serper key from `api_key_env`.

        Args:
            max_retries: Retries of a failed query before raising.
            max_concurrency: Queries in flight at once.
            max_retry_after_s: Cap on an honoured `Retry-After`.

        Raises:
            ValueError: The variable is not set, or a non-positive bound.
        """
        bounds = _Bounds(timeout_s, max_retries, backoff_s, max_concurrency, max_retry_after_s)
        self._web = _WebClient("SerperSearchEngine", api_key_env, base_url, bounds, key_in_query=False)

    def __repr__(self) -> str:
        return repr(self._web)

    def close(self) -> None:
        self._web.client.close()

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        """One Serper query per request, concurrently; raises `SearchServiceError` after the bounded retries."""
        return run_concurrently(self._search_one, requests, self._web.bounds.max_concurrency)

    def _search_one(self, request: SearchRequest) -> list[Document]:
        data = self._web.request(
            "POST",
            json_body={"q": request.query, "num": request.top_k},
            headers={"X-API-KEY": self._web.api_key},
        )
        # No "organic" key: Google had no organic result for the query.
        return self._web.documents(data.get("organic", []), request, "serper")


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
        """Creates the client and reads the SerpAPI key from `api_key_env`; arguments and errors as Serper's."""
        bounds = _Bounds(timeout_s, max_retries, backoff_s, max_concurrency, max_retry_after_s)
        self._web = _WebClient("SerpAPISearchEngine", api_key_env, base_url, bounds, key_in_query=True)

    def __repr__(self) -> str:
        return repr(self._web)

    def close(self) -> None:
        self._web.client.close()

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        """One SerpAPI query per request, concurrently.

        Raises:
            SearchServiceError: a query fails after the bounded retries, or SerpAPI reports an error
                other than "no results".
        """
        return run_concurrently(self._search_one, requests, self._web.bounds.max_concurrency)

    def _search_one(self, request: SearchRequest) -> list[Document]:
        data = self._web.request("GET", params={"engine": "google", "q": request.query, "num": request.top_k})
        if "organic_results" not in data and "error" in data:
            # SerpAPI answers HTTP 200 with an "error" both when Google found nothing (an empty
            # result, not a failure) and for account problems (a failure).
            error = str(data["error"])
            if "hasn't returned any results" in error:
                return []
            raise SearchServiceError(
                f"GET {self._web.base_url} (SerpAPI) reported an error for query "
                f"{request.query!r}: {redact(error, (self._web.api_key,))}"
            )
        return self._web.documents(data.get("organic_results", []), request, "serpapi")
