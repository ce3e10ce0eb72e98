"""Pretraining traces of the tiny base model: masks, determinism, no leaked strategy."""

from __future__ import annotations

import pytest

from simsearch.data.chat import search_tool_schema, tool_call_messages, write_call
from simsearch.data.rendering import render_documents, wrap_information
from simsearch.data.templates import render_prompt
from simsearch.models import TINY_TOOL_TEMPLATE, TOOL_SPECIAL_TOKENS, train_tokenizer
from simsearch.policy.toolcalls import parse_turn
from simsearch.tinyworld.traces import copy_mask, make_copy_drills, make_traces, tiny_call
from simsearch.tinyworld.values import RELATION_KINDS, value_kind, value_spans
from simsearch.tinyworld.world import RELATIONS, build_world
from simsearch.types import Document, QAExample, SearchRequest


class RecordingEngine:
    """A SearchEngine that returns fixed documents and records each call."""

    def __init__(self, documents: list[Document]) -> None:
        self.documents = documents
        self.calls: list[list[SearchRequest]] = []

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        self.calls.append(requests)
        return [list(self.documents) for _ in requests]


def test_copy_mask_marks_only_repeated_bigrams_inside_the_span():
    # ids:      5  6  7  5  6  8  6  7  5  6
    # position: 0  1  2  3  4  5  6  7  8  9
    # Bigrams (prev, cur) by position: 1 (5,6), 2 (6,7), 3 (7,5), 4 (5,6) seen at 1, 5 (6,8),
    # 6 (8,6), 7 (6,7) seen at 2, 8 (7,5) seen at 3, 9 (5,6) seen at 1.
    # With the span [4, 8): positions 4 and 7 are repeats; 8 and 9 are outside the span.
    ids = [5, 6, 7, 5, 6, 8, 6, 7, 5, 6]
    assert copy_mask(ids, 4, 8) == [0, 0, 0, 0, 1, 0, 0, 1, 0, 0]
    # The whole sequence: 4, 7, 8 and 9 repeat an earlier bigram.
    assert copy_mask(ids, 0, len(ids)) == [0, 0, 0, 0, 1, 0, 0, 1, 1, 1]
    # A bigram counts only if it occurred strictly earlier: (5, 5, 5) repeats (5, 5) at 2 only.
    assert copy_mask([5, 5, 5], 0, 3) == [0, 0, 1]


def test_trace_is_prompt_search_information_answer_with_masks(world, tokenizer):
    # A hand-built case with a scripted engine: the pieces, their order and both masks.
    example = world.train[0]
    name = world.facts[example.id].entity
    docs = [Document(title=f'"{name}"', text=f"{name} was born in {world.cities[0]} and works as a baker.")]
    engine = RecordingEngine(docs)
    (trace,) = make_traces(
        world, engine, tokenizer, n=1, seed=0, top_k=2, query_mix=(1.0, 0.0, 0.0), examples=[example]
    )

    assert engine.calls == [[SearchRequest(query=name, top_k=2)]]
    assert trace.query == name and trace.query_kind == "name"
    assert trace.answer in (world.cities[0], "baker")
    prompt = tokenizer.encode(render_prompt(example.question, template="search-r1"))
    search = tokenizer.encode(f"<search> {name} </search>", add_special_tokens=False)
    information = tokenizer.encode(wrap_information(render_documents(docs)), add_special_tokens=False)
    answer = tokenizer.encode(f"<answer> {trace.answer} </answer>", add_special_tokens=False)
    assert trace.input_ids == prompt + search + information + answer
    expected_mask = [0] * len(prompt) + [1] * len(search) + [0] * len(information) + [1] * len(answer)
    assert trace.loss_mask == expected_mask

    start, end = len(prompt) + len(search), len(prompt) + len(search) + len(information)
    assert trace.copy_mask == copy_mask(trace.input_ids, start, end)
    assert sum(trace.copy_mask[start:end]) > 0  # the name repeats: from the question, the query and the title
    assert sum(trace.copy_mask[:start]) == 0 and sum(trace.copy_mask[end:]) == 0
    text = tokenizer.decode(trace.input_ids, skip_special_tokens=False)
    assert text.endswith(
        f'</search>\n\n<information>Doc 1(Title: "{name}") {docs[0].text}</information>\n\n'
        f"<answer> {trace.answer} </answer>"
    )


