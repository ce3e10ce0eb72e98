"""Shared by the tiny-world tests: a small world (24 entities), real BM25 over it, a byte-level BPE trained
in-process, and traces made on them."""

from __future__ import annotations

import pytest

from simsearch.models import train_tokenizer
from simsearch.retrieval.bm25 import BM25SearchEngine
from simsearch.tinyworld.traces import make_traces
from simsearch.tinyworld.world import build_world


@pytest.fixture(scope="module")
def world():
    return build_world(seed=3, n_entities=24, n_train_entities=16, n_cities=6)


@pytest.fixture(scope="module")
def tokenizer(world):
    return train_tokenizer(world.texts_for_tokenizer(300), vocab_size=600)


@pytest.fixture(scope="module")
def engine(world):
    return BM25SearchEngine.build(world.passages, show_progress=False)


@pytest.fixture(scope="module")
def traces(world, engine, tokenizer):
    return make_traces(world, engine, tokenizer, n=1200, seed=7)
