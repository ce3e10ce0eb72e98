"""Dense engine: exact top-k against hand values, the bundled MiniLM offline, prefixes, save/load, faiss."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from simsearch.data.corpus import load_passages
from simsearch.retrieval import dense
from simsearch.retrieval.dense import EMBEDDINGS_FILE, DenseSearchEngine, exact_top_k, load_encoder
from simsearch.types import Passage, SearchRequest

WIKI18 = Path(__file__).parents[1] / "data" / "fixtures" / "wiki18_sample.jsonl"


def test_exact_top_k_hand_computed_across_chunks():
    embeddings = np.array([[1, 0], [0, 1], [0.6, 0.8], [0.8, 0.6], [1, 0]], dtype=np.float32)
    queries = np.array([[1, 0], [0, 1]], dtype=np.float32)
    # Query [1, 0] scores the rows 1, 0, .6, .8, 1: best are rows 0 and 4 (tie at 1, lower row first), then row 3.
    # Query [0, 1] scores 0, 1, .8, .6, 0: rows 1, 2, 3.
    for chunk_rows in (1, 2, 3, 5, 100):
        indices, scores = exact_top_k(embeddings, queries, k=3, chunk_rows=chunk_rows)
        assert indices.tolist() == [[0, 4, 3], [1, 2, 3]], chunk_rows
        np.testing.assert_allclose(scores, [[1, 1, 0.8], [1, 0.8, 0.6]], atol=1e-7)


def test_exact_top_k_matches_brute_force():
    rng = np.random.default_rng(0)
    embeddings = rng.standard_normal((1000, 16)).astype(np.float32)
    queries = rng.standard_normal((7, 16)).astype(np.float32)
    indices, scores = exact_top_k(embeddings, queries, k=10, chunk_rows=97)
    full = queries @ embeddings.T
    np.testing.assert_array_equal(indices, np.argsort(-full, axis=1)[:, :10])
    np.testing.assert_allclose(scores, np.take_along_axis(full, indices, axis=1), rtol=1e-6)


@pytest.fixture(scope="module")
def passages() -> list[Passage]:
    return load_passages(WIKI18)


@pytest.fixture(scope="module")
def engine(passages, tmp_path_factory) -> DenseSearchEngine:
    # The bundled all-MiniLM-L6-v2, loaded from the installed package with local_files_only.
    return DenseSearchEngine.build(
        passages, tmp_path_factory.mktemp("dense"), batch_size=2, device="cpu", show_progress=False
    )


def test_paraphrased_queries_find_their_passage(engine):
    requests = [
        SearchRequest("Which Italian church was started in the late fifteenth century?", top_k=1),
        SearchRequest("Atari's unsuccessful movie tie-in cartridge", top_k=1),
        SearchRequest("healthcare industry lobbyist who died in 2015", top_k=3),
    ]
    results = engine.search(requests)
    assert [docs[0].id for docs in results] == ["4", "7", "0"]
    assert [len(docs) for docs in results] == [1, 1, 3]
    third = results[2]
    assert [d.source for d in third] == ["dense"] * 3
    assert third[0].title == '"Evan Morris"'
    scores = [d.score for d in third]
    assert scores == sorted(scores, reverse=True)
    assert all(-1.0 <= s <= 1.0 for s in scores)  # cosine similarities of unit vectors


def test_embeddings_are_a_normalised_float32_npy(engine):
    index_dir = Path(engine.embeddings.filename).parent
    on_disk = np.load(index_dir / EMBEDDINGS_FILE)
    assert on_disk.dtype == np.float32 and on_disk.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(on_disk, axis=1), 1.0, atol=1e-5)


def test_bad_top_k_is_an_error(engine):
    for top_k in (0, 4):
        with pytest.raises(ValueError, match=f"has top_k={top_k}; top_k must be between 1 and the corpus size, 3"):
            engine.search([SearchRequest("x", top_k=top_k)])


@pytest.fixture
def reuse_encoder(engine, monkeypatch):
    """Later builds and loads reuse the module's encoder: loading MiniLM again costs seconds."""
    monkeypatch.setattr(dense, "load_encoder", lambda model, device=None: engine.encoder)


