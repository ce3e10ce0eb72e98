"""What the simulator LLM is asked: useful / noisy prompt templates, in five presets.

A preset turns one search request into the text the simulator continues; the simulator answers
with numbered documents (`format_response`), which `engine.parse_documents` reads back. Presets:
`zerosearch` (ZeroSearch's SFT prompt, byte for byte; send it through `as_chat`),
`zerosearch-prompt` (for an instruct model without fine-tuning), `simsearch` (the default),
`simsearch-brief` (fields only, for a simulator fine-tuned on it) and `custom` (two templates
with the fields `{query}`, `{question}`, `{answers}` (joined by "; ") and `{top_k}`).
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from simsearch.data.rendering import RenderStyle, render_documents
from simsearch.types import Document

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Preset = Literal["simsearch", "simsearch-brief", "zerosearch", "zerosearch-prompt", "custom"]
CUSTOM_FIELDS: tuple[str, ...] = ("query", "question", "answers", "top_k")

# compat: ZeroSearch's SFT-mode simulator prompt (Alibaba-NLP/ZeroSearch), useful variant. The
# noisy variant is derived by `_zerosearch` with the three substitutions, never retyped.
ZEROSEARCH_USEFUL_TEMPLATE = (
    "You are the Google search engine.\n"
    "Given a query, you need to generate five useful documents for the query.\n"
    "\n"
    'The user is trying to answer the question: "{problem}" whose answer is {ground_truth}.\n'
    "Each document should contain about 30 words, and these documents should contain useful "
    "information.\n"
    "\n"
    "Query: {query}\n"
    "Useful Output:\n"
)

_SIMSEARCH_HEAD = (
    "Act as a search engine. Write {top_k} search results for the query, one per line, each as "
    '"Doc i(Title: title) text" with about 30 words, numbered from Doc 1 to Doc {top_k}.\n'
)
_SIMSEARCH_QUESTION = "Question: {question}\n"
_SIMSEARCH_ANSWER = "Answer: {answers}\n"
_SIMSEARCH_USEFUL_RULE = (
    "Write what a real search for this query returns: state the answer only in results this query would find.\n"
)
_SIMSEARCH_NOISY_RULE = "Write results that look related to the query but do not contain or imply the answer.\n"
_SIMSEARCH_TAIL = "Query: {query}\nResults:\n"
_BRIEF_NOISY_TAIL = "Query: {query}\nNoisy results:\n"

# zerosearch-prompt: our wording and our one-shot demonstration (a query about Vienna's river).
_PROMPT_USEFUL_HEAD = (
    "You play a web search engine. For the query at the end, write {top_k} search results that "
    "help the user answer their question. Each result is one line of about 30 words in the "
    'form "Doc i(Title: title) text".\n\n'
)
_PROMPT_NOISY_HEAD = (
    "You play a web search engine. For the query at the end, write {top_k} search results that "
    "look related to the query but do not help answer it: near-misses, other topics sharing its "
    'words, vague pages. Each result is one line of about 30 words in the form "Doc i(Title: '
    'title) text".\n\n'
)
_DEMO_QUERY = "which river flows through vienna"
_DEMO_QUESTION = "Which river flows through Vienna?"
_DEMO_ANSWER = "Danube"
_DEMO_USEFUL = [
    Document(
        "Vienna",
        "Vienna, the capital of Austria, lies on the Danube, which crosses the city "
        "from north-west to south-east and once carried most of its trade.",
    ),
    Document(
        "Danube",
        "The Danube rises in Germany's Black Forest and flows through four capitals, "
        "Vienna among them, before reaching the Black Sea in Romania.",
    ),
    Document(
        "Donauinsel",
        "The Donauinsel is a long artificial island in Vienna, built between the "
        "Danube and the New Danube channel to protect the city from floods.",
    ),
    Document(
        "Danube Canal",
        "The Danube Canal is a former arm of the Danube that runs past Vienna's "
        "old town; its banks are lined with bars and murals.",
    ),
    Document(
        "Vienna geography",
        "Vienna sits where the Alps meet the Pannonian plain; the Danube and "
        "the smaller Wien river flow through the city.",
    ),
]
_DEMO_NOISY = [
    Document(
        "Vienna coffee houses",
        "Vienna's coffee houses date from the 17th century; guests sit for hours over a single cup and a newspaper.",
    ),
    Document(
        "Vienna State Opera", "The Vienna State Opera opened in 1869 and stages more than fifty operas each season."
    ),
    Document(
        "River cruise",
        "A river cruise is a holiday on a boat that stops at a different town "
        "each day; cabins range from small to luxurious.",
    ),
    Document(
        "Rivers of Europe",
        "Europe's rivers have shaped its borders and trade routes; many cities grew up at fords and river crossings.",
    ),
    Document(
        "Vienna, Virginia",
        "Vienna is a town in Fairfax County, Virginia, known for its quiet streets and the W&OD trail.",
    ),
]


@dataclass(frozen=True)
class PromptTemplates:
    """The two templates of the `custom` preset (fields: {query} {question} {answers} {top_k})."""

    useful: str
    noisy: str


def check_templates(templates: PromptTemplates) -> None:
    """Rejects custom templates `render` could not fill (empty, bad `str.format` syntax, unknown field), naming it."""
    for name, template in (("useful", templates.useful), ("noisy", templates.noisy)):
        if not template.strip():
            raise ValueError(f"the custom {name} template is empty; write one with a {{query}} field")
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
        except ValueError as err:
            raise ValueError(
                f"the custom {name} template is not valid format syntax ({err}); write literal braces as {{{{ and }}}}"
            ) from None
        unknown = sorted(fields - set(CUSTOM_FIELDS))
        if unknown:
            raise ValueError(
                f"the custom {name} template uses the field {{{unknown[0]}}}; the fields are "
                + ", ".join(f"{{{f}}}" for f in CUSTOM_FIELDS)
            )


def format_response(documents: list[Document], style: RenderStyle = "search-r1") -> str:
    """Documents numbered from 1 as the simulator writes them (`style`: a `render_documents` style).

    Whitespace runs become single spaces, so `parse_documents` reads the same documents back.
    """
    flat = [Document(" ".join(d.title.split()), " ".join(d.text.split())) for d in documents]
    return render_documents(flat, style).rstrip("\n")


def render(
    preset: Preset,
    *,
    query: str,
    question: str | None,
    golden_answers: list[str],
    noisy: bool,
    top_k: int,
    templates: PromptTemplates | None = None,
) -> str:
    """Renders the simulator prompt for one request (plain text, before any chat template).

    Args:
        question: The question the policy is answering, or None when unknown.
        noisy: Ask for noisy documents instead of useful ones.
        templates: The two templates; required by, and only accepted with, "custom".

    Raises:
        ValueError: Unknown preset; `templates` missing or misplaced; a zerosearch prompt without
            the question or gold answer it needs.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r} is not one of {', '.join(PRESETS)}")
    if PRESETS[preset].needs_templates != (templates is not None):
        raise ValueError("templates=PromptTemplates(...) is required by preset='custom' and only by it")
    if top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1")
    return PRESETS[preset].render(_Ask(query, question, golden_answers, noisy, top_k, templates))


