"""Policy prompt templates: Search-R1 (base and chat), self-search, and the two baselines.

`SEARCH_R1_TEMPLATE` is the **compat** prompt of Search-R1, which ZeroSearch checkpoints were also
trained on; it is reproduced byte for byte, including the original's "as your want", because
a released checkpoint answers best to the exact text it was trained on.

Chat templates. Search-R1's and ZeroSearch's RL dataset (`verl/utils/dataset/rl_dataset.py:128-131`
in both repositories) sends the prompt, stored as one user message, through the tokenizer's chat
template whenever the tokenizer has one (`if self.tokenizer.chat_template:`), base models
included: a base model whose tokenizer ships a chat template was trained on chat-formatted
prompts. Without one it uses the bare text. Either way the text is tokenized without added special tokens
(`verl/utils/torch_functional.py:236`, `add_special_tokens=False`); their `infer.py:88` (Search-R1)
and `inference.py:112` (ZeroSearch) apply the same rule. `search-r1-auto` does exactly that
(**compat**). `search-r1-chat` always applies the chat template (and refuses a tokenizer without
one); `search-r1` never does and lets the tokenizer add its special tokens (a BOS where it has
one): simsearch's behaviour before `search-r1-auto`, kept for recipes and checkpoints that use
it. Departure kept in all three: Search-R1's data scripts append "?" to a question that lacks
one (`scripts/data_process/nq_search.py:62-63`); we insert the question as given.

`search-r1-brief` is our own one-sentence statement of the same protocol (tags, one query per
`<search>`, results in `<information>`, the answer in `<answer>`), for tiny models trained from
scratch (`simsearch quickstart`): they cannot read instructions, and the compat prompt's ~100
tokens would make up half of every sequence they are trained on.

The self-search (SSRL-style), direct-answer and RAG templates are our own wording. SSRL's prompt
is not reproduced: it is in none of SSRL's released code (its training rows carry it, in the
`TsinghuaC3I/SSRL` dataset, and its RL dataset always applies the chat template,
`verl/utils/dataset/rl_dataset.py:221`); ours asks for the same structure (`<think>`,
`<search>`, the policy's own `<information>`, `<answer>`), which is what SSRL's format reward
checks. Every template ends with
`Question: {question}` and a newline, so `load_qa` can recover the question from any prompt we
render, and every template asks for the answer inside `<answer>` tags so one extraction function
scores all of them.
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
    """Render the policy's prompt for one question.

    Args:
        question: The question, inserted as is.
        template: `search-r1` (compat text, never chat-templated), `search-r1-chat` (the same text
            through the tokenizer's chat template), `search-r1-auto` (compat: through the chat
            template exactly when the tokenizer has one, as Search-R1 and ZeroSearch do),
            `search-r1-brief` (the same protocol in one sentence, for tiny models),
            `self-search` (the policy writes its own search results), `direct` (answer without
            search) or `rag` (answer from `documents`).
        tokenizer: Required by the templates `uses_tokenizer` names and only accepted there; to
            send another template through a chat template, pass its text to `apply_chat_template`.
        documents: Required by `rag` and only accepted there, best first.

    Returns:
        The prompt text, ending where the policy's generation begins.

    Raises:
        ValueError: An unknown template, or a tokenizer / documents argument that is missing
            where required or given where unused.
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
    """The policy's prompt for one question as token ids, tokenized as the template's reference does.

    A template that may use the chat template (`uses_tokenizer`) is tokenized without added
    special tokens, chat-templated or not: a chat template writes its own (BOS included), and
    Search-R1 / ZeroSearch add none to the bare text either (module docstring). The other
    templates let the tokenizer add its special tokens.

    Args:
        question: The question, inserted as is.
        template: Any template but `rag`.
        tokenizer: The policy's tokenizer.

    Returns:
        The prompt's token ids.
    """
    if template == "rag":
        raise ValueError("template='rag' needs documents: render it with render_prompt(..., documents=...)")
    question = encodable(question)
    if not uses_tokenizer(template):
        return list(tokenizer.encode(render_prompt(question, template=template), add_special_tokens=True))
    text = render_prompt(question, template=template, tokenizer=tokenizer)
    return list(tokenizer.encode(text, add_special_tokens=False))
