"""The search-engine interface every real retriever and the simulator implement, and shared helpers."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from simsearch.data.corpus import JsonlCorpus, check_fingerprint, corpus_fingerprint
from simsearch.errors import DataError
from simsearch.types import Document, Passage, SearchRequest


class SearchEngine(Protocol):
    """Answers a batch of queries in one call: one list of documents per request, in order."""

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]: ...


def check_top_k(requests: list[SearchRequest], corpus_size: int) -> None:
    """Rejects a `top_k` outside [1, `corpus_size`] with a `ValueError` naming the first such request."""
    for i, request in enumerate(requests):
        if not 1 <= request.top_k <= corpus_size:
            raise ValueError(
                f"request {i} (query {request.query!r}) has top_k={request.top_k}; "
                f"top_k must be between 1 and the corpus size, {corpus_size}"
            )


def select_top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the `k` largest of [N] `scores`, best first, ties to the lower position: [min(k, N)] int64."""
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


def write_index_meta(meta_path: Path, format_version: int, passages: Sequence[Passage], fields: dict[str, Any]) -> None:
    """Writes an index's metadata file: its format version, its corpus's fingerprint (and, for a corpus read from a
    file, that file's `corpus_file` identity: `check_index_corpus` then needs no scan of it), then `fields`."""
    meta: dict[str, Any] = {"format_version": format_version, "corpus": corpus_fingerprint(passages)}
    if isinstance(passages, JsonlCorpus):
        meta["corpus_file"] = _file_identity(passages.path)
    meta_path.write_text(json.dumps({**meta, **fields}, indent=2) + "\n")


def _file_identity(path: Path) -> list[int]:
    """[size, modification time in ns]: a file rewritten in place gets another."""
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def read_index_meta(
    meta_path: Path, format_version: int, corpus_path: str | Path
) -> tuple[dict[str, Any], JsonlCorpus]:
    """(metadata, corpus) of an index: reads `write_index_meta`'s file and opens `corpus_path`.

    Raises:
        DataError: the index was written in another format, or built for another corpus.
    """
    meta = json.loads(meta_path.read_text())
    if meta["format_version"] != format_version:
        raise DataError(
            f"{meta_path}: index format {meta['format_version']}, this version reads {format_version}; "
            "rebuild the index"
        )
    passages = JsonlCorpus(corpus_path)
    check_fingerprint(meta["corpus"], passages, index_dir=meta_path.parent, corpus=str(corpus_path))
    return meta, passages


INDEX_META_GLOB = "simsearch_*.json"
"""The metadata files `write_index_meta` writes (one per index kind: bm25, dense)."""


def check_index_corpus(index_dir: Path, corpus_path: str | Path) -> None:
    """Checks that every index saved in `index_dir` was built from `corpus_path`; nothing saved passes.

    Raises:
        DataError: an index there was built for another corpus (the message says how, and what to do).
    """
    metas = sorted(index_dir.glob(INDEX_META_GLOB)) if index_dir.is_dir() else []
    if not metas or not Path(corpus_path).is_file():
        return
    identity = _file_identity(Path(corpus_path))
    expected = [meta for meta in (json.loads(path.read_text()) for path in metas) if meta.get("corpus") is not None]
    # The very file the index was built from, untouched since: no need to read it (a wiki-sized corpus takes minutes).
    expected = [meta for meta in expected if meta.get("corpus_file") != identity]
    if not expected:
        return
    passages = JsonlCorpus(corpus_path)
    try:
        for meta in expected:
            check_fingerprint(meta["corpus"], passages, index_dir=index_dir, corpus=str(corpus_path))
    finally:
        passages.close()