@dataclass(frozen=True)
class _Ask:
    query: str
    question: str | None
    golden_answers: list[str]
    noisy: bool
    top_k: int
    templates: PromptTemplates | None

    @property
    def answers(self) -> str:
        return "; ".join(self.golden_answers)


def _simsearch_context(ask: _Ask) -> str:
    context = _SIMSEARCH_QUESTION.format(question=ask.question) if ask.question else ""
    return context + (_SIMSEARCH_ANSWER.format(answers=ask.answers) if ask.answers else "")


def _simsearch(ask: _Ask) -> str:
    head = _SIMSEARCH_HEAD.format(top_k=ask.top_k)
    rule = _SIMSEARCH_NOISY_RULE if ask.noisy else _SIMSEARCH_USEFUL_RULE
    return head + _simsearch_context(ask) + rule + _SIMSEARCH_TAIL.format(query=ask.query)


def _simsearch_brief(ask: _Ask) -> str:
    return _simsearch_context(ask) + (_BRIEF_NOISY_TAIL if ask.noisy else _SIMSEARCH_TAIL).format(query=ask.query)


def _custom(ask: _Ask) -> str:
    assert ask.templates is not None  # render checks it
    check_templates(ask.templates)
    template = ask.templates.noisy if ask.noisy else ask.templates.useful
    return template.format(query=ask.query, question=ask.question or "", answers=ask.answers, top_k=ask.top_k)