def test_traces_show_results_in_the_rollout_s_rendering(world, tokenizer):
    example = world.train[0]
    name = world.facts[example.id].entity
    docs = [Document(title=f'"{name}"', text=f"{name} was born in {world.cities[0]}.")]
    (trace,) = make_traces(
        world,
        RecordingEngine(docs),
        tokenizer,
        n=1,
        seed=0,
        top_k=1,
        query_mix=(1.0, 0.0, 0.0),
        examples=[example],
        rendering="brief",
    )
    information = tokenizer.encode(wrap_information(render_documents(docs, "brief")), add_special_tokens=False)
    start = trace.loss_mask.index(0, trace.loss_mask.index(1))  # after the search call
    assert trace.input_ids[start : start + len(information)] == information
    assert f"<information>Doc 1: {docs[0].text}</information>" in tokenizer.decode(trace.input_ids)


def test_masks_split_policy_and_information_tokens_on_real_traces(traces, tokenizer):
    open_id, close_id = tokenizer.convert_tokens_to_ids(["<information>", "</information>"])
    for trace in traces[:200]:
        ids = trace.input_ids
        # The last ones: the Search-R1 prompt spells both tags in its instructions.
        start, end = (len(ids) - 1 - ids[::-1].index(tag) for tag in (open_id, close_id))
        # Policy tokens are exactly the search turn (before the information) and the answer
        # turn (after "</information>\n\n"); prompt and information tokens are 0.
        generated = [i for i, m in enumerate(trace.loss_mask) if m]
        assert tokenizer.decode([ids[i] for i in generated], skip_special_tokens=False) == (
            f"<search> {trace.query} </search><answer> {trace.answer} </answer>"
        )
        assert all(m == 0 for m in trace.loss_mask[start - 2 : end + 2])
        copied = [i for i, m in enumerate(trace.copy_mask) if m]
        # The observation runs from "\n\n<information>" to "</information>\n\n" (2 tokens each side).
        assert copied and all(start - 2 <= i <= end + 2 for i in copied)
        for i in copied:
            bigram = (ids[i - 1], ids[i])
            assert bigram in {(ids[j - 1], ids[j]) for j in range(1, i)}


def test_same_seed_same_traces_other_seed_other_traces(world, engine, tokenizer, traces):
    again = make_traces(world, engine, tokenizer, n=1200, seed=7)
    assert [t.input_ids for t in again] == [t.input_ids for t in traces]
    assert [t.copy_mask for t in again] == [t.copy_mask for t in traces]
    other = make_traces(world, engine, tokenizer, n=1200, seed=8)
    assert [t.input_ids for t in other] != [t.input_ids for t in traces]


def test_queries_mix_all_kinds_and_are_not_always_the_name(world, traces):
    kinds = [t.query_kind for t in traces]
    # Drawn 1/3 each, but most "words" queries find nothing (no passage says "occupation",
    # "job" or "birthplace") and are redrawn, kind included: here 517 name, 518 mixed, 165 words.
    assert 0.38 < kinds.count("name") / len(kinds) < 0.48
    assert 0.38 < kinds.count("mixed") / len(kinds) < 0.48
    assert 0.08 < kinds.count("words") / len(kinds) < 0.2
    names = [world.facts[t.example.id].entity for t in traces]
    with_name = sum(name in t.query.split() for t, name in zip(traces, names))
    assert with_name == kinds.count("name") + kinds.count("mixed")
    mixed = [t for t in traces if t.query_kind == "mixed"]
    # Mixed queries put the name anywhere among the words, not always first or last.
    assert 0.2 < sum(t.query.split()[0] == names[traces.index(t)] for t in mixed) / len(mixed) < 0.6
    assert all(t.example in world.train for t in traces)  # held-out questions stay unseen


