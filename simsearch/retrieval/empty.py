"""A search engine that finds nothing: the "RL without search" baseline.

The policy keeps its tag format and may still search, but every `<information>` block is empty,
so whatever it learns or answers comes from memory: Search-R1's "R1" (RL without a search engine),
trained and evaluated with no search. Search-R1's R1 prompt has no search tool at all; this keeps
the prompt the policy knows and takes away what a search returns.
"""

from __future__ import annotations

from simsearch.types import Document, SearchRequest


class EmptySearchEngine:
    """Returns no documents for every request."""

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        return [[] for _ in requests]
