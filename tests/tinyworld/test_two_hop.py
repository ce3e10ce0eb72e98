"""Two-hop questions in the tiny world and two-search pretraining traces; both off by default, leaving
the default world and traces byte for byte as they were (the quickstart's fingerprints rest on them)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from simsearch.config import QuickstartRecipe, TrainRecipe, load_recipe
from simsearch.data.rendering import render_documents, wrap_information
from simsearch.data.templates import render_prompt
from simsearch.experiments import pipeline
from simsearch.models import build_tiny_model, train_tokenizer
from simsearch.retrieval.bm25 import BM25SearchEngine
from simsearch.tinyworld.diagnostics import reading_accuracy
from simsearch.tinyworld.traces import copy_mask, make_traces
from simsearch.tinyworld.values import value_spans
from simsearch.tinyworld.world import TWO_HOP, TWO_HOP_QUESTIONS, World, build_world
from simsearch.types import Document, SearchRequest

# Digests computed with the code before two-hop questions existed (commit c6f2e55).
QUICKSTART_WORLD_FILES = "502b740b97433713e15847aa89b1a0db7b2f6fc2b88ca657e8f8b4b2e9ec4299"
QUICKSTART_TOKENIZER_TEXTS = "9f321ac5127b1f89ffe982765b22bcb125c4389ea217747b19f367948da11c65"
SMALL_WORLD_FILES = "d4ddb3ffc0f6d8b46c53a89d6f8651ca632e0075ad3397c8ebd4670b0221fccf"
SMALL_TRACE_CONTENT = "6b4c1711881114ba66af17b0a3c53b3990af59f8d12825b456f2d1287a78387d"


def _files_digest(world: World, directory: Path) -> str:
    paths = world.write(directory)
    digest = hashlib.sha256()
    for name in sorted(paths):
        digest.update(name.encode())
        digest.update(paths[name].read_bytes())
    return digest.hexdigest()


def _small(**kwargs) -> World:
    return build_world(seed=3, n_entities=24, n_train_entities=16, n_cities=6, n_background_entities=8, **kwargs)


def _trace_content(traces) -> str:
    # Tokenizer-free: every random draw of a trace (question, kind, query, documents, answer, candidates).
    content = [
        (t.example.id, t.query_kind, t.query, [d.id for d in t.documents], t.answer, t.candidates) for t in traces
    ]
    return hashlib.sha256(json.dumps(content).encode()).hexdigest()


@pytest.fixture(scope="module")
def small() -> World:
    return _small()


@pytest.fixture(scope="module")
def two_hop() -> World:
    return _small(two_hop_share=0.5)


@pytest.fixture(scope="module")
def tokenizer(two_hop: World):
    return train_tokenizer(two_hop.texts_for_tokenizer(300), vocab_size=600)


def test_default_worlds_are_byte_identical_to_before(tmp_path: Path, small: World) -> None:
    quickstart = build_world(seed=0, n_background_entities=900)  # the quickstart's world
    assert _files_digest(quickstart, tmp_path / "qs") == QUICKSTART_WORLD_FILES
    texts = hashlib.sha256("\n".join(quickstart.texts_for_tokenizer(300)).encode()).hexdigest()
    assert texts == QUICKSTART_TOKENIZER_TEXTS
    assert _files_digest(small, tmp_path / "small") == SMALL_WORLD_FILES
    assert _files_digest(_small(two_hop_share=0.0), tmp_path / "zero") == SMALL_WORLD_FILES


def test_default_traces_are_the_same_as_before(small: World) -> None:
    tokenizer = train_tokenizer(small.texts_for_tokenizer(300), vocab_size=600)
    engine = BM25SearchEngine.build(small.passages, show_progress=False)
    settings = dict(n=200, seed=7, typed_answer_share=0.5, rendering="brief", template="search-r1-brief")
    assert _trace_content(make_traces(small, engine, tokenizer, **settings)) == SMALL_TRACE_CONTENT
    traces = make_traces(small, engine, tokenizer, two_search_share=0.0, **settings)
    assert _trace_content(traces) == SMALL_TRACE_CONTENT
    assert all(t.second_query == "" and t.second_documents == [] for t in traces)


def test_two_hop_questions_follow_the_one_hop_ones_of_the_same_world(small: World, two_hop: World) -> None:
    # Share 0.5 of 16 train, 8 test and 8 background people: 8, 4 and 4 two-hop questions.
    assert [len(two_hop.train), len(two_hop.test), len(two_hop.background)] == [48 + 8, 24 + 4, 24 + 4]
    assert two_hop.train[:48] == small.train and two_hop.test[:24] == small.test
    assert two_hop.background[:24] == small.background
    assert [q.id for q in two_hop.train[48:]] == [f"train_{i}" for i in range(48, 56)]
    changed = [(a, b) for a, b in zip(small.passages, two_hop.passages) if a != b]
    assert len(changed) == 16  # only the founding passages of the people with a named venture
    assert all(a.id == b.id and a.title == b.title for a, b in changed)


def test_a_two_hop_answer_needs_the_venture_then_the_founder(two_hop: World) -> None:
    passages = {p.id: p for p in two_hop.passages}
    people = {e.name for e in two_hop.entities}
    two_hop_questions = [q for q in two_hop.train + two_hop.test if two_hop.facts[q.id].relation == TWO_HOP]
    assert len(two_hop_questions) == 12
    for question in two_hop_questions:
        fact = two_hop.facts[question.id]
        entity = next(e for e in two_hop.entities if e.name == fact.entity)
        assert fact.named == fact.bridge == entity.brand and fact.bridge not in people
        assert fact.answer == entity.birth_city and question.golden_answers == [entity.birth_city]
        assert fact.entity not in question.question and f"the {entity.brand} {entity.venture}" in question.question
        assert any(question.question == t.format(brand=entity.brand, venture=entity.venture) for t in TWO_HOP_QUESTIONS)
        # The venture's name is in its founding passage only; that passage names the founder, not the city.
        holding = [p.id for p in two_hop.passages if entity.brand in p.text]
        assert holding == [fact.bridge_passage_id]
        assert fact.entity in passages[fact.bridge_passage_id].text
        assert entity.birth_city not in passages[fact.bridge_passage_id].text
        assert entity.birth_city in passages[fact.passage_id].text and fact.entity in passages[fact.passage_id].text


def test_bm25_finds_the_bridge_by_the_venture_and_the_answer_by_the_founder(two_hop: World) -> None:
    engine = BM25SearchEngine.build(two_hop.passages, show_progress=False)
    facts = [two_hop.facts[q.id] for q in two_hop.train if two_hop.facts[q.id].relation == TWO_HOP]
    by_venture = engine.search([SearchRequest(query=f.bridge, top_k=3) for f in facts])
    by_founder = engine.search([SearchRequest(query=f.entity, top_k=3) for f in facts])
    for fact, venture_docs, founder_docs in zip(facts, by_venture, by_founder):
        assert [d.id for d in venture_docs] == [fact.bridge_passage_id]  # the only passage naming it
        assert fact.passage_id in [d.id for d in founder_docs]


def test_two_hop_share_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match=r"two_hop_share=1\.5"):
        build_world(seed=0, n_entities=6, n_train_entities=4, two_hop_share=1.5)


def test_tokenizer_texts_of_a_two_hop_world_add_two_hop_texts(small: World, two_hop: World) -> None:
    plain, extra = small.texts_for_tokenizer(40), two_hop.texts_for_tokenizer(40)
    assert len(extra) == 40 + 10 and extra[:40] == plain  # a quarter more, after the usual ones
    assert all("founder" in t.splitlines()[0] or "founded" in t.splitlines()[0] for t in extra[40:])
    assert not any(e.name in "\n".join(extra[40:]) for e in two_hop.entities)


class _TwoStepEngine:
    """Returns the founding passage for the venture's name, the biography for anything else."""

    def __init__(self, bridge: Document, bio: Document, venture: str) -> None:
        self.bridge, self.bio, self.venture = bridge, bio, venture
        self.calls: list[list[SearchRequest]] = []

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        self.calls.append(requests)
        return [[self.bridge] if r.query == self.venture else [self.bio] for r in requests]


