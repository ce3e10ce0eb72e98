"""A SearchEngine that calls a Search-R1-compatible retrieval server (`POST /retrieve`).

Wire format (**compat**): the request body is `{"queries": [..], "topk": k, "return_scores":
true}` and the answer `{"result": [[{"document": {"id", "contents"}, "score": s}, ..], ..]}`,
one list per query (plain document lists are read too). `contents` is the title line, kept as
stored, then the text; `{"id", "title", "text"}` documents are read as such.

A batch is sent as one POST per distinct top-k (and per `batch_size` queries). When a request
carries simulator context, the POST adds lists aligned with `queries`: `question`,
`golden_answers` and `noisy` (count of noisy documents), which `simsearch serve` hands to a
simulator. Retries are bounded (`simsearch.httpclient`); an optional bearer token comes from
`api_key_env` and appears in no repr or error message.
"""

from __future__ import annotations

from typing import Any

import httpx

from simsearch.httpclient import SearchServiceError, ServerKey, post_json, redact
from simsearch.types import Document, SearchRequest


def _has_simulator_context(request: SearchRequest) -> bool:
    return request.question is not None or bool(request.golden_answers) or request.num_noisy > 0


def parse_document(entry: Any, url: str, secrets: tuple[str, ...] = ()) -> Document:
    """Reads one entry of a `/retrieve` result list (with or without score) into a
    `Document(source="http")`: title = first line of `contents`, text = the rest.

    Raises:
        SearchServiceError: the entry has neither `contents` nor `title` and `text`, or a score
            that is not a number (the message quotes it, `secrets` masked).
    """
    score = None
    document = entry
    if isinstance(entry, dict) and isinstance(entry.get("document"), dict):
        document = entry["document"]
        score = entry.get("score")
    if isinstance(document, dict) and isinstance(document.get("contents"), str):
        title, _, text = document["contents"].partition("\n")
    elif isinstance(document, dict) and isinstance(document.get("title"), str):
        title, text = document["title"], str(document.get("text", ""))
    else:
        raise SearchServiceError(
            f"POST {url} returned a document without 'contents' (or 'title'/'text'): "
            f"{redact(str(entry), secrets)[:300]}. Is it a Search-R1-compatible /retrieve server?"
        )
    try:
        score = None if score is None else float(score)
    except (TypeError, ValueError):
        raise SearchServiceError(
            f"POST {url} returned a score that is not a number: {redact(str(entry), secrets)[:300]}"
        ) from None
    doc_id = document.get("id")
    return Document(
        title=title,
        text=text,
        score=score,
        source="http",
        id=None if doc_id is None else str(doc_id),
    )


class HTTPSearchEngine:
    """Client of a Search-R1-compatible `POST /retrieve` server."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        batch_size: int = 256,
        api_key_env: str | None = None,
    ) -> None:
        """Creates the client; nothing is sent until `search`.

        Args:
            url: The endpoint itself, e.g. `http://127.0.0.1:8000/retrieve`.
            timeout_s: Timeout of each connect / read / write.
            max_retries: Retries of a failed POST before raising.
            backoff_s: Base of the exponential backoff between retries.
            batch_size: Most queries in one POST.
            api_key_env: Environment variable holding the server's bearer token; None for none.

        Raises:
            ValueError: A URL without http(s) scheme, a non-positive bound, or an unset `api_key_env`.
        """
        if not url.startswith(("http://", "https://")):
            raise ValueError(
                f"HTTPSearchEngine url {url!r} must start with http:// or https://, "
                f"e.g. 'http://127.0.0.1:8000/retrieve'"
            )
        if batch_size < 1 or max_retries < 0 or timeout_s <= 0:
            raise ValueError(
                f"HTTPSearchEngine needs batch_size >= 1, max_retries >= 0 and timeout_s > 0; "
                f"got {batch_size}, {max_retries}, {timeout_s}"
            )
        self._key = ServerKey.from_env("HTTPSearchEngine", api_key_env, "bearer token")
        self.url = url
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.batch_size = batch_size
        self.api_key_env = api_key_env
        self._client = httpx.Client()

    def __repr__(self) -> str:
        # Never the token: only the name of the variable that holds it.
        return f"HTTPSearchEngine(url={self.url!r}, api_key_env={self.api_key_env!r})"

    def close(self) -> None:
        """Closes the connection pool."""
        self._client.close()

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        """Retrieves `top_k` documents per request, in request order.

        Raises:
            SearchServiceError: the server fails after the bounded retries or answers something that
                is not a `/retrieve` result.
        """
        results: list[list[Document]] = [[] for _ in requests]
        groups: dict[int, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(request.top_k, []).append(i)
        for top_k, indices in groups.items():
            for start in range(0, len(indices), self.batch_size):
                batch = indices[start : start + self.batch_size]
                documents = self._post([requests[i] for i in batch], top_k)
                for i, docs in zip(batch, documents):
                    results[i] = docs
        return results

    def _post(self, requests: list[SearchRequest], top_k: int) -> list[list[Document]]:
        payload: dict[str, Any] = {
            "queries": [r.query for r in requests],
            "topk": top_k,
            "return_scores": True,
        }
        if any(_has_simulator_context(r) for r in requests):
            payload["question"] = [r.question for r in requests]
            payload["golden_answers"] = [list(r.golden_answers) for r in requests]
            payload["noisy"] = [r.num_noisy for r in requests]
        data = post_json(
            self._client,
            self.url,
            payload,
            retries=self.max_retries,
            backoff_s=self.backoff_s,
            timeout_s=self.timeout_s,
            headers=self._key.headers,
            error_cls=SearchServiceError,
            secrets=self._key.secrets,
        )
        result = data.get("result")
        if not isinstance(result, list) or len(result) != len(requests):
            got = len(result) if isinstance(result, list) else type(result).__name__
            raise SearchServiceError(
                f"POST {self.url} answered {len(requests)} queries with {got} result lists "
                f"(expected a 'result' list with one entry per query): {self._quote(data)}"
            )
        documents = []
        for entries in result:
            if not isinstance(entries, list):
                raise SearchServiceError(
                    f"POST {self.url} returned a result that is not a list: {self._quote(entries)}"
                )
            # A server that returns more than asked is cut to top_k, so k means k everywhere.
            documents.append([parse_document(e, self.url, self._key.secrets) for e in entries[:top_k]])
        return documents

    def _quote(self, value: Any) -> str:
        # Errors quote the response, which may echo the token: masked, then cut.
        return redact(str(value), self._key.secrets)[:300]
