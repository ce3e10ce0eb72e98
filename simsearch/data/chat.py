"""The tool-call protocol's texts (the search tool, the user message, a call) and its conversation.

The policy's context is always exactly `apply_chat_template(messages, tools=…,
add_generation_prompt=True)` of the conversation so far, grown one turn at a time: each assistant
message holds the text the policy generated, verbatim, and each search result goes back as a
`tool` message. What the template adds between one generation and the next (the end of the
assistant turn, the tool messages, the next assistant header) is appended and masked out of the loss.
"""

from __future__ import annotations

import json
from typing import Any

from simsearch.errors import RecipeError

SEARCH_TOOL = "search"
"""The search tool's name in every schema, call and parser."""


def search_tool_schema(*, top_k: bool = False, description: str = "") -> dict[str, Any]:
    """The search tool in the JSON-schema form chat templates take (`tools=[...]`).

    Args:
        top_k: Also offer an optional integer `top_k` argument (the number of results).
        description: The tool's description; empty = a short default.
    """
    properties: dict[str, Any] = {"query": {"type": "string", "description": "What to search for."}}
    if top_k:
        properties["top_k"] = {"type": "integer", "description": "How many results to return.", "minimum": 1}
    return {
        "type": "function",
        "function": {
            "name": SEARCH_TOOL,
            "description": description or "Search a corpus of passages and return the most relevant ones.",
            "parameters": {"type": "object", "properties": properties, "required": ["query"]},
        },
    }


TOOL_CALL_PROMPT = (
    "Answer the given question. You can call the search tool as many times as you want to find "
    "the facts you need. When you know the answer, give it inside <answer> and </answer>, without "
    "detailed illustrations, for example <answer> Beijing </answer>. Question: {question}"
)
"""The user message of the tool-call protocol (its tool is `search_tool_schema()`)."""

TOOL_CALL_BRIEF_PROMPT = (
    "Call the search tool, read its results, answer inside <answer> and </answer>. Question: {question}"
)
"""The same in one sentence, for tiny models: the user message when `rollout.template` is search-r1-brief."""


TOOL_CALL_SELF_SEARCH_PROMPT = (
    "Answer the question below, using your own knowledge as the search engine. Whenever you are missing a "
    "fact, call the search tool, and right after the call write the results it would return, as well as you "
    "can recall them, inside <tool_response> and </tool_response>. When you know enough, give only the final "
    "answer, a few words at most, inside <answer> and </answer>. Question: {question}"
)


def tool_call_messages(question: str, template: str) -> list[dict[str, str]]:
    """The conversation before the first assistant turn: the question as the user message."""
    prompts = {"search-r1-brief": TOOL_CALL_BRIEF_PROMPT, "self-search": TOOL_CALL_SELF_SEARCH_PROMPT}
    prompt = prompts.get(template, TOOL_CALL_PROMPT)
    return [{"role": "user", "content": prompt.format(question=question)}]


def write_call(query: str, tool_format: str) -> str:
    """The text a model writes to call the search tool with `query` in `tool_format` (what `parse_turn` reads)."""
    if tool_format == "hermes":
        return f"<tool_call>{json.dumps({'name': SEARCH_TOOL, 'arguments': {'query': query}})}</tool_call>"
    if tool_format == "llama3":
        return json.dumps({"name": SEARCH_TOOL, "parameters": {"query": query}})
    raise ValueError(f"tool_format={tool_format!r} is not one of hermes, llama3")


class ChatTemplateError(RecipeError):
    """The tokenizer's chat template cannot render the tool-call protocol."""


def template_name(tokenizer: Any) -> str:
    """The tokenizer's path and the first line of its template, to name it in errors."""
    template = getattr(tokenizer, "chat_template", None)
    first = str(template).strip().splitlines()[0][:60] if template else "(none)"
    return f"{getattr(tokenizer, 'name_or_path', '') or 'the tokenizer'}'s chat template ({first!r}…)"


def check_tool_support(
    tokenizer: Any, tools: list[dict[str, Any]], template_kwargs: dict[str, Any] | None = None
) -> None:
    """Raises `ChatTemplateError` unless the template renders `tools` and a `tool` message.

    A template ignores the tools when the prompt rendered with them equals the one without.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError(f"{template_name(tokenizer)}: the tokenizer has no chat template; "
                                "rollout.protocol=tool-call needs one with tool support (e.g. Qwen2.5's)")  # fmt: skip
    user = [{"role": "user", "content": "q"}]
    calling = [*user, {"role": "assistant", "content": "a"}, {"role": "tool", "content": "RESULT-7"}]
    try:
        with_tools = _render(tokenizer, user, tools, template_kwargs)
        without = _render(tokenizer, user, None, template_kwargs)
        tool_message = _render(tokenizer, calling, tools, template_kwargs)
    except Exception as err:  # a template raises whatever its author chose (jinja errors, exceptions)
        raise ChatTemplateError(f"{template_name(tokenizer)} cannot render a tool conversation: {err}") from err
    if with_tools == without:
        raise ChatTemplateError(f"{template_name(tokenizer)} ignores `tools`: it has no tool support; use a model "
                                "whose template has (Qwen2.5, Qwen3, Llama 3.1) or rollout.protocol=tags")  # fmt: skip
    if "RESULT-7" not in tool_message:
        raise ChatTemplateError(f"{template_name(tokenizer)} drops `tool` messages: it has no tool support")


class ToolConversation:
    """One question's conversation; `text` is always the template's rendering of it.

    Args:
        tokenizer: Any tokenizer with `apply_chat_template`.
        tools: The tools' JSON schemas (see `search_tool_schema`).
        messages: The conversation before the first assistant turn (system and user).
        template_kwargs: Extra arguments of the template (`rollout.chat_template_kwargs`).
    """

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]], messages: list[dict[str, Any]],
                 template_kwargs: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.tokenizer = tokenizer
        self.tools = tools
        self.messages = list(messages)
        self.template_kwargs = template_kwargs
        self.text = _render(tokenizer, self.messages, tools, template_kwargs)

    def add_turn(self, generated: str, content: str, results: list[str]) -> str:
        """Records one assistant turn and its tool results; returns the text the template adds after it.

        Args:
            generated: What the policy generated, its end-of-turn token included when it wrote one.
            content: The assistant message's content: `generated` less that token.
            results: One tool message per call, in the order of the calls.

        Raises:
            ChatTemplateError: The rendering of the longer conversation does not continue the
                rendered context with `generated` (the template rewrites earlier turns).
        """
        self.messages.append({"role": "assistant", "content": content})
        self.messages += [{"role": "tool", "content": result} for result in results]
        rendered = _render(self.tokenizer, self.messages, self.tools, self.template_kwargs)
        before = self.text + generated
        if not rendered.startswith(before):
            raise ChatTemplateError(
                f"{template_name(self.tokenizer)} does not render the conversation as the context plus the "
                f"generated turn (it rewrites earlier turns), so the policy's context cannot grow turn by turn"
            )
        self.text = rendered
        return rendered[len(before) :]


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
            template_kwargs: dict[str, Any] | None) -> str:  # fmt: skip
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False,
                                         **(template_kwargs or {}))  # fmt: skip
    return str(text)
