r"""BM25 over a local corpus with bm25s: the sparse real retriever.

bm25s tokenization (lowercase, `\w\w+` words, English stopwords, no stemming), k1 = 0.9,
b = 0.4 by default. Only passages sharing a term with the query are returned, so a list can be
shorter than `top_k`; ties go by corpus position.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import bm25s
import numpy as np

from simsearch.retrieval.base import check_top_k, read_index_meta, select_top_k, write_index_meta
from simsearch.types import Document, Passage, SearchRequest

# Written next to bm25s's own files; its presence marks a directory as one of our indexes.
META_FILE = "simsearch_bm25.json"
FORMAT_VERSION = 1


class BM25SearchEngine:
    """A `SearchEngine` scoring a fixed corpus with BM25; make one with `build` (then `save`) or `load`."""

    def __init__(
        self,
        retriever: bm25s.BM25,
        tokenizer: bm25s.tokenization.Tokenizer,
        passages: Sequence[Passage],
        *,
        stopwords: str,
    ) -> None:
        """Wraps a bm25s index over `passages` (same order) and its tokenizer; prefer `build` or `load`."""
        self.retriever = retriever
        self.tokenizer = tokenizer
        self.passages = passages
        self.stopwords = stopwords

    @classmethod
    def build(
        cls,
        passages: Sequence[Passage],
        *,
        k1: float = 0.9,
        b: float = 0.4,
        stopwords: str = "en",
        show_progress: bool = True,
    ) -> BM25SearchEngine:
        """Indexes `passages` (iterated once) with BM25 parameters `k1` and `b`; `stopwords` "en" or "".

        Raises:
            ValueError: empty corpus.
        """
        if len(passages) == 0:
            raise ValueError("cannot build a BM25 index over an empty corpus")
        tokenizer = bm25s.tokenization.Tokenizer(stopwords=stopwords or None)
        tokens = tokenizer.tokenize(
            (p.contents for p in passages),
            length=len(passages),
            update_vocab=True,
            return_as="tuple",
            show_progress=show_progress,
        )
        retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
        retriever.index(tokens, show_progress=show_progress)
        return cls(retriever, tokenizer, passages, stopwords=stopwords)

    def save(self, index_dir: str | Path) -> None:
        """Writes the index, the tokenizer and the corpus fingerprint (not the passages) to `index_dir`."""
        index_dir = Path(index_dir)
        self.retriever.save(index_dir, show_progress=False)
        self.tokenizer.save_vocab(index_dir)
        fields = {"stopwords": self.stopwords, "k1": self.retriever.k1, "b": self.retriever.b}
        write_index_meta(index_dir / META_FILE, FORMAT_VERSION, self.passages, fields)

    @classmethod
    def load(cls, index_dir: str | Path, corpus_path: str | Path, *, mmap: bool = True) -> BM25SearchEngine:
        """Reopens an index saved by `save` over its corpus file; `mmap` memory-maps the score matrix.

        Raises:
            FileNotFoundError: `index_dir` holds no simsearch BM25 index.
            ValueError: the index was built for another corpus, or by another format version.
        """
        index_dir = Path(index_dir)
        meta_path = index_dir / META_FILE
        if not meta_path.is_file():
            raise FileNotFoundError(
                f"no BM25 index in {index_dir} ({META_FILE} missing); "
                "build one with BM25SearchEngine.build(...).save(dir)"
            )
        meta, passages = read_index_meta(meta_path, FORMAT_VERSION, corpus_path)
        retriever = bm25s.BM25.load(index_dir, mmap=mmap, show_progress=False)
        tokenizer = bm25s.tokenization.Tokenizer(stopwords=meta["stopwords"] or None)
        tokenizer.load_vocab(index_dir)
        return cls(retriever, tokenizer, passages, stopwords=meta["stopwords"])

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        """Each request's best passages; `ValueError` unless 1 <= top_k <= corpus size."""
        check_top_k(requests, len(self.passages))
        # One tokenizer pass for the batch. update_vocab=False drops unknown words instead of
        # growing the vocabulary; allow_empty=False keeps a query without known words empty
        # rather than matching the index's "" token (which passages without words carry).
        token_ids = self.tokenizer.tokenize(
            [r.query for r in requests], update_vocab=False, allow_empty=False, return_as="ids", show_progress=False
        )
        # Queries are scored one by one: bm25s's scatter-add holds the GIL, so threads did not
        # help, and a server already calls search from several threads.
        return [self._search_one(ids, r.top_k) for ids, r in zip(token_ids, requests, strict=True)]

    def _search_one(self, token_ids: list[int], top_k: int) -> list[Document]:
        if not token_ids:
            return []
        scores = self.retriever.get_scores_from_ids(token_ids)  # [num_passages]
        # Zero means no query term occurs in the passage (Lucene idf is always positive); ranking
        # only the matching passages is also what makes top-k cheap for specific queries.
        matching = np.flatnonzero(scores > 0)
        best = matching[select_top_k(scores[matching], top_k)]
        docs = []
        for index, score in zip(best.tolist(), scores[best].tolist(), strict=True):
            passage = self.passages[index]
            docs.append(Document(title=passage.title, text=passage.text, score=score, source="bm25", id=passage.id))
        return docs
