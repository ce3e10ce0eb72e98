"""The tool-call protocol's parsers, case by case, and its conversation rendered by the chat template."""

from __future__ import annotations

import pytest

from simsearch.data.chat import ChatTemplateError, ToolConversation, check_tool_support, search_tool_schema
from simsearch.models import TINY_CHAT_TEMPLATE
from simsearch.policy.toolcalls import SearchCall, parse_turn
from tests.chat_templates import HERMES_SPECIALS, HERMES_TEMPLATE, LLAMA3_SPECIALS, LLAMA3_TEMPLATE, tokenizer

TOOLS = [search_tool_schema()]


def hermes(*arguments: str) -> str:
    return "".join(f'<tool_call>{{"name": "search", "arguments": {a}}}</tool_call>' for a in arguments)


# --------------------------------------------------------------------------- hermes


def test_hermes_one_call() -> None:
    turn = parse_turn("<think> find the founder </think>\n" + hermes('{"query": " Belsa founder "}'), "hermes")
    assert (turn.kind, turn.calls, turn.reasons) == ("search", (SearchCall("Belsa founder"),), ())


def test_hermes_several_calls_in_one_turn_keep_their_order() -> None:
    turn = parse_turn(hermes('{"query": "a"}') + "\n" + hermes('{"query": "b"}'), "hermes")
    assert [c.query for c in turn.calls] == ["a", "b"] and turn.kind == "search"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('<tool_call>{"name": "search", "arguments": {"query": "a"</tool_call>', "not valid JSON"),
        ('<tool_call>{"name": "lookup", "arguments": {"query": "a"}}</tool_call>', "unknown tool 'lookup'"),
        (hermes("{}"), "missing its 'query'"),
        (hermes('{"query": "   "}'), "missing its 'query'"),
        ('<tool_call>{"arguments": {"query": "a"}}</tool_call>', "has no name"),
        ('<tool_call>{"name": "search", "arguments": {"query": "a"}}', "not closed"),
        ("<think> " + hermes('{"query": "a"}') + " </think> I am unsure.", "inside <think> is not executed"),
        ("I will not search.", "neither a tool call nor an answer"),
    ],
)
def test_hermes_unreadable_turns_are_invalid_with_a_reason(text: str, reason: str) -> None:
    turn = parse_turn(text, "hermes")
    assert turn.kind == "invalid" and turn.calls == ()
    assert len(turn.reasons) == 1 and reason in turn.reasons[0], turn.reasons


def test_a_readable_call_beside_an_unreadable_one_still_searches_and_counts_the_other() -> None:
    turn = parse_turn(hermes('{"query": "a"}') + '<tool_call>{"name": "browse"}</tool_call>', "hermes")
    assert turn.kind == "search" and [c.query for c in turn.calls] == ["a"]
    assert len(turn.reasons) == 1 and "unknown tool 'browse'" in turn.reasons[0]


def test_an_answer_without_a_call_answers_and_the_later_of_call_and_answer_decides() -> None:
    assert parse_turn("<think> known </think> <answer> Rell </answer>", "hermes") == parse_turn(
        "<answer> Rell </answer>", "hermes"
    )
    assert parse_turn("<answer> Rell </answer>", "hermes").answer == "Rell"
    assert parse_turn(hermes('{"query": "a"}') + "<answer> x </answer>", "hermes").kind == "answer"
    assert parse_turn("<answer> x </answer>" + hermes('{"query": "a"}'), "hermes").kind == "search"
    # An answer written while thinking is not the answer.
    assert parse_turn("<think> <answer> x </answer> </think>", "hermes").kind == "invalid"


def test_arguments_as_a_json_string_and_top_k_when_offered() -> None:
    text = '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"a\\", \\"top_k\\": 2}"}</tool_call>'
    assert parse_turn(text, "hermes").calls == (SearchCall("a"),)  # top_k not offered: ignored
    assert parse_turn(text, "hermes", allow_top_k=True).calls == (SearchCall("a", 2),)
    bad = parse_turn(hermes('{"query": "a", "top_k": 0}'), "hermes", allow_top_k=True)
    assert bad.kind == "invalid" and "top_k" in bad.reasons[0]


# --------------------------------------------------------------------------- llama 3 JSON


