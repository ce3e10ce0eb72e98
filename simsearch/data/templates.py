"""Policy prompt templates: Search-R1 (base and chat), self-search, and the two baselines.

- `search-r1`: Search-R1's prompt byte for byte (**compat**), never chat-templated; the
  tokenizer adds its special tokens.
- `search-r1-chat`: the same text, always through the tokenizer's chat template.
- `search-r1-auto` (**compat**): through the chat template exactly when the tokenizer has one,
  tokenized without added special tokens.
- `search-r1-brief`: the same protocol in one sentence, for tiny models.
- `self-search`, `direct`, `rag`: our own wording.

The question is inserted as given. Every template ends with `Question: {question}` and a
newline (so `load_qa` can recover the question) and asks for the answer in `<answer>` tags.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from simsearch.data.rendering import encodable, render_documents
from simsearch.types import Document

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TemplateName = str
"""A name in `TEMPLATES`."""
ChatUse = Literal["never", "always", "if-available"]
"""When a template goes through the tokenizer's chat template (see the module docstring)."""

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


TEMPLATES: dict[str, tuple[str, ChatUse]] = {
    "search-r1": (SEARCH_R1_TEMPLATE, "never"),
    "search-r1-chat": (SEARCH_R1_TEMPLATE, "always"),
    "search-r1-auto": (SEARCH_R1_TEMPLATE, "if-available"),
    "search-r1-brief": (SEARCH_R1_BRIEF_TEMPLATE, "never"),
    "self-search": (SELF_SEARCH_TEMPLATE, "never"),
    "direct": (DIRECT_TEMPLATE, "never"),
    "rag": (RAG_TEMPLATE, "never"),
}
"""Every policy template: name -> (text, when the chat template is applied)."""
TEMPLATE_NAMES: tuple[str, ...] = tuple(TEMPLATES)


def uses_tokenizer(template: str) -> bool:
    """Whether rendering `template` needs the policy's tokenizer (it may apply a chat template)."""
    return TEMPLATES[template][1] != "never"


def apply_chat_template(text: str, tokenizer: PreTrainedTokenizerBase) -> str:
    """The prompt as one user message through the tokenizer's chat template (no system message,
    generation prompt appended), as text ending where the assistant's reply begins.

    Raises:
        ValueError: The tokenizer has no chat template.
    """
    if not tokenizer.chat_template:
        raise ValueError(
            f"tokenizer {tokenizer.name_or_path!r} has no chat_template: chat prompts need an "
            "instruct model's tokenizer; use template='search-r1-auto' (chat template only when the "
            "tokenizer has one) or 'search-r1'"
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
    """Render the policy's prompt for one question, ending where the policy's generation begins.

    Args:
        question: The question, inserted as is.
        template: A name of the templates (module docstring).
        tokenizer: Required by the templates `uses_tokenizer` names and only accepted there.
        documents: Required by `rag` and only accepted there, best first.

    Raises:
        ValueError: An unknown template, or a tokenizer / documents argument that is missing where
            required or given where unused.
    """
    if template not in TEMPLATES:
        raise ValueError(f"template={template!r} is not one of {', '.join(TEMPLATE_NAMES)}")
    text, chat = TEMPLATES[template]
    if chat != "never" and tokenizer is None:
        raise ValueError(f"template={template!r} needs the policy's tokenizer (tokenizer=...)")
    if chat == "never" and tokenizer is not None:
        raise ValueError(
            f"template={template!r} does not use a tokenizer; pass tokenizer only with "
            f"{', '.join(t for t in TEMPLATES if uses_tokenizer(t))}, or send the rendered text "
            "through apply_chat_template"
        )
    if template == "rag" and documents is None:
        raise ValueError("template='rag' needs the retrieved documents (documents=[...])")
    if template != "rag" and documents is not None:
        raise ValueError(f"template={template!r} does not show documents; only 'rag' takes documents")

    if documents is not None:
        return text.format(question=question, documents=render_documents(documents).rstrip("\n"))
    prompt = text.format(question=question)
    if tokenizer is not None and (chat == "always" or tokenizer.chat_template):
        return apply_chat_template(prompt, tokenizer)
    return prompt


def encode_prompt(question: str, *, template: TemplateName, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The prompt's token ids for one question (any template but `rag`), tokenized as the template's
    reference does: without added special tokens for the `uses_tokenizer` templates, with the
    tokenizer's special tokens otherwise.
    """
    if template == "rag":
        raise ValueError("template='rag' needs documents: render it with render_prompt(..., documents=...)")
    question = encodable(question)
    if not uses_tokenizer(template):
        return list(tokenizer.encode(render_prompt(question, template=template), add_special_tokens=True))
    text = render_prompt(question, template=template, tokenizer=tokenizer)
    return list(tokenizer.encode(text, add_special_tokens=False))