def test_a_words_only_mix_names_the_person_only_where_no_words_find_anything(world, engine, tokenizer):
    traces = make_traces(world, engine, tokenizer, n=600, seed=7, query_mix=(0.0, 1.0, 0.0))
    assert all(t.documents for t in traces)
    # Phrasings whose words never occur in the corpus ("What job does X have?") fall back to the
    # name on the last redraw instead of failing; every other trace keeps a words query.
    fallbacks = [t for t in traces if t.query_kind == "name"]
    assert {t.query_kind for t in traces} == {"words", "name"}
    assert 0 < len(fallbacks) < len(traces) / 2
    for trace in fallbacks:
        words_only = " ".join(w for w in trace.example.question.split() if w.strip("?") != trace.query)
        assert not engine.search([SearchRequest(query=words_only, top_k=3)])[0], trace.example.question


def test_answers_are_copied_values_not_the_gold_answer(world, traces):
    for trace in traces:
        assert trace.answer in trace.candidates
        assert trace.candidates == [v for d in trace.documents for v in value_spans(d.text, world.cities)]
    # 1. The copied answer is the gold answer only at the rate a uniform draw from the
    # candidates gives: the mean, over traces, of the gold share of its candidates. With n=1200
    # draws the hit count's standard deviation is at most sqrt(1200 * 0.25) ~ 17, i.e. 1.5
    # points; 4.5 points is three of them.
    hits = [trace.answer == trace.example.golden_answers[0] for trace in traces]
    chance = [t.candidates.count(t.example.golden_answers[0]) / len(t.candidates) for t in traces]
    assert abs(sum(hits) - sum(chance)) / len(traces) < 0.045
    # And that rate is low in absolute terms: a query holding the name retrieves the entity's
    # three passages (six values, one of them gold: 1/6); a founding query without the name
    # finds founding passages of others (one year each, so up to 1/3 when the entity's own is
    # among them). Here it is 0.19; a generator that copied the gold answer would be near 1.
    assert sum(hits) / len(traces) < 0.25
    # 2. The answer does not depend on what is asked: how often it is the entity's birth city
    # (or occupation, or year) is the same whether the question asks for that relation or
    # another one. A generator that favoured the gold answer would give a gap of ~0.8 here.
    entities = {e.name: e for e in world.entities}
    for relation in RELATIONS:
        asked, other = [], []
        for trace in traces:
            fact = world.facts[trace.example.id]
            value = getattr(entities[fact.entity], relation)
            (asked if fact.relation == relation else other).append(trace.answer == value)
        # ~400 vs ~800 traces, rates ~0.1-0.2: standard error of the gap ~0.025; bound at ~3 of them.
        assert abs(sum(asked) / len(asked) - sum(other) / len(other)) < 0.08, relation


def test_typed_answers_are_of_the_asked_kind_but_not_always_gold(world, engine, tokenizer):
    typed = make_traces(world, engine, tokenizer, n=600, seed=7, typed_answer_share=1.0)
    with_kind = 0
    for trace in typed:
        asked = RELATION_KINDS[world.facts[trace.example.id].relation]
        if any(value_kind(v, world.cities) == asked for v in trace.candidates):
            with_kind += 1
            assert value_kind(trace.answer, world.cities) == asked, (trace.example.question, trace.answer)
        else:
            assert trace.answer in trace.candidates  # no value of that kind: any value
    assert with_kind > 400
    # Which document holds the gold value stays untaught: visits name cities, occupations and
    # years of their own, and queries without the name find other entities' passages.
    hits = sum(t.answer == t.example.golden_answers[0] for t in typed) / len(typed)
    untyped = make_traces(world, engine, tokenizer, n=600, seed=7)
    base_rate = sum(t.answer == t.example.golden_answers[0] for t in untyped) / len(untyped)
    assert base_rate < hits < 0.6, (base_rate, hits)


