"""Simulator prompt presets: the compat ZeroSearch text byte for byte, and the other presets' shape."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from simsearch.simulator.engine import parse_documents
from simsearch.simulator.prompts import (
    PromptTemplates,
    as_chat,
    chat_messages,
    check_templates,
    format_response,
    render,
)
from simsearch.types import Document

# ZeroSearch's SFT-mode prompt, typed out by hand from Alibaba-NLP/ZeroSearch: only the FIRST gold answer,
# "five" although top_k is 3, a blank line after the second and fourth lines, and a newline after
# "Useful Output:".
EXPECTED_USEFUL = (
    "You are the Google search engine.\n"
    "Given a query, you need to generate five useful documents for the query.\n"
    "\n"
    'The user is trying to answer the question: "who wrote hamlet?" whose answer is William Shakespeare.\n'
    "Each document should contain about 30 words, and these documents should contain useful information.\n"
    "\n"
    "Query: hamlet author\n"
    "Useful Output:\n"
)
EXPECTED_NOISY = (
    "You are the Google search engine.\n"
    "Given a query, you need to generate five noisy documents for the query.\n"
    "\n"
    'The user is trying to answer the question: "who wrote hamlet?" whose answer is William Shakespeare.\n'
    "Each document should contain about 30 words, and these documents should contain noisy information.\n"
    "\n"
    "Query: hamlet author\n"
    "Noisy Output:\n"
)
ARGS = dict(
    query="hamlet author",
    question="who wrote hamlet?",
    golden_answers=["William Shakespeare", "Shakespeare"],
    top_k=3,
)


def test_zerosearch_useful_is_the_compat_text() -> None:
    assert render("zerosearch", noisy=False, **ARGS) == EXPECTED_USEFUL


def test_zerosearch_noisy_is_the_compat_text() -> None:
    assert render("zerosearch", noisy=True, **ARGS) == EXPECTED_NOISY


def test_zerosearch_keeps_braces_in_user_text_literal() -> None:
    text = render("zerosearch", query="{x}", question="q {y}?", golden_answers=["{z}"], noisy=False, top_k=5)
    assert 'question: "q {y}?" whose answer is {z}.' in text and "Query: {x}\n" in text


def test_zerosearch_needs_question_and_answer() -> None:
    with pytest.raises(ValueError, match="question and at least one gold answer"):
        render("zerosearch", query="q", question=None, golden_answers=[], noisy=False, top_k=3)


def test_simsearch_asks_for_top_k_and_carries_context() -> None:
    text = render("simsearch", noisy=False, **{**ARGS, "top_k": 4})
    assert "Write 4 search results" in text and "Doc 1 to Doc 4" in text
    assert "Question: who wrote hamlet?\nAnswer: William Shakespeare; Shakespeare\n" in text
    assert text.endswith("Query: hamlet author\nResults:\n")
    noisy = render("simsearch", noisy=True, **ARGS)
    assert "do not contain or imply the answer" in noisy and "only in results this query" not in noisy


def test_simsearch_without_context_omits_question_lines() -> None:
    text = render("simsearch", query="q", question=None, golden_answers=[], noisy=False, top_k=3)
    assert "Question:" not in text and "Answer:" not in text


def test_simsearch_shows_the_answer_without_the_question() -> None:
    text = render("simsearch", query="q", question=None, golden_answers=["Paris"], noisy=False, top_k=3)
    assert "Question:" not in text and "Answer: Paris\n" in text


def test_simsearch_brief_is_the_context_and_query_only() -> None:
    assert render("simsearch-brief", noisy=False, **ARGS) == (
        "Question: who wrote hamlet?\nAnswer: William Shakespeare; Shakespeare\nQuery: hamlet author\nResults:\n"
    )
    hidden = dict(query="q", question=None, golden_answers=[], top_k=3)
    assert render("simsearch-brief", noisy=False, **hidden) == "Query: q\nResults:\n"
    assert render("simsearch-brief", noisy=True, **hidden) == "Query: q\nNoisy results:\n"


def test_zerosearch_prompt_noisy_omits_question_and_answer() -> None:
    useful = render("zerosearch-prompt", noisy=False, **ARGS)
    noisy = render("zerosearch-prompt", noisy=True, **ARGS)
    assert "who wrote hamlet?" in useful and "William Shakespeare" in useful
    assert "who wrote hamlet?" not in noisy and "Shakespeare" not in noisy
    # The one-shot demonstration holds top_k documents in the response format.
    assert "Doc 3(Title:" in useful and "Doc 4(Title:" not in useful
    assert useful.endswith("Query: hamlet author\nResults:\n")


def test_custom_templates_fill_every_field() -> None:
    templates = PromptTemplates(useful="U {query}|{question}|{answers}|{top_k} {{lit}}", noisy="N {query}")
    assert render("custom", noisy=False, templates=templates, **ARGS) == (
        "U hamlet author|who wrote hamlet?|William Shakespeare; Shakespeare|3 {lit}"
    )
    assert render("custom", noisy=True, templates=templates, **ARGS) == "N hamlet author"


@pytest.mark.parametrize(
    ("useful", "message"),
    [("{quey}", r"\{quey\}"), ("{query", "format syntax"), ("  ", "empty")],
)
def test_bad_custom_templates_are_rejected(useful: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_templates(PromptTemplates(useful=useful, noisy="{query}"))


def test_templates_only_with_custom() -> None:
    with pytest.raises(ValueError, match="templates"):
        render("simsearch", noisy=False, templates=PromptTemplates("a", "b"), **ARGS)
    with pytest.raises(ValueError, match="templates"):
        render("custom", noisy=False, **ARGS)


def test_format_response_round_trips_through_the_parser() -> None:
    docs = [Document('"Hamlet"', "A tragedy\nby Shakespeare."), Document("Globe (theatre)", "London.")]
    text = format_response(docs)
    assert text == 'Doc 1(Title: "Hamlet") A tragedy by Shakespeare.\nDoc 2(Title: Globe (theatre)) London.'
    parsed = parse_documents(text, 2).documents
    assert [(d.title, d.text) for d in parsed] == [
        ('"Hamlet"', "A tragedy by Shakespeare."),
        ("Globe (theatre)", "London."),
    ]


def test_format_response_in_the_brief_style_round_trips_texts_through_the_parser() -> None:
    docs = [Document('"Roru"', "Roru is a glassblower\nfrom Gesmere."), Document("Lyon", "Lyon is a city.")]
    text = format_response(docs, "brief")
    assert text == "Doc 1: Roru is a glassblower from Gesmere.\nDoc 2: Lyon is a city."
    result = parse_documents(text, 2)
    assert result.valid  # numbered blocks, exactly top_k
    assert [d.text for d in result.documents] == ["Roru is a glassblower from Gesmere.", "Lyon is a city."]
    # Shown to the policy in the same style, the parsed documents read exactly as written.
    assert format_response(result.documents, "brief") == text


def _tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tokenizer.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    return tokenizer


def test_as_chat_sends_an_empty_system_message_then_the_prompt() -> None:
    assert chat_messages("P") == [{"role": "system", "content": ""}, {"role": "user", "content": "P"}]
    assert as_chat("P", _tokenizer()) == "<system></system><user>P</user><assistant>"


def test_as_chat_without_a_template_says_so() -> None:
    tokenizer = _tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="chat_template"):
        as_chat("P", tokenizer)
