"""Policy prompt templates: Search-R1 (base and chat), self-search, and the two baselines.

`SEARCH_R1_TEMPLATE` is the **compat** prompt of Search-R1, which ZeroSearch checkpoints were also
trained on; it is reproduced byte for byte, including the original's "as your want", because
a released checkpoint answers best to the exact text it was trained on. Search-R1 sends the same
text through the tokenizer's chat template for instruct models; `search-r1-chat` does that.

`search-r1-brief` is our own one-sentence statement of the same protocol (tags, one query per
`<search>`, results in `<information>`, the answer in `<answer>`), for tiny models trained from
scratch (`simsearch quickstart`): they cannot read instructions, and the compat prompt's ~100
tokens would make up half of every sequence they are trained on.

The self-search (SSRL-style), direct-answer and RAG templates are our own wording. SSRL's prompt
is not reproduced: ours asks for the same structure (`<think>`, `<search>`, the policy's own
`<information>`, `<answer>`), which is what SSRL's format reward checks. Every template ends with
`Question: {question}` and a newline, so `load_qa` can recover the question from any prompt we
render, and every template asks for the answer inside `<answer>` tags so one extraction function
scores all of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from simsearch.retrieval.base import render_documents
from simsearch.types import Document

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TemplateName = Literal["search-r1", "search-r1-chat", "search-r1-brief", "self-search", "direct", "rag"]
TEMPLATE_NAMES: tuple[str, ...] = ("search-r1", "search-r1-chat", "search-r1-brief", "self-search", "direct", "rag")

# compat: Search-R1's prompt for base models (PeterGriffinJin/Search-R1), byte for byte.
SEARCH_R1_TEMPLATE = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new "
    "information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between "
    "<information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer "
    "inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)

SEARCH_R1_BRIEF_TEMPLATE = (
    "Search with <search> query </search>, read the <information> results, answer inside "
    "<answer> and </answer>. Question: {question}\n"
)

SELF_SEARCH_TEMPLATE = (
    "Answer the question below, using your own knowledge as the search engine. "
    "Begin by reasoning inside <think> and </think>. "
    "Whenever you are missing a fact, write a one-line search query inside <search> and "
    "</search>, and right after it write the results that search would return, as well as you "
    "can recall them, inside <information> and </information>. "
    "Reason about those results inside <think> and </think> before searching again or "
    "answering. "
    "When you know enough, give only the final answer, a few words at most, inside <answer> and "
    "</answer>, for example <answer> Paris </answer>. Question: {question}\n"
)

DIRECT_TEMPLATE = (
    "Answer the question below from your own knowledge, without searching. "
    "Give only the final answer, a few words at most, inside <answer> and </answer>, "
    "for example <answer> Paris </answer>. Question: {question}\n"
)

RAG_TEMPLATE = (
    "Answer the question below using the documents that follow it. "
    "Give only the final answer, a few words at most, inside <answer> and </answer>, "
    "for example <answer> Paris </answer>.\n\n"
    "Documents:\n{documents}\n\n"
    "Question: {question}\n"
)


def apply_chat_template(text: str, tokenizer: PreTrainedTokenizerBase) -> str:
    """Send a prompt as one user message through the tokenizer's chat template.

    This is how Search-R1 prompts instruct models: no system message, the template's generation
    prompt appended, the result kept as text (the rollout tokenizes it).

    Args:
        text: The prompt, e.g. from `render_prompt(..., template="search-r1")`.
        tokenizer: A Hugging Face tokenizer with a `chat_template`.

    Returns:
        The chat-formatted prompt, ending where the assistant's reply begins.

    Raises:
        ValueError: The tokenizer has no chat template.
    """
    if not tokenizer.chat_template:
        raise ValueError(
            f"tokenizer {tokenizer.name_or_path!r} has no chat_template: chat prompts need an "
            "instruct model's tokenizer; use template='search-r1' for base models"
        )
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return str(rendered)


def render_prompt(
    question: str,
    *,
    template: TemplateName,
    tokenizer: PreTrainedTokenizerBase | None = None,
    documents: list[Document] | None = None,
) -> str:
    """Render the policy's prompt for one question.

    Args:
        question: The question, inserted as is.
        template: `search-r1` (compat, base models), `search-r1-chat` (the same text through
            the tokenizer's chat template), `search-r1-brief` (the same protocol in one
            sentence, for tiny models), `self-search` (the policy writes its own search
            results), `direct` (answer without search) or `rag` (answer from `documents`).
        tokenizer: Required by `search-r1-chat` and only accepted there; to send another template
            through a chat template, pass its text to `apply_chat_template`.
        documents: Required by `rag` and only accepted there, best first.

    Returns:
        The prompt text, ending where the policy's generation begins.

    Raises:
        ValueError: An unknown template, or a tokenizer / documents argument that is missing
            where required or given where unused.
    """
    if template not in TEMPLATE_NAMES:
        raise ValueError(f"template={template!r} is not one of {', '.join(TEMPLATE_NAMES)}")
    if template == "search-r1-chat" and tokenizer is None:
        raise ValueError("template='search-r1-chat' needs the policy's tokenizer (tokenizer=...)")
    if template != "search-r1-chat" and tokenizer is not None:
        raise ValueError(
            f"template={template!r} does not use a tokenizer; pass tokenizer only with "
            "'search-r1-chat', or send the rendered text through apply_chat_template"
        )
    if template == "rag" and documents is None:
        raise ValueError("template='rag' needs the retrieved documents (documents=[...])")
    if template != "rag" and documents is not None:
        raise ValueError(f"template={template!r} does not show documents; only 'rag' takes documents")

    if template == "search-r1":
        return SEARCH_R1_TEMPLATE.format(question=question)
    if template == "search-r1-chat":
        assert tokenizer is not None  # checked above; narrows the type
        return apply_chat_template(SEARCH_R1_TEMPLATE.format(question=question), tokenizer)
    if template == "search-r1-brief":
        return SEARCH_R1_BRIEF_TEMPLATE.format(question=question)
    if template == "self-search":
        return SELF_SEARCH_TEMPLATE.format(question=question)
    if template == "direct":
        return DIRECT_TEMPLATE.format(question=question)
    assert documents is not None  # template == "rag", checked above
    return RAG_TEMPLATE.format(question=question, documents=render_documents(documents).rstrip("\n"))
