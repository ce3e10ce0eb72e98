"""A query-blind answer dispenser: the control for "does the simulator teach search, or only show answers?".

Every search returns the passage that answers the question being trained on, plus `top_k - 1`
passages drawn at random, whatever the query. The policy always sees the answer and no query is
ever better than another: a policy that learns as much against it as against a simulator learned to
read, not to search. It needs each request's question and gold answers, so it serves training,
not evaluation.

The answer passage is found from the request alone, without the world's facts: real BM25 asked the
*question* (never the query), the first of its passages that holds a gold answer (the rule reward's
containment). In the tiny world the question names its person, whose passage holding the answer
ranks first among those that hold it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from simsearch.eval.metrics import has_gold_answer, substring_exact_match
from simsearch.retrieval.base import SearchEngine
from simsearch.types import Document, Passage, SearchRequest


class OracleSearchEngine:
    """The question's answer passage and `top_k - 1` random others, at a random rank, for every request.

    Args:
        finder: A retriever over `passages`, asked each request's question for `depth` passages.
        passages: The corpus the random passages are drawn from.
        seed: Seeds the one generator of the random passages and ranks, so a run that makes the same
            calls in the same order gets the same documents.
        depth: How far down `finder`'s ranking of the question to look for a passage holding an answer.
    """

    def __init__(self, finder: SearchEngine, passages: Sequence[Passage], *, seed: int = 0, depth: int = 20) -> None:
        if not passages:
            raise ValueError("OracleSearchEngine needs at least one passage")
        self.finder = finder
        self.passages = passages
        self.depth = min(depth, len(passages))
        self.rng = random.Random(seed)
        self._answers: dict[tuple[str, tuple[str, ...]], Document] = {}  # the finder's pick, per question

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        """Raises `ValueError` for a request without a question or gold answers, or whose answer no passage holds."""
        for request in requests:
            if not request.question or not has_gold_answer(request.golden_answers):
                raise ValueError(
                    f"search.kind=oracle needs each question and its gold answers; the query {request.query!r} came "
                    "without them (it is a training control, not an engine to evaluate with)"
                )
        self._find_answers(requests)
        return [self._results(request) for request in requests]

    def _find_answers(self, requests: list[SearchRequest]) -> None:
        """The answer passage of every question not seen before, in one `finder` call."""
        new = {_key(r): r for r in requests if _key(r) not in self._answers}
        asked = [SearchRequest(query=r.question or "", top_k=self.depth) for r in new.values()]
        for (key, request), found in zip(new.items(), self.finder.search(asked), strict=True):
            holding = [doc for doc in found if substring_exact_match(doc.text, request.golden_answers)]
            if not holding:
                raise ValueError(
                    f"search.kind=oracle: no passage among the top {self.depth} for the question {request.question!r} "
                    f"holds a gold answer {request.golden_answers}"
                )
            self._answers[key] = holding[0]

    def _results(self, request: SearchRequest) -> list[Document]:
        answer = self._answers[_key(request)]
        k = min(request.top_k, len(self.passages))
        others = [i for i in self.rng.sample(range(len(self.passages)), k) if self.passages[i].id != answer.id]
        documents = [_document(self.passages[i]) for i in others[: k - 1]]
        documents.insert(self.rng.randrange(k), _document_of(answer))
        return documents


def _key(request: SearchRequest) -> tuple[str, tuple[str, ...]]:
    return request.question or "", tuple(request.golden_answers)


def _document(passage: Passage) -> Document:
    return Document(title=passage.title, text=passage.text, source="oracle", id=passage.id)


def _document_of(found: Document) -> Document:
    return Document(title=found.title, text=found.text, source="oracle", id=found.id)