def test_a_two_search_trace_is_prompt_search_information_search_information_answer(two_hop: World, tokenizer) -> None:
    example = next(q for q in two_hop.train if two_hop.facts[q.id].relation == TWO_HOP)
    fact = two_hop.facts[example.id]
    passages = {p.id: p for p in two_hop.passages}
    bridge, bio = passages[fact.bridge_passage_id], passages[fact.passage_id]
    docs = [Document(title=p.title, text=p.text) for p in (bridge, bio)]
    engine = _TwoStepEngine(docs[0], docs[1], fact.bridge)
    (trace,) = make_traces(
        two_hop, engine, tokenizer, n=1, seed=0, top_k=1, query_mix=(1.0, 0.0, 0.0), examples=[example],
        rendering="brief", two_search_share=1.0,
    )  # fmt: skip
    # Name queries both times: the venture's name, then the only person the founding passage names.
    assert engine.calls == [[SearchRequest(query=fact.bridge, top_k=1)], [SearchRequest(query=fact.entity, top_k=1)]]
    assert (trace.query_kind, trace.query, trace.second_query_kind, trace.second_query) == (
        "name",
        fact.bridge,
        "name",
        fact.entity,
    )
    assert trace.documents == [docs[0]] and trace.second_documents == [docs[1]]
    assert trace.candidates == value_spans(docs[0].text, two_hop.cities) + value_spans(docs[1].text, two_hop.cities)
    assert trace.answer in trace.candidates

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    prompt = tokenizer.encode(render_prompt(example.question, template="search-r1"))
    search1, search2 = encode(f"<search> {fact.bridge} </search>"), encode(f"<search> {fact.entity} </search>")
    info1, info2 = (encode(wrap_information(render_documents([d], "brief"))) for d in docs)
    answer = encode(f"<answer> {trace.answer} </answer>")
    assert trace.input_ids == prompt + search1 + info1 + search2 + info2 + answer
    assert trace.loss_mask == (
        [0] * len(prompt) + [1] * len(search1) + [0] * len(info1) + [1] * len(search2) + [0] * len(info2)
        + [1] * len(answer)
    )  # fmt: skip
    start1 = len(prompt) + len(search1)
    start2 = start1 + len(info1) + len(search2)
    spans = [(start1, start1 + len(info1)), (start2, start2 + len(info2))]
    expected = [max(a, b) for a, b in zip(*(copy_mask(trace.input_ids, s, e) for s, e in spans))]
    assert trace.copy_mask == expected
    outside = [i for i in range(len(trace.input_ids)) if not any(s <= i < e for s, e in spans)]
    assert sum(trace.copy_mask[i] for i in outside) == 0
    assert sum(trace.copy_mask[spans[1][0] : spans[1][1]]) > 0  # the founder's name repeats from the first results