def test_prefixes_are_applied_and_stored(engine, tmp_path, reuse_encoder):
    short = [Passage("a", "Oslo", "Capital of Norway."), Passage("b", "Lima", "Capital of Peru.")]
    prefixed = DenseSearchEngine.build(
        short, tmp_path, query_prefix="query: ", passage_prefix="passage: ", device="cpu", show_progress=False
    )
    encoder = engine.encoder
    contents = [p.contents for p in short]
    np.testing.assert_allclose(prefixed.embeddings, encoder.encode(["passage: " + c for c in contents]), atol=1e-5)
    # And not the unprefixed vectors, which a forgotten prefix would give.
    assert not np.allclose(prefixed.embeddings, encoder.encode(contents), atol=1e-3)
    np.testing.assert_allclose(prefixed.encode_queries(["hello"]), encoder.encode(["query: hello"]), atol=1e-5)
    meta = json.loads((tmp_path / "simsearch_dense.json").read_text())
    assert (meta["query_prefix"], meta["passage_prefix"], meta["dim"]) == ("query: ", "passage: ", 384)


def test_save_load_round_trip_and_corpus_check(passages, engine, tmp_path, reuse_encoder):
    index_dir = Path(engine.embeddings.filename).parent
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": p.id, "contents": p.contents}) + "\n" for p in passages), encoding="utf-8"
    )
    loaded = DenseSearchEngine.load(index_dir, corpus, device="cpu")
    requests = [SearchRequest("cathedral dome", top_k=2), SearchRequest("video game", top_k=3)]
    expected, got = engine.search(requests), loaded.search(requests)
    assert [[d.id for d in docs] for docs in got] == [[d.id for d in docs] for docs in expected]
    assert [d.score for docs in got for d in docs] == pytest.approx(
        [d.score for docs in expected for d in docs], abs=1e-6
    )

    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "x", "title": "T", "text": "t"}) + "\n")
    with pytest.raises(ValueError, match=r"built for another corpus than .*other.jsonl: it was built for 3 passages"):
        DenseSearchEngine.load(index_dir, other)


def test_in_memory_build_then_save_and_copy(passages, engine, tmp_path, reuse_encoder):
    in_memory = DenseSearchEngine.build(passages, device="cpu", show_progress=False)
    assert not isinstance(in_memory.embeddings, np.memmap)
    np.testing.assert_allclose(in_memory.embeddings, engine.embeddings, atol=1e-5)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": p.id, "contents": p.contents}) + "\n" for p in passages), encoding="utf-8"
    )
    in_memory.save(tmp_path / "saved")
    loaded = DenseSearchEngine.load(tmp_path / "saved", corpus)
    assert isinstance(loaded.embeddings, np.memmap)
    np.testing.assert_array_equal(loaded.embeddings, in_memory.embeddings)
    meta = json.loads((tmp_path / "saved" / "simsearch_dense.json").read_text())
    assert meta["model"] == dense.DEFAULT_MODEL
    # Saving a memory-mapped index elsewhere copies it; saving it onto itself leaves it intact.
    loaded.save(tmp_path / "copy")
    np.testing.assert_array_equal(np.load(tmp_path / "copy" / EMBEDDINGS_FILE), in_memory.embeddings)
    loaded.save(tmp_path / "saved")
    np.testing.assert_array_equal(np.load(tmp_path / "saved" / EMBEDDINGS_FILE), in_memory.embeddings)


def test_load_refuses_an_unfinished_index(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "x", "title": "T", "text": "t"}) + "\n")
    (tmp_path / (EMBEDDINGS_FILE + ".partial")).write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="no finished dense index"):
        DenseSearchEngine.load(tmp_path, corpus)


def test_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(OSError, match=r"could not load the sentence-transformers model .* from local files"):
        load_encoder(str(tmp_path / "no-such-model"))


def test_faiss_finds_what_the_numpy_search_finds(engine):
    # faiss-cpu comes with the dev extra, so this runs in CI rather than only testing the install hint.
    with_faiss = DenseSearchEngine(engine.encoder, engine.embeddings, engine.passages, use_faiss=True)
    requests = [SearchRequest("cathedral", top_k=3), SearchRequest("river", top_k=2)]
    for by_faiss, by_numpy in zip(with_faiss.search(requests), engine.search(requests), strict=True):
        assert [d.id for d in by_faiss] == [d.id for d in by_numpy]
        assert [d.score for d in by_faiss] == pytest.approx([d.score for d in by_numpy], abs=1e-5)


def test_faiss_missing_asks_for_its_install(engine, monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)  # `import faiss` raises ImportError
    with pytest.raises(ImportError, match="pip install faiss-cpu"):
        DenseSearchEngine(engine.encoder, engine.embeddings, engine.passages, use_faiss=True)
