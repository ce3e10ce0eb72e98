"""A search engine that ignores the query: `top_k` corpus passages drawn at random.

The control for "does the simulator teach anything a random set of on-world documents does
not?": the policy sees results of the right form and vocabulary, from the same corpus as the
real engines, but no query finds anything in particular.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from simsearch.types import Document, Passage, SearchRequest


class RandomDocumentsEngine:
    """Returns `top_k` distinct passages of `passages` drawn uniformly, whatever the query.

    Draws come from one generator seeded with `seed`, so a run that makes the same calls in the
    same order gets the same documents.
    """

    def __init__(self, passages: Sequence[Passage], *, seed: int = 0) -> None:
        if not passages:
            raise ValueError("RandomDocumentsEngine needs at least one passage")
        self.passages = passages
        self.rng = random.Random(seed)

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        """One draw of `min(top_k, corpus size)` passages per request."""
        out = []
        for request in requests:
            picks = self.rng.sample(range(len(self.passages)), min(request.top_k, len(self.passages)))
            out.append([self._document(self.passages[i]) for i in picks])
        return out

    @staticmethod
    def _document(passage: Passage) -> Document:
        return Document(title=passage.title, text=passage.text, source="random", id=passage.id)