def test_reading_traces_search_the_name_out_of_the_loss_and_answer_gold(world, engine, tokenizer):
    traces = make_traces(world, engine, tokenizer, n=400, seed=7, typed_answer_share=0.8, reading_share=0.5)
    reading = [t for t in traces if t.reading]
    assert 150 < len(reading) < 250
    for trace in reading:
        fact = world.facts[trace.example.id]
        assert trace.query_kind == "name" and trace.query == fact.named
        assert fact.passage_id in {doc.id for doc in trace.documents}
        assert trace.answer == fact.answer
        # Only the answer turn is trained: the policy tokens are its last ones.
        trained = [i for i, m in enumerate(trace.loss_mask) if m]
        assert trained == list(range(len(trace.input_ids) - len(trained), len(trace.input_ids)))
        assert tokenizer.decode([trace.input_ids[i] for i in trained]).strip() == f"<answer> {fact.answer} </answer>"
    ordinary = [t for t in traces if not t.reading]
    searched = [tokenizer.decode([t.input_ids[i] for i, m in enumerate(t.loss_mask) if m]) for t in ordinary]
    assert all(f"<search> {t.query} </search>" in text for t, text in zip(ordinary, searched))
    # An ordinary trace's answer is drawn, as without reading traces: right about half the time at best.
    assert sum(t.answer == t.example.golden_answers[0] for t in ordinary) / len(ordinary) < 0.6


def test_kept_empty_searches_answer_a_guess_of_the_asked_kind(world, engine, tokenizer):
    redrawn = make_traces(world, engine, tokenizer, n=400, seed=7, query_mix=(0.0, 1.0, 0.0))
    kept = make_traces(world, engine, tokenizer, n=400, seed=7, query_mix=(0.0, 1.0, 0.0), redraw_empty=False)
    assert all(t.documents for t in redrawn)
    assert all(t.query_kind == "words" for t in kept)  # no query turned into a name query
    empty = [t for t in kept if not t.documents]
    assert 20 < len(empty) < 400
    for trace in empty:
        asked = RELATION_KINDS[world.facts[trace.example.id].relation]
        assert trace.candidates == [] and value_kind(trace.answer, world.cities) == asked
        assert "<information></information>" in tokenizer.decode(trace.input_ids).replace(" ", "")
    assert len({t.answer for t in empty}) > 10  # drawn from the whole world, not one value


def test_make_traces_rejects_bad_arguments(world, engine, tokenizer):
    with pytest.raises(ValueError, match="typed_answer_share"):
        make_traces(world, engine, tokenizer, n=2, seed=0, typed_answer_share=1.5)
    with pytest.raises(ValueError, match="reading_share"):
        make_traces(world, engine, tokenizer, n=2, seed=0, reading_share=-0.1)
    with pytest.raises(ValueError, match="query_mix"):
        make_traces(world, engine, tokenizer, n=2, seed=0, query_mix=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="not a question of this world"):
        make_traces(world, engine, tokenizer, n=2, seed=0, examples=[build_world(seed=99).train[0]])
    with pytest.raises(ValueError, match="not a question of this world"):
        make_traces(world, engine, tokenizer, n=2, seed=0, examples=[QAExample("q", "Who?", ["x"])])
    with pytest.raises(ValueError, match="retrieved nothing"):
        make_traces(world, RecordingEngine([]), tokenizer, n=2, seed=0)


def test_copy_drills_repeat_a_random_run_and_train_only_on_the_repeat(tokenizer) -> None:
    drills = make_copy_drills(tokenizer, n=50, seed=1, length=12, alphabet=(3, 5))
    assert drills == make_copy_drills(tokenizer, n=50, seed=1, length=12, alphabet=(3, 5))
    special = set(tokenizer.all_special_ids)
    for drill in drills:
        first, second = drill.input_ids[:12], drill.input_ids[12:]
        assert first == second and len(drill.input_ids) == 24
        assert 1 <= len(set(first)) <= 5 and not set(first) & special
        # The repeat's first token cannot be known from what precedes it; the rest can.
        assert drill.loss_mask == [0] * 13 + [1] * 11
        assert drill.copy_mask == [0] * 24 and drill.example is None
    assert len({tuple(d.input_ids) for d in drills}) == 50