def test_llama3_calls_one_several_and_after_the_python_tag() -> None:
    one = parse_turn('{"name": "search", "parameters": {"query": "Belsa"}}', "llama3")
    assert one.kind == "search" and one.calls == (SearchCall("Belsa"),)
    two = parse_turn('<|python_tag|>{"name": "search", "parameters": {"query": "a"}}; '
                     '{"name": "search", "parameters": {"query": "b"}}', "llama3")  # fmt: skip
    assert [c.query for c in two.calls] == ["a", "b"]


def test_llama3_bad_calls_and_answers() -> None:
    assert "not valid JSON" in parse_turn('{"name": "search", "parameters": {', "llama3").reasons[0]
    assert "unknown tool" in parse_turn('{"name": "calc", "parameters": {"x": 1}}', "llama3").reasons[0]
    turn = parse_turn('<answer> {"name": "search"} </answer>', "llama3")  # JSON inside an answer: no call
    assert (turn.kind, turn.answer, turn.reasons) == ("answer", '{"name": "search"}', ())


# --------------------------------------------------------------------------- the chat template


@pytest.mark.parametrize("name", ["hermes", "llama3"])
def test_the_context_is_the_templates_rendering_at_every_turn_and_masks_cover_its_additions(name: str) -> None:
    template, specials = (HERMES_TEMPLATE, HERMES_SPECIALS) if name == "hermes" else (LLAMA3_TEMPLATE, LLAMA3_SPECIALS)
    tok = tokenizer(template, specials)
    eos = specials[1]
    llama = '{"name": "search", "parameters": {"query": "a"}}; {"name": "search", "parameters": {"query": "b"}}'
    call = hermes('{"query": "a"}') + hermes('{"query": "b"}') if name == "hermes" else llama
    turns = [(call, ["Doc 1: a", "Doc 1: b"]), ("<think> ok </think> <answer> Rell </answer>", [])]
    messages = [{"role": "user", "content": "Who founded the Belsa rope works?"}]
    conversation = ToolConversation(tok, TOOLS, messages)
    ids = tok.encode(conversation.text, add_special_tokens=False)
    mask = [0] * len(ids)
    for content, results in turns:
        generated = content + eos
        assert parse_turn(content, name).kind == ("search" if results else "answer")
        new = tok.encode(generated, add_special_tokens=False)
        added = conversation.add_turn(generated, content, results) if results else ""
        extra = tok.encode(added, add_special_tokens=False)
        ids += new + extra
        mask += [1] * len(new) + [0] * len(extra)
        tool_messages = [{"role": "tool", "content": result} for result in results]
        messages = [*messages, {"role": "assistant", "content": content}, *tool_messages]
        if results:  # the context is, byte for byte, the template's rendering of the conversation
            expected = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
            assert conversation.text == expected == tok.decode(ids)
            assert "<tool_response>" in added or "ipython" in added
    # The loss sees exactly the policy's own text: every token the template added is masked.
    trained = tok.decode([i for i, m in zip(ids, mask) if m])
    assert trained == "".join(content + eos for content, _ in turns)


def test_a_template_without_tool_support_is_named_before_any_work() -> None:
    tok = tokenizer(TINY_CHAT_TEMPLATE, HERMES_SPECIALS)
    tok.name_or_path = "runs/quickstart/base"
    with pytest.raises(ChatTemplateError, match=r"runs/quickstart/base's chat template .* ignores `tools`"):
        check_tool_support(tok, TOOLS)
    tok.chat_template = None
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        check_tool_support(tok, TOOLS)
    check_tool_support(tokenizer(HERMES_TEMPLATE, HERMES_SPECIALS), TOOLS)
    check_tool_support(tokenizer(LLAMA3_TEMPLATE, LLAMA3_SPECIALS), TOOLS)


def test_a_template_that_rewrites_earlier_turns_is_refused() -> None:
    # Drops the reasoning of every assistant turn: the context could not grow turn by turn.
    rewriting = HERMES_TEMPLATE.replace("{{ message.content }}<|im_end|>",
                                        "{{ message.content.split('</think>')[-1] }}<|im_end|>")  # fmt: skip
    tok = tokenizer(rewriting, HERMES_SPECIALS)
    conversation = ToolConversation(tok, TOOLS, [{"role": "user", "content": "q"}])
    content = "<think> hmm </think>" + hermes('{"query": "a"}')
    with pytest.raises(ChatTemplateError, match="rewrites earlier turns"):
        conversation.add_turn(content + "<|im_end|>", content, ["Doc 1: a"])
