r"""BM25 over a local corpus with bm25s: the sparse real retriever.

Tokenization is bm25s's (lowercase, `\w\w+` words, English stopwords, no stemming); defaults
k1 = 0.9, b = 0.4. Only passages sharing a term with the query are returned, so a result list
can be shorter than `top_k`. Ties are broken by corpus position. Building streams the passages;
search reads titles and texts back from the corpus for the returned passages only;
`load(..., mmap=True)` memory-maps the score matrix.
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
    """A `SearchEngine` scoring a fixed corpus with BM25 (bm25s).

    Build with `BM25SearchEngine.build(passages)` (then `save(dir)`), or reopen a saved index with
    `BM25SearchEngine.load(dir, corpus_path)`.
    """

    def __init__(
        self,
        retriever: bm25s.BM25,
        tokenizer: bm25s.tokenization.Tokenizer,
        passages: Sequence[Passage],
        *,
        stopwords: str,
    ) -> None:
        """Wraps an indexed bm25s retriever; prefer `build` or `load`.

        Args:
            retriever: a bm25s index over `passages`, in the same order.
            tokenizer: the tokenizer whose vocabulary the index uses.
            passages: the corpus (a list, or a `JsonlCorpus` read on demand).
            stopwords: the tokenizer's stopword setting, saved with the index.
        """
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
        """Indexes `passages` (iterated once; title line and text), ready to search.

        Args:
            passages: the corpus.
            k1: BM25 term-frequency saturation.
            b: BM25 length normalisation.
            stopwords: "en" for bm25s's English list, "" for none.
            show_progress: tqdm progress bars.

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
        """Writes the index, the tokenizer and the corpus fingerprint to `index_dir`.

        The passages themselves are not copied: `load` takes the corpus file.
        """
        index_dir = Path(index_dir)
        self.retriever.save(index_dir, show_progress=False)
        self.tokenizer.save_vocab(index_dir)
        fields = {"stopwords": self.stopwords, "k1": self.retriever.k1, "b": self.retriever.b}
        write_index_meta(index_dir / META_FILE, FORMAT_VERSION, self.passages, fields)

    @classmethod
    def load(cls, index_dir: str | Path, corpus_path: str | Path, *, mmap: bool = True) -> BM25SearchEngine:
        """Reopens an index saved by `save`, over the corpus file it was built from.

        Args:
            index_dir: the directory given to `save`.
            corpus_path: the JSONL corpus the index was built from.
            mmap: memory-map the score matrix instead of reading it into memory.

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
        """Each request's best passages (simulator fields ignored).

        Raises:
            ValueError: a `top_k` below 1 or above the corpus size.
        """
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
