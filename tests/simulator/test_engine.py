"""SimulatedSearchEngine: parsing odd outputs, one generate call per batch, noisy mixing."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simsearch.data.rendering import render_documents, wrap_information
from simsearch.eval.metrics import substring_exact_match
from simsearch.simulator.engine import (
    PAD_TEXT,
    SimulatedSearchEngine,
    noisy_positions,
    parse_documents,
    redact_answers,
    split_verbatim,
    zerosearch_postprocess,
)
from simsearch.simulator.prompts import PromptTemplates
from simsearch.types import Completion, Document, SamplingParams, SearchRequest


class FakeGenerator:
    """Answers each prompt with `reply(prompt)`; records every call."""

    def __init__(self, reply: Callable[[str], str]) -> None:
        self.reply = reply
        self.calls: list[tuple[list, SamplingParams]] = []

    def generate(self, prompts: list, params: SamplingParams) -> list[Completion]:
        self.calls.append((list(prompts), params))
        return [Completion(token_ids=[], text=self.reply(p), finish_reason="stop") for p in prompts]


def _numbered(tag: str, k: int) -> str:
    return "\n".join(f"Doc {i}(Title: {tag}{i}) {tag} text {i}" for i in range(1, k + 1))


def _by_mode(prompt: str) -> str:
    # The simsearch noisy prompt says "do not contain"; the useful one does not.
    return _numbered("N" if "do not contain" in prompt else "U", 5)


def _request(query: str, num_noisy: int = 0, top_k: int = 3) -> SearchRequest:
    return SearchRequest(query=query, top_k=top_k, question="who?", golden_answers=["A"], num_noisy=num_noisy)


# --------------------------------------------------------------------------- parsing


def test_numbered_output_is_cut_at_doc_top_k_plus_one() -> None:
    result = parse_documents(_numbered("T", 5), 3)
    assert [d.title for d in result.documents] == ["T1", "T2", "T3"]
    assert [d.text for d in result.documents] == ["T text 1", "T text 2", "T text 3"]
    assert result.valid and result.trimmed == 0 and result.padded == 0
    assert all(d.source == "simulator" for d in result.documents)


def test_cut_does_not_fire_on_a_longer_number() -> None:
    # "Doc 40" is not "Doc 4": nothing is cut, the 4 blocks are trimmed to 3 instead.
    text = "Doc 1: a\nDoc 2: b\nDoc 3: c\nDoc 40: d"
    result = parse_documents(text, 3)
    assert [d.text for d in result.documents] == ["a", "b", "c"]
    assert result.trimmed == 1 and not result.valid


def test_marker_variants_and_blank_lines() -> None:
    text = "Here you go:\n\n**Doc 1:** first one\n\n- Document 2. second\n\ndoc 3) third\n"
    result = parse_documents(text, 3)
    assert [d.text for d in result.documents] == ["first one", "second", "third"]
    assert result.method == "numbered"


def test_multi_line_block_takes_first_line_as_title() -> None:
    result = parse_documents("Doc 1:\nParis\nThe capital\nof France.", 1)
    assert (result.documents[0].title, result.documents[0].text) == ("Paris", "The capital of France.")


def test_untitled_line_uses_its_first_words_as_title() -> None:
    doc = parse_documents("one two three four five six seven eight", 1).documents[0]
    assert doc.title == "one two three four five six"
    assert doc.text == "one two three four five six seven eight"


def test_short_output_is_padded_with_empty_documents() -> None:
    result = parse_documents("Doc 1: only one", 3)
    assert [d.text for d in result.documents] == ["only one", PAD_TEXT, PAD_TEXT]
    assert result.padded == 2 and result.found == 1


def test_lines_and_paragraph_fallbacks() -> None:
    # Three paragraphs of two lines: paragraphs win (>= top_k of them).
    paragraphs = "a1\na2\n\nb1\nb2\n\nc1\nc2"
    result = parse_documents(paragraphs, 3)
    assert result.method == "paragraphs" and [d.title for d in result.documents] == ["a1", "b1", "c1"]
    # One paragraph of three lines: lines.
    result = parse_documents("x\ny\nz", 3)
    assert result.method == "lines" and [d.text for d in result.documents] == ["x", "y", "z"]


@pytest.mark.parametrize("text", ["", "   \n\n \t", "Doc 1:\nDoc 2:"])
def test_empty_output_is_unparsed_and_fully_padded(text: str) -> None:
    result = parse_documents(text, 2)
    assert result.method == "empty" and result.padded == 2
    assert [d.text for d in result.documents] == [PAD_TEXT, PAD_TEXT]


def test_unbalanced_title_falls_back_without_error() -> None:
    # No closing parenthesis: the block is an untitled line (five words, all in the title).
    doc = parse_documents("Doc 1(Title: broken ( title text", 1).documents[0]
    assert (doc.title, doc.text) == ("(Title: broken ( title text", "(Title: broken ( title text")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(), max_size=400), st.integers(min_value=1, max_value=8))
def test_parse_always_returns_exactly_top_k(text: str, top_k: int) -> None:
    result = parse_documents(text, top_k)
    assert len(result.documents) == top_k
    assert result.found - result.trimmed + result.padded == top_k


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(alphabet=st.characters(blacklist_characters="()", blacklist_categories=["Cs"]), max_size=20),
            st.text(alphabet=st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=60),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_structured_docs_mixed_with_marker_lookalikes_never_break(docs: list[tuple[str, str]]) -> None:
    text = "\n".join(f"Doc {i}(Title: {t}) {x}" for i, (t, x) in enumerate(docs, 1))
    assert len(parse_documents(text, len(docs)).documents) == len(docs)


# --------------------------------------------------------------------------- the engine


def test_one_generate_call_per_search_batch() -> None:
    gen = FakeGenerator(_by_mode)
    engine = SimulatedSearchEngine(gen, preset="simsearch", temperature=0.8, max_new_tokens=600)
    results = engine.search([_request("q1"), _request("q2", num_noisy=3), _request("q3", num_noisy=1)])
    assert len(gen.calls) == 1
    prompts, params = gen.calls[0]
    # useful, noisy, and both prompts for the mixed request: 4 prompts in the one call.
    assert len(prompts) == 4
    assert (params.temperature, params.max_new_tokens) == (0.8, 600)
    assert [d.title for d in results[0]] == ["U1", "U2", "U3"]
    assert [d.title for d in results[1]] == ["N1", "N2", "N3"]
    assert engine.stats["simulator/calls"] == 1 and engine.stats["simulator/sets"] == 4


@pytest.mark.parametrize("num_noisy", [1, 2, 3, 4])
def test_mixing_takes_exactly_num_noisy_documents_from_the_noisy_set(num_noisy: int) -> None:
    engine = SimulatedSearchEngine(FakeGenerator(_by_mode), preset="simsearch")
    docs = engine.search([_request("mixed query", num_noisy=num_noisy, top_k=5)])[0]
    positions = noisy_positions("mixed query", 5, num_noisy)
    assert [i for i, d in enumerate(docs) if d.title.startswith("N")] == positions
    # Each position keeps its own index: document i comes from set position i.
    assert [d.title[1:] for d in docs] == ["1", "2", "3", "4", "5"]


def test_noisy_positions_are_deterministic_and_vary_by_query() -> None:
    assert noisy_positions("a", 5, 2) == noisy_positions("a", 5, 2)
    assert len({tuple(noisy_positions(f"q{i}", 5, 2)) for i in range(20)}) > 1
    with pytest.raises(ValueError):
        noisy_positions("a", 3, 4)


def test_bad_num_noisy_names_the_request() -> None:
    engine = SimulatedSearchEngine(FakeGenerator(_by_mode), preset="simsearch")
    with pytest.raises(ValueError, match=r"request 1 .*'bad'"):
        engine.search([_request("ok"), _request("bad", num_noisy=4)])


def test_empty_batch_makes_no_call() -> None:
    gen = FakeGenerator(_by_mode)
    assert SimulatedSearchEngine(gen, preset="simsearch").search([]) == []
    assert gen.calls == []


def test_stats_count_padding_trimming_and_unparsed() -> None:
    replies = iter(["", "Doc 1: a", "Doc 1: a\nDoc 2: b\nDoc 3: c", "a\nb\nc\nd"])
    engine = SimulatedSearchEngine(FakeGenerator(lambda p: next(replies)), preset="simsearch")
    engine.search([_request(f"q{i}") for i in range(4)])
    assert engine.stats["simulator/unparsed"] == 1
    assert engine.stats["simulator/padded"] == 2  # "" and the one-document answer
    assert engine.stats["simulator/trimmed"] == 1  # four lines for top_k=3
    assert engine.stats["simulator/valid"] == 1


def test_zerosearch_preset_reaches_the_generator_verbatim() -> None:
    gen = FakeGenerator(lambda p: _numbered("D", 5))
    engine = SimulatedSearchEngine(gen, preset="zerosearch")
    engine.search([_request("q", num_noisy=3)])
    assert gen.calls[0][0][0].endswith("Query: q\nNoisy Output:\n")


class _CharTokenizer:
    """A stand-in tokenizer: chat template "[S]system[U]prompt[A]", one id per character."""

    chat_template = "set"
    name_or_path = "char"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return "".join(f"[{m['role'][0].upper()}]{m['content']}" for m in messages) + "[A]"

    def __call__(self, text: str, add_special_tokens: bool) -> dict:
        assert add_special_tokens is False  # the template already wrote them
        return {"input_ids": [ord(c) for c in text]}


def test_chat_mode_sends_chat_templated_token_ids() -> None:
    gen = FakeGenerator(lambda p: "Doc 1: x")
    engine = SimulatedSearchEngine(
        gen,
        preset="custom",
        templates=PromptTemplates("U:{query}", "N:{query}"),
        tokenizer=_CharTokenizer(),
        chat=True,  # type: ignore[arg-type]
    )
    engine.search([_request("q", top_k=1)])
    sent = gen.calls[0][0][0]
    assert "".join(map(chr, sent)) == "[S][U]U:q[A]"


def test_show_question_false_keeps_the_question_out_of_the_prompt() -> None:
    gen = FakeGenerator(_by_mode)
    request = SearchRequest(query="q", top_k=3, question="Who wrote Hamlet?", golden_answers=["Shakespeare"])
    SimulatedSearchEngine(gen, preset="simsearch", show_question=False).search([request])
    SimulatedSearchEngine(gen, preset="simsearch").search([request])
    hidden, shown = gen.calls[0][0][0], gen.calls[1][0][0]
    assert "Who wrote Hamlet?" not in hidden and "Answer: Shakespeare\n" in hidden
    assert "Question: Who wrote Hamlet?\n" in shown and "Answer: Shakespeare\n" in shown
    with pytest.raises(ValueError, match="always shows the question"):
        SimulatedSearchEngine(gen, preset="zerosearch", show_question=False)


def test_show_answer_false_keeps_the_answer_out_of_the_prompt() -> None:
    gen = FakeGenerator(_by_mode)
    request = SearchRequest(query="q", top_k=3, question="Who wrote Hamlet?", golden_answers=["Shakespeare"])
    SimulatedSearchEngine(gen, preset="simsearch", show_question=False, show_answer=False).search([request])
    prompt = gen.calls[0][0][0]
    assert "Shakespeare" not in prompt and "Hamlet" not in prompt and "Query: q\n" in prompt
    with pytest.raises(ValueError, match="show_answer=False: preset='zerosearch-prompt'"):
        SimulatedSearchEngine(gen, preset="zerosearch-prompt", show_answer=False)


def test_fingerprint_is_stable_and_sensitive_to_config() -> None:
    def make(**kw: object) -> SimulatedSearchEngine:
        generator = FakeGenerator(_by_mode)
        return SimulatedSearchEngine(generator, preset="simsearch", model_name="m", **kw)  # type: ignore[arg-type]

    assert make().fingerprint() == make().fingerprint()
    assert make().fingerprint() != make(temperature=0.5).fingerprint()
    assert make().fingerprint() != make(show_question=False).fingerprint()
    assert make().fingerprint() != make(show_answer=False).fingerprint()
    assert '"model": "m"' in make().fingerprint()


def test_seeded_engine_passes_a_new_seed_per_call() -> None:
    gen = FakeGenerator(_by_mode)
    engine = SimulatedSearchEngine(gen, preset="simsearch", seed=7)
    engine.search([_request("a")])
    engine.search([_request("a")])
    assert [params.seed for _, params in gen.calls] == [7, 8]


def test_documents_are_plain_documents() -> None:
    docs = SimulatedSearchEngine(FakeGenerator(_by_mode), preset="simsearch").search([_request("q")])[0]
    assert docs[0] == Document(title="U1", text="U text 1", source="simulator")


# ZeroSearch's post-processing (llm_agent/generation.py:91,137), derived by hand:
# '\n'.join(s.replace('\n\n', '\n').split('\n')).split(f'Doc {topk+1}')[0]. One replace pass turns the
# three newlines after "Paris." into two; "Doc 4" cuts the rest off.
RAW = (
    "Doc 1: Paris is the capital of France.\n\n"
    "Doc 2: The Eiffel Tower\nis in Paris.\n\n\n"
    "Doc 3: France borders Spain.\n"
    "Doc 4: extra"
)
POSTPROCESSED = (
    "Doc 1: Paris is the capital of France.\nDoc 2: The Eiffel Tower\nis in Paris.\n\nDoc 3: France borders Spain.\n"
)


def test_zerosearch_postprocess_is_byte_identical() -> None:
    assert zerosearch_postprocess(RAW, 3) == POSTPROCESSED
    # A plain substring cut: "Doc 4" inside "Doc 40" cuts too (parse_documents does not).
    assert zerosearch_postprocess("Doc 1: a\nDoc 2: see Doc 40 items\nDoc 3: c", 3) == "Doc 1: a\nDoc 2: see "
    assert zerosearch_postprocess("a\r\n\r\nb", 3) == "a\r\n\r\nb"  # no other normalisation


def test_split_verbatim_pieces_concatenate_to_the_postprocessed_text() -> None:
    assert [d.text for d in split_verbatim(RAW, 3)] == [
        "Doc 1: Paris is the capital of France.\n",
        "Doc 2: The Eiffel Tower\nis in Paris.\n\n",
        "Doc 3: France borders Spain.\n",
    ]
    # A preamble stays with the first piece; missing pieces are empty; surplus stays with the last.
    pieces = split_verbatim("Here you go:\nDoc 1: a\nDoc 2: b", 3)
    assert [d.text for d in pieces] == ["Here you go:\nDoc 1: a\n", "Doc 2: b", ""]
    assert [d.text for d in split_verbatim("no markers at all", 2)] == ["no markers at all", ""]
    assert [d.text for d in split_verbatim("Doc 1: a\nDoc 2: b\nDoc 2: c", 2)] == ["Doc 1: a\n", "Doc 2: b\nDoc 2: c"]
    assert all(d.title == "" and d.source == "simulator" for d in split_verbatim(RAW, 3))


@given(st.text(alphabet="Doc 123:\n ab", max_size=80), st.integers(min_value=1, max_value=4))
@settings(max_examples=200, deadline=None)
def test_split_verbatim_never_loses_or_adds_a_byte(text: str, top_k: int) -> None:
    docs = split_verbatim(text, top_k)
    assert len(docs) == top_k
    assert "".join(d.text for d in docs) == zerosearch_postprocess(text, top_k)


def test_verbatim_engine_shows_the_policy_what_zerosearch_showed() -> None:
    engine = SimulatedSearchEngine(FakeGenerator(lambda p: RAW), preset="simsearch", verbatim=True)
    docs = engine.search([_request("capital of france", top_k=3)])[0]
    # ZeroSearch wraps `search_results.pop(0).strip()` (generation.py:524).
    expected = (
        "\n\n<information>Doc 1: Paris is the capital of France.\nDoc 2: The Eiffel Tower\nis in Paris.\n\n"
        "Doc 3: France borders Spain.</information>\n\n"
    )
    assert wrap_information(render_documents(docs, style="zerosearch-simulator")) == expected
    assert engine.stats["simulator/sets"] == 1  # the parse statistics are still kept
    assert SimulatedSearchEngine(FakeGenerator(_by_mode), preset="simsearch").fingerprint() != engine.fingerprint()


# --------------------------------------------------------------------------- noisy_answers=redact


@pytest.mark.parametrize(
    ("text", "golds", "expected"),
    [
        ("Ana was born in Velmora in 1873.", ["Velmora"], "Ana was born in ___ in 1873."),
        ("born in VELMORA, twice: velmora.", ["velmora"], "born in ___, twice: ___."),
        ("She studied at the Old Harbor school", ["the old harbor"], "She studied at the ___ school"),
        ("He lived in O'Neill-Town", ["O'Neill Town"], "He lived in ___"),
        ("in 18730 and 1873", ["1873"], "in ___0 and ___"),  # containment is by character
        ("nothing to see", ["Velmora"], "nothing to see"),
    ],
)
def test_redact_answers_replaces_every_spelling_normalization_matches(text: str, golds: list, expected: str) -> None:
    assert redact_answers(text, golds) == expected


def test_redact_answers_pads_a_document_whose_answer_it_cannot_cut_out() -> None:
    # "The" inside the answer is dropped by normalization, so "The Hague" is held by "hague".
    assert redact_answers("capital: Hague", ["The Hague"]) == "capital: ___"
    # A decomposed accent is still NFC-normalized into the answer but the pattern does not see it.
    assert redact_answers("in Jose\u0301 town", ["José"]) == PAD_TEXT


@given(st.text(max_size=60), st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=3))
@settings(max_examples=300, deadline=None)
def test_redacted_text_never_holds_a_gold_answer(text: str, golds: list[str]) -> None:
    redacted = redact_answers(text, golds)
    assert not substring_exact_match(redacted, golds) or redacted == PAD_TEXT


def _answer_everywhere(prompt: str) -> str:
    return "\n".join(f"Doc {i}(Title: Velmora {i}) Ana was born in Velmora." for i in range(1, 6))


def test_redact_takes_the_answer_out_of_noisy_documents_only() -> None:
    engine = SimulatedSearchEngine(FakeGenerator(_answer_everywhere), preset="simsearch", noisy_answers="redact")
    request = SearchRequest(query="Ana birthplace", top_k=5, golden_answers=["Velmora"], num_noisy=2)
    docs = engine.search([request])[0]
    noisy = set(noisy_positions("Ana birthplace", 5, 2))
    for i, doc in enumerate(docs):
        assert doc.noisy == (i in noisy)
        shown = substring_exact_match(f"{doc.title} {doc.text}", ["Velmora"])
        assert shown == (i not in noisy), (i, doc)
    assert docs[min(noisy)].text == "Ana was born in ___."
    assert engine.stats["simulator/noisy_docs"] == 2 and engine.stats["simulator/noisy_redacted"] == 2


def test_keep_leaves_noisy_documents_as_written() -> None:
    engine = SimulatedSearchEngine(FakeGenerator(_answer_everywhere), preset="simsearch")
    request = SearchRequest(query="Ana birthplace", top_k=3, golden_answers=["Velmora"], num_noisy=3)
    assert all("Velmora" in doc.text for doc in engine.search([request])[0])


def test_redact_refuses_noisy_requests_without_gold_answers() -> None:
    engine = SimulatedSearchEngine(FakeGenerator(_answer_everywhere), preset="simsearch", noisy_answers="redact")
    assert engine.search([SearchRequest(query="q", top_k=3)])[0]  # nothing noisy asked for: nothing to redact
    with pytest.raises(ValueError, match=r"request 1 \(query 'q2'\).*gold answers"):
        engine.search(
            [
                SearchRequest(query="q1", top_k=3, golden_answers=["Velmora"], num_noisy=1),
                SearchRequest(query="q2", top_k=3, golden_answers=["a"], num_noisy=1),  # normalizes to nothing
            ]
        )
    with pytest.raises(ValueError, match="noisy_answers="):
        SimulatedSearchEngine(FakeGenerator(_by_mode), preset="simsearch", noisy_answers="drop")  # type: ignore[arg-type]


def test_redact_enters_the_fingerprint_and_keep_leaves_it_as_before() -> None:
    keep = SimulatedSearchEngine(FakeGenerator(_by_mode), preset="simsearch")
    redact = SimulatedSearchEngine(FakeGenerator(_by_mode), preset="simsearch", noisy_answers="redact")
    assert "noisy_answers" not in keep.fingerprint() and '"noisy_answers": "redact"' in redact.fingerprint()
