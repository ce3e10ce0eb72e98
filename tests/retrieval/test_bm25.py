"""BM25 engine: scores against hand-computed values, batching, top_k errors, save/load and the corpus check."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from simsearch.data.corpus import load_passages
from simsearch.retrieval.bm25 import BM25SearchEngine
from simsearch.types import Passage, SearchRequest

WIKI18 = Path(__file__).parents[1] / "data" / "fixtures" / "wiki18_sample.jsonl"

# Indexed text is "title\ntext":
#   p0 "Apple\napple banana"          -> apple apple banana        (length 3)
#   p1 "Cherry\nbanana banana cherry" -> cherry banana banana cherry (length 4)
#   p2 "Date\ndate"                   -> date date                 (length 2)
FRUIT = [
    Passage("p0", "Apple", "apple banana"),
    Passage("p1", "Cherry", "banana banana cherry"),
    Passage("p2", "Date", "date"),
]


def write_corpus(path: Path, passages: list[Passage]) -> Path:
    path.write_text(
        "".join(json.dumps({"id": p.id, "contents": p.contents}) + "\n" for p in passages), encoding="utf-8"
    )
    return path


@pytest.fixture(scope="module")
def fruit() -> BM25SearchEngine:
    return BM25SearchEngine.build(FRUIT, show_progress=False)


def test_scores_match_hand_computed_lucene_bm25(fruit):
    # k1 = 0.9, b = 0.4, N = 3, avgdl = (3 + 4 + 2) / 3 = 3; "banana" has df = 2.
    # idf = ln(1 + (N - df + 0.5) / (df + 0.5)) = ln(1 + 1.5 / 2.5) = ln 1.6
    # p1: tf 2, dl 4: 2 / (2 + 0.9 * (0.6 + 0.4 * 4 / 3)) = 2 / 3.02
    # p0: tf 1, dl 3: 1 / (1 + 0.9 * (0.6 + 0.4 * 3 / 3)) = 1 / 1.9
    # p2 has no "banana": not returned although top_k = 3.
    idf = math.log(1.6)
    [docs] = fruit.search([SearchRequest("banana", top_k=3)])
    assert [d.id for d in docs] == ["p1", "p0"]
    assert docs[0].score == pytest.approx(idf * 2 / 3.02, rel=1e-6)  # 0.311261
    assert docs[1].score == pytest.approx(idf * 1 / 1.9, rel=1e-6)  # 0.247370
    assert docs[0].score == pytest.approx(0.311261, abs=1e-6)


def test_two_term_query_sums_term_scores(fruit):
    # "date cherry": p2 gets date (df 1, tf 2, dl 2), p1 gets cherry (df 1, tf 2, dl 4).
    # idf(df=1) = ln(1 + 2.5 / 1.5) = ln(8/3)
    # p2: 2 / (2 + 0.9 * (0.6 + 0.4 * 2 / 3)) = 2 / 2.78
    # p1: 2 / 3.02, as above
    idf = math.log(8 / 3)
    [docs] = fruit.search([SearchRequest("Date? CHERRY!", top_k=2)])
    assert [d.id for d in docs] == ["p2", "p1"]
    assert [d.score for d in docs] == pytest.approx([idf * 2 / 2.78, idf * 2 / 3.02], rel=1e-6)


def test_documents_carry_passage_fields_and_source():
    engine = BM25SearchEngine.build(load_passages(WIKI18), show_progress=False)
    [docs] = engine.search([SearchRequest("Pavia cathedral architect", top_k=1)])
    assert len(docs) == 1
    doc = docs[0]
    assert (doc.id, doc.title, doc.source) == ("4", '"Pavia Cathedral"', "bm25")
    assert doc.text.startswith("on March 17, 1989. The cathedral was begun in 1488")
    assert doc.score is not None and doc.score > 0


def test_batch_keeps_order_and_each_top_k(fruit):
    requests = [
        SearchRequest("banana", top_k=1),
        SearchRequest("date", top_k=3),
        SearchRequest("banana", top_k=2),
        SearchRequest("apple", top_k=3),
    ]
    results = fruit.search(requests)
    assert [[d.id for d in docs] for docs in results] == [["p1"], ["p2"], ["p1", "p0"], ["p0"]]
    assert fruit.search([]) == []


def test_query_without_known_words_returns_nothing_and_leaves_vocabulary(fruit):
    vocab_size = len(fruit.tokenizer.word_to_id)
    assert fruit.search(
        [SearchRequest("zebra quokka", top_k=2), SearchRequest("", top_k=2), SearchRequest("the of", top_k=2)]
    ) == [[], [], []]
    assert len(fruit.tokenizer.word_to_id) == vocab_size


@pytest.mark.parametrize("top_k", [0, -1, 4])
def test_bad_top_k_is_an_error(fruit, top_k):
    with pytest.raises(
        ValueError, match=f"request 1 \\(query 'x'\\) has top_k={top_k}; top_k must be between 1 and the corpus size, 3"
    ):
        fruit.search([SearchRequest("banana", top_k=1), SearchRequest("x", top_k=top_k)])


def test_empty_corpus_is_an_error():
    with pytest.raises(ValueError, match="empty corpus"):
        BM25SearchEngine.build([], show_progress=False)


@pytest.mark.parametrize("mmap", [True, False])
def test_save_load_round_trip(fruit, tmp_path, mmap):
    corpus = write_corpus(tmp_path / "fruit.jsonl", FRUIT)
    fruit.save(tmp_path / "index")
    loaded = BM25SearchEngine.load(tmp_path / "index", corpus, mmap=mmap)
    requests = [SearchRequest("banana", top_k=3), SearchRequest("date cherry", top_k=2)]
    assert loaded.search(requests) == fruit.search(requests)
    assert (loaded.retriever.k1, loaded.retriever.b) == (0.9, 0.4)


def test_load_with_another_corpus_is_refused(fruit, tmp_path):
    fruit.save(tmp_path / "index")
    shorter = write_corpus(tmp_path / "short.jsonl", FRUIT[:2])
    with pytest.raises(
        ValueError, match=r"built for another corpus than .*short\.jsonl: it was built for 3 passages, .* has 2"
    ):
        BM25SearchEngine.load(tmp_path / "index", shorter)
    edited = write_corpus(tmp_path / "edited.jsonl", [FRUIT[0], FRUIT[1], Passage("p2", "Date", "dates")])
    with pytest.raises(ValueError, match="different passages or order"):
        BM25SearchEngine.load(tmp_path / "index", edited)


def test_load_from_a_directory_without_index(tmp_path):
    corpus = write_corpus(tmp_path / "fruit.jsonl", FRUIT)
    with pytest.raises(FileNotFoundError, match=r"no BM25 index in .*simsearch_bm25.json missing"):
        BM25SearchEngine.load(tmp_path, corpus)


def test_the_corpus_check_reads_no_corpus_file_the_index_was_built_from_untouched(tmp_path, monkeypatch):
    import os

    from simsearch.data.corpus import JsonlCorpus
    from simsearch.retrieval import base

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f"t{i}\nword {i}"}) + "\n" for i in range(5)))
    BM25SearchEngine.build(JsonlCorpus(corpus)).save(tmp_path / "index")
    meta = json.loads((tmp_path / "index" / "simsearch_bm25.json").read_text())
    assert meta["corpus_file"] == [corpus.stat().st_size, corpus.stat().st_mtime_ns]
    opened = []
    monkeypatch.setattr(base, "JsonlCorpus", lambda path: opened.append(path) or JsonlCorpus(path))
    base.check_index_corpus(tmp_path / "index", corpus)
    assert opened == []  # the very file, untouched: no scan
    # The same bytes touched later: scanned, and they still pass; other bytes of the same size are refused.
    os.utime(corpus, ns=(corpus.stat().st_atime_ns, corpus.stat().st_mtime_ns + 10**9))
    base.check_index_corpus(tmp_path / "index", corpus)
    assert opened == [corpus]
    corpus.write_text(corpus.read_text().replace("word 3", "word 8"))
    with pytest.raises(ValueError, match="another corpus"):
        base.check_index_corpus(tmp_path / "index", corpus)
