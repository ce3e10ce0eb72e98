"""The search tool as a chat-template tool call: its JSON schema, and one parser per call format.

A turn in the `tool-call` protocol is an assistant message. It searches when it holds one or more
calls of the `search` tool, in the format the model was taught (`TOOL_CALL_FORMATS`), and answers
when it holds `<answer>…</answer>` instead. Text inside `<think>…</think>` is reasoning: a call or
an answer written there is not acted on. A call that cannot be read (bad JSON, another tool's
name, no `query`) is an invalid action with its reason; it is never executed.

`ToolCallProtocol` runs this in the agent loop (`policy.protocol`): the prompt is the chat
template's rendering of the question with the search tool offered (`data.chat`), each turn is
generated up to the end-of-turn token and read by `parse_turn`, every call of the turn goes in the
turn's one `search` call, and the text the template adds after a turn (the end of the assistant
message, one tool message per call, the next assistant header) is tokenized and appended with mask
0. An unreadable turn gets `TOOL_CALL_CORRECTION` as a tool message (mask 0), so the context stays
the template's rendering of the conversation.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from simsearch.data.chat import (
    SEARCH_TOOL,
    ToolConversation,
    check_tool_support,
    search_tool_schema,
    tool_call_messages,
)
from simsearch.data.rendering import RenderStyle, encodable, render_documents
from simsearch.eval.metrics import ANSWER_CLOSE, ANSWER_OPEN
from simsearch.types import Completion, Document, QAExample, Trajectory, Turn

if TYPE_CHECKING:
    from simsearch.policy.protocol import AgentProtocol, RolloutChoices, TokenCache

TOOL_CALL_CORRECTION = (
    "Your reply could not be used ({reasons}). To search, call the search tool; to answer, "
    "put the answer between <answer> and </answer>."
)
"""The tool message an unreadable tool-call turn gets (the tag protocol's INVALID_ACTION_MESSAGE)."""

THINK_BLOCK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
# What a self-search policy writes its own results in, right after its call (SSRL's <information>).
TOOL_RESPONSE_TAGS = ("<tool_response>", "</tool_response>")
_RESPONSE_BLOCK = re.compile(r"<tool_response>.*?(</tool_response>|$)", re.DOTALL)


@dataclass(frozen=True)
class SearchCall:
    """One readable call of the search tool."""

    query: str
    top_k: int | None = None


@dataclass(frozen=True)
class ToolTurn:
    """What one assistant message asks for.

    `kind` is "search" when at least one call is readable (`calls`, in order), "answer" when the
    message answers (`answer`, stripped) and holds no readable call after its answer, else
    "invalid". `reasons` gives a reason for every call that could not be read, in any kind of turn.
    """

    kind: Literal["search", "answer", "invalid"]
    calls: tuple[SearchCall, ...] = ()
    answer: str = ""
    reasons: tuple[str, ...] = field(default_factory=tuple)


def parse_hermes(text: str) -> tuple[list[tuple[int, Any]], list[str]]:
    """Hermes calls (Qwen2.5, Qwen3): `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, any number.

    Returns the (end offset, decoded JSON) of every closed block outside `<think>`, and the
    reasons of the blocks that could not be decoded (an unclosed block included).
    """
    visible = _blank_think(text)
    found: list[tuple[int, Any]] = []
    errors: list[str] = []
    position = 0
    while (start := visible.find("<tool_call>", position)) != -1:
        close = visible.find("</tool_call>", start)
        if close == -1:
            errors.append("a <tool_call> is not closed")
            break
        body = visible[start + len("<tool_call>") : close]
        position = close + len("</tool_call>")
        try:
            found.append((position, json.loads(body)))
        except json.JSONDecodeError as err:
            errors.append(f"tool call is not valid JSON ({err.msg})")
    return found, errors


def parse_llama3(text: str) -> tuple[list[tuple[int, Any]], list[str]]:
    """Llama 3 JSON calls: `{"name": …, "parameters": {…}}`, several joined by `;` or new lines.

    A leading `<|python_tag|>` is ignored. Returns the (end offset, decoded JSON) of each object
    found outside `<think>` and `<answer>` blocks, and the reasons of the ones that could not be
    decoded.
    """
    visible = _blank_think(_blank_answers(text.replace("<|python_tag|>", " " * len("<|python_tag|>"))))
    decoder = json.JSONDecoder()
    found: list[tuple[int, Any]] = []
    errors: list[str] = []
    position = 0
    while (start := visible.find("{", position)) != -1:
        try:
            value, end = decoder.raw_decode(visible, start)
        except json.JSONDecodeError as err:
            errors.append(f"tool call is not valid JSON ({err.msg})")
            break
        found.append((end, value))
        position = end
    return found, errors


TOOL_CALL_FORMATS: dict[str, Callable[[str], tuple[list[tuple[int, Any]], list[str]]]] = {
    "hermes": parse_hermes,
    "llama3": parse_llama3,
}
"""Every call format by its recipe name (`rollout.tool_format`)."""

_ARGUMENT_KEYS = {"hermes": ("arguments", "parameters"), "llama3": ("parameters", "arguments")}


def parse_turn(text: str, tool_format: str, *, allow_top_k: bool = False) -> ToolTurn:
    """Reads one assistant message of the tool-call protocol.

    Of a readable call and an answer, the one that ends last in the message decides the turn,
    as the last closing tag does in the tag protocol.

    Raises:
        KeyError: `tool_format` is not a name in `TOOL_CALL_FORMATS`.
    """
    raw, errors = TOOL_CALL_FORMATS[tool_format](text)
    calls: list[SearchCall] = []
    last_call_end = -1
    for end, value in raw:
        call = _search_call(value, _ARGUMENT_KEYS[tool_format], allow_top_k)
        if isinstance(call, str):
            errors.append(call)
        else:
            calls.append(call)
            last_call_end = end
    answer = _last_answer(_blank_think(text))
    if answer is not None and answer[0] > last_call_end:
        return ToolTurn("answer", answer=answer[1], reasons=tuple(errors))
    if calls:
        return ToolTurn("search", calls=tuple(calls), reasons=tuple(errors))
    if not errors and TOOL_CALL_FORMATS[tool_format](_think_only(text))[0]:
        errors.append("a tool call inside <think> is not executed")
    if not errors:
        errors.append("neither a tool call nor an answer")
    return ToolTurn("invalid", reasons=tuple(errors))


def parse_self_search_turn(text: str, tool_format: str) -> tuple[ToolTurn, list[str]]:
    """`parse_turn` outside the results a self-search message wrote (a last call is invalid); its calls' queries."""
    visible = _RESPONSE_BLOCK.sub(lambda match: " " * len(match.group(0)), text)
    turn = parse_turn(visible, tool_format)
    raw, _ = TOOL_CALL_FORMATS[tool_format](visible)
    calls = [
        c for _, value in raw if isinstance(c := _search_call(value, _ARGUMENT_KEYS[tool_format], False), SearchCall)
    ]
    if turn.kind == "search":
        turn = ToolTurn("invalid", reasons=(*turn.reasons, "a call with no answer after its own results"))
    return turn, [call.query for call in calls]


def _search_call(value: Any, argument_keys: tuple[str, ...], allow_top_k: bool) -> SearchCall | str:
    """The call in one decoded JSON object, or the reason it is not a search call."""
    if not isinstance(value, dict) or "name" not in value:
        return "tool call has no name"
    if value["name"] != SEARCH_TOOL:
        return f"unknown tool {str(value['name'])[:40]!r} (the only tool is {SEARCH_TOOL!r})"
    arguments = next((value[key] for key in argument_keys if key in value), None)
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return "tool call arguments are not valid JSON"
    if not isinstance(arguments, dict):
        return "tool call has no arguments object"
    query = arguments.get("query")
    if not isinstance(query, str) or not query.strip():
        return "search call is missing its 'query' argument (a non-empty string)"
    top_k = arguments.get("top_k")
    if top_k is None or not allow_top_k:
        return SearchCall(query.strip())
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        return "search call's 'top_k' must be an integer >= 1"
    return SearchCall(query.strip(), top_k)


def _last_answer(text: str) -> tuple[int, str] | None:
    """(end offset, stripped content) of the last complete answer block, or None."""
    close = text.rfind(ANSWER_CLOSE)
    if close == -1:
        return None
    start = text.rfind(ANSWER_OPEN, 0, close)
    if start == -1:
        return None
    return close + len(ANSWER_CLOSE), text[start + len(ANSWER_OPEN) : close].strip()


def _blank_think(text: str) -> str:
    """`text` with every `<think>` block (an unclosed one to the end) blanked out, offsets kept."""
    return THINK_BLOCK.sub(lambda match: " " * len(match.group(0)), text)


def _think_only(text: str) -> str:
    """The content of `text`'s `<think>` blocks, each on its own line."""
    return "\n".join(re.sub(r"^<think>|</think>$", "", match.group(0)) for match in THINK_BLOCK.finditer(text))


def _blank_answers(text: str) -> str:
    pattern = re.escape(ANSWER_OPEN) + ".*?" + re.escape(ANSWER_CLOSE)
    return re.sub(pattern, lambda match: " " * len(match.group(0)), text, flags=re.DOTALL)


@dataclass
class ToolChat:
    """One trajectory's conversation, and its last turn's (generated text, message content)."""

    conversation: ToolConversation
    pending: tuple[str, str] = ("", "")


class ToolCallProtocol:
    """The search tool called in the chat template's own format (`rollout.protocol=tool-call`)."""

    stops: tuple[str, ...] = ()  # a turn ends at the model's end-of-turn token
    uses_engine = True
    own_stops: tuple[str, ...] = ()
    """A self-searching policy's stops (the same: its own results are in its message)."""
    own_results: tuple[str, str] = TOOL_RESPONSE_TAGS
    """The tags a self-searching policy writes its own results in."""

    def __init__(self, cfg: RolloutChoices) -> None:
        self.template = cfg.template
        self.tool_format = cfg.tool_format
        self.template_kwargs = cfg.chat_template_kwargs

    def check(self, tokenizer: Any) -> None:
        check_tool_support(tokenizer, [search_tool_schema()], self.template_kwargs)

    def for_question(self, rng: random.Random | None) -> AgentProtocol:
        return self

    def prompt(self, tokens: TokenCache, example: QAExample) -> list[int]:
        return tokens.encode(self.start(tokens, example).conversation.text)

    def start(self, tokens: TokenCache, example: QAExample) -> ToolChat:
        """A fresh conversation: the question as the user message, the search tool offered."""
        messages = tool_call_messages(example.question, self.template)
        return ToolChat(ToolConversation(tokens.tokenizer, [search_tool_schema()], messages, self.template_kwargs))

    def turn_text(self, tokens: TokenCache, state: ToolChat, ids: list[int], completion: Completion, cut: bool) -> str:
        """The assistant message's content; records the turn as pending."""
        # The context's text grows by exactly the decoded ids; the message content is that less the
        # end-of-turn token the template writes itself.
        generated = tokens.decode(ids)
        eos = tokens.tokenizer.eos_token
        content = generated[: -len(eos)] if eos and generated.endswith(eos) else generated
        state.pending = (generated, content)
        return content

    def parse(self, text: str) -> Turn:
        return _turn(text, parse_turn(text, self.tool_format), [])

    def parse_own(self, text: str) -> Turn:
        """A self-searching message: read outside the results it wrote; its own calls' queries."""
        return _turn(text, *parse_self_search_turn(text, self.tool_format))

    def read(
        self, tokens: TokenCache, state: ToolChat, ids: list[int], completion: Completion, cut: bool
    ) -> tuple[Turn, list[int]]:
        return self.parse(self.turn_text(tokens, state, ids, completion, cut)), [1] * len(ids)

    def correction(self, tokens: TokenCache, state: ToolChat, turn: Turn) -> list[int]:
        correction = TOOL_CALL_CORRECTION.format(reasons="; ".join(turn.call_reasons))
        return tokens.encode(state.conversation.add_turn(*state.pending, [correction]))

    def queries(self, turn: Turn) -> list[str]:
        return turn.call_queries

    def observe(
        self, tokens: TokenCache, searches: list[tuple[ToolChat, Turn, list[list[Document]]]], rendering: RenderStyle
    ) -> list[list[int]]:
        """One tool message per call, each result cut to `max_obs_tokens`; the template's text after the turn."""
        inserted = []
        for state, turn, results in searches:
            turn.call_documents = [list(documents) for documents in results]
            messages = [_cut_text(tokens, render_documents(documents, rendering)) for documents in results]
            inserted.append(tokens.encode(state.conversation.add_turn(*state.pending, messages)))
        return inserted

    def answer(self, turns: list[Turn], text: str) -> str | None:
        """The answer of the final assistant message."""
        last = turns[-1] if turns else None
        if last is None or last.action != "answer":
            return None
        return parse_turn(last.text, self.tool_format).answer

    def metrics(self, trajectories: list[Trajectory]) -> dict[str, float]:
        errors = sum(len(turn.call_reasons) for t in trajectories for turn in t.turns)
        return {"rollout/call_errors": errors / len(trajectories)}


def _turn(text: str, parsed: ToolTurn, own: list[str]) -> Turn:
    return Turn(
        text=text,
        action=parsed.kind,
        call_queries=[call.query for call in parsed.calls],
        call_reasons=list(parsed.reasons),
        self_queries=own,
    )


def _cut_text(tokens: TokenCache, text: str) -> str:
    """`text` cut to its first `max_obs_tokens` tokens (a tool message's result)."""
    ids = tokens.encode(text)
    return encodable(text) if len(ids) <= tokens.max_obs_tokens else tokens.decode(ids[: tokens.max_obs_tokens])