@pytest.fixture(scope="module")
def tool_tokenizer(world):
    return train_tokenizer(world.texts_for_tokenizer(300), 600, TOOL_SPECIAL_TOKENS, TINY_TOOL_TEMPLATE)


@pytest.mark.parametrize("two_search_share", [0.0, 1.0])
def test_a_tool_call_trace_is_the_conversation_the_rollout_renders(world, tool_tokenizer, two_search_share):
    # The trace's text is apply_chat_template of the whole conversation (the calls as assistant
    # messages, the results as tool messages, the answer last), and exactly the assistant turns
    # (each ending in eos) are in the loss; each call parses back to the trace's query.
    tok, example = tool_tokenizer, world.train[0]
    name = world.facts[example.id].entity
    docs = [Document(title=f'"{name}"', text=f"{name} was born in {world.cities[0]} and works as a baker.")]
    (trace,) = make_traces(
        world, RecordingEngine(docs), tok, n=1, seed=0, top_k=2, query_mix=(1.0, 0.0, 0.0), examples=[example],
        protocol="tool-call", template="search-r1-brief", two_search_share=two_search_share,
    )  # fmt: skip

    queries = [trace.query] + ([trace.second_query] if two_search_share else [])
    messages = tool_call_messages(example.question, "search-r1-brief")
    for query in queries:
        messages += [{"role": "assistant", "content": tiny_call(query)},
                     {"role": "tool", "content": render_documents(docs)}]  # fmt: skip
    messages.append({"role": "assistant", "content": f"<answer> {trace.answer} </answer>"})
    rendered = tok.apply_chat_template(messages, tools=[search_tool_schema()], tokenize=False)
    assert tok.decode(trace.input_ids, skip_special_tokens=False) + "\n" == rendered

    trained = [i for i, m in zip(trace.input_ids, trace.loss_mask) if m]
    turns = [tiny_call(q) + tok.eos_token for q in queries] + [f"<answer> {trace.answer} </answer>{tok.eos_token}"]
    assert trained == [i for turn in turns for i in tok.encode(turn, add_special_tokens=False)]
    for query in queries:
        parsed = parse_turn(tiny_call(query), "hermes")
        assert parsed.kind == "search" and [call.query for call in parsed.calls] == [query]


def test_a_name_copied_into_a_tiny_call_keeps_the_tokens_it_has_in_the_question(world, tool_tokenizer):
    # What a tiny base can learn to copy: the space before the query keeps the name's first piece
    # the token it is in the question; right after the quote it is another token.
    def holds(ids: list[int], part: list[int]) -> bool:
        return any(ids[i : i + len(part)] == part for i in range(len(ids)))

    tok = tool_tokenizer
    for example in world.train[:20]:
        name = world.facts[example.id].entity
        name_ids = tok.encode(f" {name}", add_special_tokens=False)
        assert holds(tok.encode(example.question, add_special_tokens=False), name_ids)
        assert holds(tok.encode(tiny_call(f"{name} job"), add_special_tokens=False), name_ids)
        assert not holds(tok.encode(write_call(f"{name} job", "hermes"), add_special_tokens=False), name_ids)


def test_tool_call_traces_keep_the_tag_traces_draws(world, tokenizer, tool_tokenizer, engine):
    # The protocol changes only how the turns are written: the same questions, queries and answers.
    tags = make_traces(world, engine, tokenizer, n=40, seed=5, reading_share=0.5, two_search_share=0.3)
    calls = make_traces(world, engine, tool_tokenizer, n=40, seed=5, reading_share=0.5, two_search_share=0.3,
                        protocol="tool-call")  # fmt: skip
    draws = [(t.example.id, t.query, t.second_query, t.answer, t.reading) for t in tags]
    assert draws == [(t.example.id, t.query, t.second_query, t.answer, t.reading) for t in calls]
    with pytest.raises(ValueError, match="protocol='xml'"):
        make_traces(world, engine, tokenizer, n=1, seed=0, protocol="xml")
