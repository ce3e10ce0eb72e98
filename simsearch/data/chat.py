"""A tool-calling conversation rendered by the tokenizer's own chat template, one turn at a time.

The policy's context is always exactly `apply_chat_template(messages, tools=…,
add_generation_prompt=True)` of the conversation so far: each assistant message holds the text
the policy generated, verbatim, and each search result goes back as a `tool` message. What the
template adds between one generation and the next (the end of the assistant turn, the tool
messages, the next assistant header) is the text a rollout appends and masks out of the loss.
"""

from __future__ import annotations

from typing import Any

from simsearch.errors import RecipeError


class ChatTemplateError(RecipeError):
    """The tokenizer's chat template cannot render the tool-call protocol."""


def template_name(tokenizer: Any) -> str:
    """The tokenizer's path and the first line of its template, to name it in errors."""
    template = getattr(tokenizer, "chat_template", None)
    first = str(template).strip().splitlines()[0][:60] if template else "(none)"
    return f"{getattr(tokenizer, 'name_or_path', '') or 'the tokenizer'}'s chat template ({first!r}…)"


def check_tool_support(tokenizer: Any, tools: list[dict[str, Any]]) -> None:
    """Raises `ChatTemplateError` unless the template renders `tools` and a `tool` message.

    A template ignores the tools when the prompt rendered with them equals the one without.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError(f"{template_name(tokenizer)}: the tokenizer has no chat template; "
                                "rollout.protocol=tool-call needs one with tool support (e.g. Qwen2.5's)")  # fmt: skip
    user = [{"role": "user", "content": "q"}]
    calling = [*user, {"role": "assistant", "content": "a"}, {"role": "tool", "content": "RESULT-7"}]
    try:
        with_tools = _render(tokenizer, user, tools, generation_prompt=True)
        without = _render(tokenizer, user, None, generation_prompt=True)
        tool_message = _render(tokenizer, calling, tools, generation_prompt=True)
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
        tools: The tools' JSON schemas (see `policy.toolcalls.search_tool_schema`).
        messages: The conversation before the first assistant turn (system and user).
    """

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]], messages: list[dict[str, Any]]) -> None:
        self.tokenizer = tokenizer
        self.tools = tools
        self.messages = list(messages)
        self.text = _render(tokenizer, self.messages, tools, generation_prompt=True)

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
        rendered = _render(self.tokenizer, self.messages, self.tools, generation_prompt=True)
        before = self.text + generated
        if not rendered.startswith(before):
            raise ChatTemplateError(
                f"{template_name(self.tokenizer)} does not render the conversation as the context plus the "
                f"generated turn (it rewrites earlier turns), so the policy's context cannot grow turn by turn"
            )
        self.text = rendered
        return rendered[len(before) :]


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
            *, generation_prompt: bool) -> str:  # fmt: skip
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt,
                                         tokenize=False)  # fmt: skip
    return str(text)