def test_two_search_traces_take_their_share_and_random_second_queries(two_hop: World, tokenizer) -> None:
    engine = BM25SearchEngine.build(two_hop.passages, show_progress=False)
    traces = make_traces(two_hop, engine, tokenizer, n=600, seed=1, two_search_share=0.5, rendering="brief")
    twice = [t for t in traces if t.second_query]
    assert 0.42 <= len(twice) / len(traces) <= 0.58  # binomial(600, 0.5): sd 0.02
    assert {t.second_query_kind for t in twice} == {"name", "words", "mixed"}
    people = {e.name for e in two_hop.entities}
    for trace in twice:
        if trace.second_query_kind == "name":
            # A person the first results name (never told which one finds the answer).
            assert trace.second_query in people
            assert any(trace.second_query in d.text for d in trace.documents)
    # Two-hop questions answered right only by chance: far from always, and not never.
    answers = [t.answer in t.example.golden_answers for t in twice if two_hop.facts[t.example.id].relation == TWO_HOP]
    assert len(answers) >= 30 and 0.0 < sum(answers) / len(answers) < 0.5
    # The share is drawn after everything else: the first searches are those of the one-search traces.
    once = make_traces(two_hop, engine, tokenizer, n=600, seed=1, rendering="brief")
    assert [(t.example.id, t.query) for t in once] == [(t.example.id, t.query) for t in traces]


def test_two_search_share_out_of_range_is_refused(two_hop: World, tokenizer) -> None:
    engine = BM25SearchEngine.build(two_hop.passages, show_progress=False)
    with pytest.raises(ValueError, match=r"two_search_share=-0\.1"):
        make_traces(two_hop, engine, tokenizer, n=1, seed=0, two_search_share=-0.1)


def test_quickstart_fingerprints_name_the_two_hop_settings_only_when_set() -> None:
    rl = load_recipe(TrainRecipe, pipeline.recipes_dir(QuickstartRecipe()) / "train.yaml")
    default = pipeline.base_settings(QuickstartRecipe(), rl)
    assert "two_search_share" not in default  # so a default base keeps the fingerprint it had before
    two = pipeline.base_settings(load_recipe(QuickstartRecipe, None, ["tinyworld.two_search_share=0.5"]), rl)
    assert two == {**default, "two_search_share": 0.5}


def test_reading_accuracy_leaves_two_hop_questions_out(two_hop: World, tokenizer) -> None:
    # One search for the entity's name cannot find a two-hop answer: those questions are not a reading test.
    engine = BM25SearchEngine.build(two_hop.passages, show_progress=False)
    model = build_tiny_model(tokenizer, hidden=32, layers=1, heads=2, kv_heads=1, ffn=64, seed=0)
    examples = two_hop.train + two_hop.test
    one_hop = [e for e in examples if two_hop.facts[e.id].relation != TWO_HOP]
    assert 0 < len(one_hop) < len(examples)
    reading = reading_accuracy(
        model, tokenizer, two_hop, engine, examples, top_k=3, template="search-r1-brief", rendering="brief"
    )
    assert TWO_HOP not in reading
    assert reading["all"]["questions"] == len(one_hop)