def _zerosearch(ask: _Ask) -> str:
    query, question, golden_answers, noisy = ask.query, ask.question, ask.golden_answers, ask.noisy
    if not question or not golden_answers:
        raise ValueError(
            "preset='zerosearch' needs the request's question and at least one gold answer (the "
            f"released simulators were trained with both); query {query!r} came without them. "
            "Pass question/golden_answers in the SearchRequest, or use preset='simsearch'"
        )
    template = ZEROSEARCH_USEFUL_TEMPLATE
    if noisy:
        template = (
            template.replace("five useful documents", "five noisy documents")
            .replace("contain useful information", "contain noisy information")
            .replace("Useful Output:", "Noisy Output:")
        )
    # Built by concatenation, not str.format, so braces inside a query or answer stay literal.
    head, rest = template.split("{problem}")
    middle, rest = rest.split("{ground_truth}")
    tail_head, tail = rest.split("{query}")
    return head + question + middle + golden_answers[0] + tail_head + query + tail


def _zerosearch_prompt(ask: _Ask) -> str:
    query, question, answers, noisy, top_k = ask.query, ask.question, ask.answers, ask.noisy, ask.top_k
    shown = min(top_k, len(_DEMO_USEFUL))
    if noisy:
        demo = format_response(_DEMO_NOISY[:shown])
        return (
            _PROMPT_NOISY_HEAD.format(top_k=top_k)
            + f"Example\nQuery: {_DEMO_QUERY}\nResults:\n{demo}\n\n"
            + f"Now the real query.\nQuery: {query}\nResults:\n"
        )
    if not question or not answers:
        raise ValueError(
            "preset='zerosearch-prompt' useful prompts need the request's question and a gold "
            f"answer; query {query!r} came without them. Pass question/golden_answers in the "
            "SearchRequest, or use preset='simsearch'"
        )
    demo = format_response(_DEMO_USEFUL[:shown])
    return (
        _PROMPT_USEFUL_HEAD.format(top_k=top_k)
        + f"Example\nQuestion: {_DEMO_QUESTION}\nAnswer: {_DEMO_ANSWER}\nQuery: {_DEMO_QUERY}\n"
        + f"Results:\n{demo}\n\n"
        + f"Now the real query.\nQuestion: {question}\nAnswer: {answers}\nQuery: {query}\nResults:\n"
    )


@dataclass(frozen=True)
class PresetSpec:
    """How a preset renders its prompts, and what the recipe checks ask of it."""

    render: Callable[[_Ask], str]
    always_shows_context: bool = False
    """Its prompts always carry the question and the answer (show_question/show_answer cannot be
    turned off): ZeroSearch was only ever trained and prompted with both."""
    any_response_style: bool = False
    """Its prompts ask for no response format, so its SFT responses may take any rendering; the
    others' instructions ask for `Doc i(Title: t) text` lines."""
    needs_templates: bool = False
    """It renders the recipe's own `PromptTemplates`."""
    needs_chat: bool = False
    """It is sent through the simulator's chat template, as ZeroSearch sends it."""


PRESETS: dict[str, PresetSpec] = {
    "simsearch": PresetSpec(_simsearch),
    "simsearch-brief": PresetSpec(_simsearch_brief, any_response_style=True),
    "zerosearch": PresetSpec(_zerosearch, always_shows_context=True, needs_chat=True),
    "zerosearch-prompt": PresetSpec(_zerosearch_prompt, always_shows_context=True),
    "custom": PresetSpec(_custom, needs_templates=True),
}
"""The simulator prompt presets (module docstring), in the order the CLI and errors list them."""


def chat_messages(prompt: str) -> list[dict[str, str]]:
    """ZeroSearch's conversation for the simulator: an empty system message, then the prompt."""
    return [{"role": "system", "content": ""}, {"role": "user", "content": prompt}]


def as_chat(prompt: str, tokenizer: PreTrainedTokenizerBase) -> str:
    """`chat_messages(prompt)` through the tokenizer's chat template, with the generation prompt.

    Tokenize the result without adding special tokens. Raises `ValueError` without a chat template.
    """
    if not tokenizer.chat_template:
        raise ValueError(
            f"tokenizer {tokenizer.name_or_path!r} has no chat_template; use chat=False for a base "
            "model, or a tokenizer with a chat template (an instruct model's, or a tiny model's)"
        )
    rendered = tokenizer.apply_chat_template(chat_messages(prompt), add_generation_prompt=True, tokenize=False)
    return str(rendered)
