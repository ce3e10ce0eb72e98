"""A real retriever's results with the answer taken out: the control for "do the answers matter?".

The policy sees what BM25 finds for its query, on topic and ranked as usual, except every passage
that holds a gold answer of the question being trained on; the passages ranked below take their
places. A policy that learns as much against it as against a useful engine learned where to search,
not from the answers it read. It needs the gold answers, so it serves training, not evaluation.
"""

from __future__ import annotations

from dataclasses import replace

from simsearch.eval.metrics import has_gold_answer, substring_exact_match
from simsearch.retrieval.base import SearchEngine
from simsearch.types import Document, SearchRequest


class AnswerlessSearchEngine:
    """`engine`'s results for each request less the documents whose text holds a gold answer.

    A document holds an answer when the normalized answer is a substring of its normalized text
    (the rule reward's containment). `engine` is asked for `top_k + depth` documents (at most
    `limit`, its corpus size), so up to `depth` removed ones are made up from further down its
    ranking; fewer than `top_k` come back when it has no more.
    """

    def __init__(self, engine: SearchEngine, *, depth: int = 10, limit: int | None = None) -> None:
        self.engine = engine
        self.depth = depth
        self.limit = limit

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        """Raises `ValueError` for a request without gold answers (nothing to take out)."""
        for request in requests:
            if not has_gold_answer(request.golden_answers):
                raise ValueError(
                    f"search.kind=answerless needs each question's gold answers; the query {request.query!r} came "
                    "without any (it is a training control, not an engine to evaluate with)"
                )
        deeper = [replace(r, top_k=self._deeper(r.top_k), num_noisy=0) for r in requests]
        found = self.engine.search(deeper)
        return [_without_answers(docs, r) for docs, r in zip(found, requests, strict=True)]

    def _deeper(self, top_k: int) -> int:
        return top_k + self.depth if self.limit is None else min(top_k + self.depth, self.limit)


def _without_answers(documents: list[Document], request: SearchRequest) -> list[Document]:
    kept = [doc for doc in documents if not substring_exact_match(doc.text, request.golden_answers)]
    return kept[: request.top_k]
