"""A persistent SQLite cache in front of any `SearchEngine`.

The key holds everything that can change an answer: the caller's `namespace` (the engine and
its configuration), the query, `top_k` and the simulator fields. In front of the simulator the
cache freezes its sampled answer per key. Several processes may share one file (WAL mode).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

from simsearch.retrieval.base import SearchEngine
from simsearch.types import Document, SearchRequest

_SCHEMA = "CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, namespace TEXT NOT NULL, documents TEXT NOT NULL)"


def cache_key(namespace: str, request: SearchRequest) -> str:
    """The hex SHA-256 key of one request in `namespace` (the engine's identity and configuration)."""
    fields = [
        namespace,
        request.query,
        request.top_k,
        request.question,
        list(request.golden_answers),
        request.num_noisy,
    ]
    # JSON of a list keeps field boundaries unambiguous ("a","bc" vs "ab","c").
    return hashlib.sha256(json.dumps(fields, ensure_ascii=False).encode()).hexdigest()


class CachedSearchEngine:
    """A `SearchEngine` that answers from an SQLite file and asks `engine` only for misses.

    A request is a hit when its key was cached when the batch arrived; repeated keys in a batch are
    searched once.
    """

    def __init__(self, engine: SearchEngine, path: str | Path, *, namespace: str) -> None:
        """Opens (or creates) the cache file; `ValueError` on an empty `namespace`."""
        if not namespace:
            raise ValueError("namespace must name the engine and its configuration (e.g. a hash of its recipe section)")
        self.engine = engine
        self.path = Path(path)
        self.namespace = namespace
        self.hits = 0
        self.misses = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # check_same_thread=False: the server calls from several threads; the lock serialises use.
        # timeout: wait for another process's write instead of failing with "database is locked".
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=60.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # durable across application crashes, fast
        self._db.execute(_SCHEMA)
        self._db.commit()

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        """Answers hits from the cache and all misses with one call to the inner engine."""
        keys = [cache_key(self.namespace, r) for r in requests]
        with self._lock:
            found = self._lookup(keys)
            self.hits += sum(k in found for k in keys)
            self.misses += sum(k not in found for k in keys)
        # First request of each missing key, in order; the inner search runs outside the lock
        # so other threads keep being served from the cache meanwhile.
        missing: dict[str, SearchRequest] = {}
        for key, request in zip(keys, requests, strict=True):
            if key not in found and key not in missing:
                missing[key] = request
        if missing:
            fresh = self.engine.search(list(missing.values()))
            if len(fresh) != len(missing):
                raise RuntimeError(f"the inner engine returned {len(fresh)} result lists for {len(missing)} requests")
            rows = []
            for key, docs in zip(missing, fresh, strict=True):
                found[key] = docs
                rows.append((key, self.namespace, json.dumps([asdict(d) for d in docs], ensure_ascii=False)))
            with self._lock:
                self._db.executemany("INSERT OR REPLACE INTO results VALUES (?, ?, ?)", rows)
                self._db.commit()
        # Copies, so a caller editing a result cannot alter another request's result.
        return [[Document(**asdict(d)) for d in found[key]] for key in keys]

    def _lookup(self, keys: list[str]) -> dict[str, list[Document]]:
        found: dict[str, list[Document]] = {}
        unique = list(dict.fromkeys(keys))
        # SQLite limits the number of bound parameters per statement; 500 is safely below it.
        for start in range(0, len(unique), 500):
            part = unique[start : start + 500]
            marks = ",".join("?" * len(part))
            for key, documents in self._db.execute(f"SELECT key, documents FROM results WHERE key IN ({marks})", part):
                found[key] = [Document(**d) for d in json.loads(documents)]
        return found

    def stats(self) -> dict[str, Any]:
        """Counters since this instance was created: `cache/hits`, `cache/misses`, `cache/hit_rate`."""
        with self._lock:
            total = self.hits + self.misses
            return {
                "cache/hits": self.hits,
                "cache/misses": self.misses,
                "cache/hit_rate": self.hits / total if total else 0.0,
            }

    def close(self) -> None:
        with self._lock:
            self._db.close()
