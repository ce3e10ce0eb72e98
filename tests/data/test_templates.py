"""Policy prompt templates: the compat Search-R1 text byte for byte, and the other templates' shape."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from simsearch.data.templates import (
    SEARCH_R1_TEMPLATE,
    TEMPLATE_NAMES,
    TEMPLATES,
    apply_chat_template,
    encode_prompt,
    render_prompt,
    uses_tokenizer,
)
from simsearch.types import Document

# Search-R1's prompt for "who wrote hamlet?", typed out by hand from Search-R1's
# `scripts/data_process/nq_search.py` (not built from
# the module's constant): one line, sentences joined by single spaces, "as your want" kept, and a
# single trailing newline after the question.
EXPECTED_SEARCH_R1 = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every "
    "time you get new information. After reasoning, if you find you lack some knowledge, you can "
    "call a search engine by <search> query </search> and it will return the top searched results "
    "between <information> and </information>. You can search as many times as your want. If you "
    "find no further external knowledge needed, you can directly provide the answer inside <answer> "
    "and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: who wrote hamlet?\n"
)

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _tokenizer(chat_template: str | None) -> PreTrainedTokenizerFast:
    # A tiny word-level tokenizer built in-process that adds a BOS (id 2) when asked for special
    # tokens, like Llama's: what matters here is its chat template and that BOS.
    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "<s>": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 2)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", bos_token="<s>")
    tokenizer.chat_template = chat_template
    return tokenizer


def _reference_prompt_ids(tokenizer: PreTrainedTokenizerFast, content: str) -> list[int]:
    # Search-R1 / ZeroSearch verl/utils/dataset/rl_dataset.py:126-131 on a row whose prompt is
    # [{"role": "user", "content": content}], then verl/utils/torch_functional.py:236.
    chat = [{"role": "user", "content": content}]
    if tokenizer.chat_template:
        prompt_with_chat_template = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    else:
        prompt_with_chat_template = chat[0]["content"]
    return tokenizer(prompt_with_chat_template, add_special_tokens=False)["input_ids"]


def test_search_r1_prompt_is_byte_identical_to_the_original() -> None:
    assert render_prompt("who wrote hamlet?", template="search-r1") == EXPECTED_SEARCH_R1
    assert "as your want" in SEARCH_R1_TEMPLATE
    assert SEARCH_R1_TEMPLATE.count("{question}") == 1


def test_question_with_braces_is_inserted_verbatim() -> None:
    prompt = render_prompt("what is {x} in {0}?", template="search-r1")
    assert prompt.endswith("Question: what is {x} in {0}?\n")


def test_chat_variant_wraps_the_same_text_as_one_user_message() -> None:
    prompt = render_prompt("who wrote hamlet?", template="search-r1-chat", tokenizer=_tokenizer(CHAT_TEMPLATE))
    assert prompt == f"<|user|>{EXPECTED_SEARCH_R1}<|end|>\n<|assistant|>"


def test_chat_variant_needs_a_tokenizer_with_a_chat_template() -> None:
    with pytest.raises(ValueError, match="needs the policy's tokenizer"):
        render_prompt("q?", template="search-r1-chat")
    with pytest.raises(ValueError, match="no chat_template"):
        render_prompt("q?", template="search-r1-chat", tokenizer=_tokenizer(None))


def test_auto_variant_applies_the_chat_template_exactly_when_the_tokenizer_has_one() -> None:
    chat = render_prompt("who wrote hamlet?", template="search-r1-auto", tokenizer=_tokenizer(CHAT_TEMPLATE))
    assert chat == f"<|user|>{EXPECTED_SEARCH_R1}<|end|>\n<|assistant|>"
    for empty in (None, ""):
        bare = render_prompt("who wrote hamlet?", template="search-r1-auto", tokenizer=_tokenizer(empty))
        assert bare == EXPECTED_SEARCH_R1
    with pytest.raises(ValueError, match="needs the policy's tokenizer"):
        render_prompt("q?", template="search-r1-auto")


@pytest.mark.parametrize("chat_template", [CHAT_TEMPLATE, None])
def test_auto_variant_tokenizes_as_search_r1_and_zerosearch_do(chat_template: str | None) -> None:
    tokenizer = _tokenizer(chat_template)
    ids = encode_prompt("a a", template="search-r1-auto", tokenizer=tokenizer)
    assert ids == _reference_prompt_ids(tokenizer, SEARCH_R1_TEMPLATE.format(question="a a"))
    assert ids[0] == 0  # "Answer" or "<": no BOS added, chat-templated or not
    assert _tokenizer(chat_template).encode("a a") == [2, 1, 1]  # which this tokenizer would add by default


def test_encode_prompt_keeps_the_older_templates_tokenization() -> None:
    tokenizer = _tokenizer(CHAT_TEMPLATE)
    # search-r1: bare text, the tokenizer's BOS added (as before search-r1-auto existed).
    ids = encode_prompt("a", template="search-r1", tokenizer=tokenizer)
    assert ids == tokenizer.encode(EXPECTED_SEARCH_R1.replace("who wrote hamlet?", "a"), add_special_tokens=True)
    assert ids[0] == 2 and ids[-1] == 1
    # search-r1-chat: the chat text, no BOS added on top of what the template writes.
    chat_ids = encode_prompt("a", template="search-r1-chat", tokenizer=tokenizer)
    assert chat_ids == _reference_prompt_ids(tokenizer, SEARCH_R1_TEMPLATE.format(question="a"))
    with pytest.raises(ValueError, match="needs documents"):
        encode_prompt("a", template="rag", tokenizer=tokenizer)


def test_one_table_names_every_template() -> None:
    assert tuple(TEMPLATES) == TEMPLATE_NAMES
    assert [t for t in TEMPLATE_NAMES if uses_tokenizer(t)] == ["search-r1-chat", "search-r1-auto"]


def test_apply_chat_template_works_for_any_rendered_text() -> None:
    direct = render_prompt("q?", template="direct")
    assert apply_chat_template(direct, _tokenizer(CHAT_TEMPLATE)) == f"<|user|>{direct}<|end|>\n<|assistant|>"


@pytest.mark.parametrize("template", ["search-r1", "search-r1-brief", "self-search", "direct"])
def test_every_template_ends_with_the_question_line(template: str) -> None:
    # load_qa recovers a question from the text after the last "Question: ".
    prompt = render_prompt("where was Varo Tesk born?", template=template)  # type: ignore[arg-type]
    assert prompt.endswith("Question: where was Varo Tesk born?\n")
    assert prompt.count("Question: ") == 1
    assert "<answer>" in prompt and "</answer>" in prompt


def test_self_search_asks_for_the_whole_structure_in_order() -> None:
    prompt = render_prompt("q?", template="self-search")
    # think, then search, then the policy's own information, then the answer.
    positions = [prompt.index(tag) for tag in ("<think>", "<search>", "<information>", "<answer>")]
    assert positions == sorted(positions)
    assert "search engine by <search> query </search> and it will return" not in prompt


def test_brief_prompt_states_the_search_r1_protocol_in_far_fewer_words() -> None:
    brief = render_prompt("q?", template="search-r1-brief")
    for tag in ("<search>", "</search>", "<information>", "<answer>", "</answer>"):
        assert tag in brief
    assert len(brief.split()) * 3 < len(render_prompt("q?", template="search-r1").split())


def test_direct_prompt_does_not_offer_search() -> None:
    prompt = render_prompt("q?", template="direct")
    assert "<search>" not in prompt and "<information>" not in prompt


def test_rag_prompt_shows_documents_in_search_r1_rendering_before_the_question() -> None:
    docs = [Document(title='"Quellmar"', text="A harbor town."), Document(title="Varo Tesk", text="Born in Quellmar.")]
    prompt = render_prompt("where was Varo Tesk born?", template="rag", documents=docs)
    block = 'Doc 1(Title: "Quellmar") A harbor town.\nDoc 2(Title: Varo Tesk) Born in Quellmar.'
    assert f"Documents:\n{block}\n\nQuestion: where was Varo Tesk born?\n" in prompt
    assert prompt.endswith("Question: where was Varo Tesk born?\n")


def test_rag_with_no_documents_renders_an_empty_block() -> None:
    assert "Documents:\n\n\nQuestion: q?\n" in render_prompt("q?", template="rag", documents=[])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"template": "react"}, "not one of"),
        ({"template": "rag"}, "needs the retrieved documents"),
        ({"template": "direct", "documents": []}, "only 'rag' takes documents"),
        ({"template": "search-r1", "tokenizer": "tok"}, "does not use a tokenizer"),
    ],
)
def test_bad_arguments_fail_with_a_clear_message(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        render_prompt("q?", **kwargs)


def test_a_lone_surrogate_is_encoded_as_the_replacement_character() -> None:
    import json

    from simsearch.data.rendering import encodable
    from simsearch.models import train_tokenizer

    half_emoji = json.loads('"Ganlo \\ud83d was born"')  # JSON spells a lone surrogate; Python keeps it
    assert encodable(half_emoji) == "Ganlo \ufffd was born"
    assert encodable("Ganlo \U0001f600 was born") == "Ganlo \U0001f600 was born"  # a whole emoji stays
    tokenizer = train_tokenizer(["Ganlo was born in Gesmere"] * 20, vocab_size=300)
    with pytest.raises(TypeError):  # what the tokenizer does with it unguarded
        tokenizer.encode(half_emoji)
    ids = encode_prompt(half_emoji, template="search-r1-brief", tokenizer=tokenizer)
    assert "\ufffd was born" in tokenizer.decode(ids)
    # A search API's result holding one reaches the policy the same way.
    from simsearch.policy.protocol import TokenCache
    from simsearch.policy.tags import observation_ids

    [observation] = observation_ids(TokenCache(tokenizer, 64), [half_emoji])
    assert "Ganlo \ufffd was born" in tokenizer.decode(observation)
