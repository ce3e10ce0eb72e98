"""The search-engine interface every real retriever and the simulator implement, and the
helpers they share.

How the documents an engine returns are shown to the policy lives in `data.rendering`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from simsearch.types import Document, SearchRequest


class SearchEngine(Protocol):
    """Answers a batch of queries in one call: one list of documents per request, in order."""

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]: ...


def check_top_k(requests: list[SearchRequest], corpus_size: int) -> None:
    """Rejects a `top_k` a corpus retriever cannot honour.

    A retriever over a fixed corpus cannot return more passages than it holds, and silently
    returning fewer would change what the policy sees without anyone noticing; both are input
    errors (see `SearchRequest`).

    Args:
        requests: the batch.
        corpus_size: number of passages in the index.

    Raises:
        ValueError: naming the first offending request, its query and the allowed range.
    """
    for i, request in enumerate(requests):
        if not 1 <= request.top_k <= corpus_size:
            raise ValueError(
                f"request {i} (query {request.query!r}) has top_k={request.top_k}; "
                f"top_k must be between 1 and the corpus size, {corpus_size}"
            )


def select_top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the `k` largest scores, best first; ties go to the lower position.

    The tie rule makes results reproducible across runs, batch sizes and engines (argpartition
    alone orders ties arbitrarily).

    Args:
        scores: one score per candidate. # [N]
        k: how many to keep; more than N keeps all N.

    Returns:
        int64 positions into `scores`. # [min(k, N)]
    """
    n = scores.shape[0]
    k = min(k, n)
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    if k < n:
        # The k-th largest value; everything strictly above it is in, ties at it are cut by position.
        kth = np.partition(scores, n - k)[n - k]
        candidates = np.flatnonzero(scores >= kth)
    else:
        candidates = np.arange(n)
    # lexsort sorts by the last key first: score descending, then position ascending.
    order = np.lexsort((candidates, -scores[candidates]))
    return candidates[order[:k]].astype(np.int64)
