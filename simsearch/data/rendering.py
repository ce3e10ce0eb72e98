"""How the documents a search engine returns are shown to the policy.

Rendering is split in two steps because the rollout needs them apart: `render_documents` turns
documents into the text block, `wrap_information` turns any block into the observation appended
to the trajectory (`\\n\\n<information>{block}</information>\\n\\n`). The rollout wraps text that
does not come from `Document`s too (an empty result, an engine error, the self-search mode that
swaps the policy's own information for real results), and it needs to know where the information
tokens start and end for the loss mask.

What the reference policies read (all **compat**, byte for byte, and all wrapped the same way):

- "search-r1": Search-R1's rendering of its retrieval server's results
  (`search_r1/llm_agent/generation.py:460`, `_passages2string`, wrapped at `:391`). ZeroSearch
  keeps a copy of `_passages2string` but never calls it: its policies did not read this.
- "zerosearch-simulator": what ZeroSearch policies read in training, the simulator's text as
  written after ZeroSearch's post-processing (ZeroSearch `llm_agent/generation.py:91,137`); it
  needs the simulator engine's verbatim documents (`simulator.engine.split_verbatim`).
- "zerosearch-google": what ZeroSearch policies read from Google through SerpAPI, in its
  evaluation and its real-search training runs (`llm_agent/generation.py:617-640`,
  `inference.py:55-78`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from simsearch.types import Document

INFORMATION_OPEN = "<information>"
INFORMATION_CLOSE = "</information>"
"""The tags around every observation (`wrap_information`); the policy's tag language reads them too."""

RenderStyle = str
"""A name in `RENDERERS`."""


def _search_r1(docs: list[Document]) -> str:
    # Search-R1 builds each line from the server's `contents = f"{title}\n{text}"`, taking the
    # title as the first line and the text as the rest; splitting the same way renders a title
    # that contains a newline exactly as it would through a Search-R1 server.
    lines = []
    for i, doc in enumerate(docs, start=1):
        title, _, text = f"{doc.title}\n{doc.text}".partition("\n")
        lines.append(f"Doc {i}(Title: {title}) {text}\n")
    return "".join(lines)


def _plain(docs: list[Document]) -> str:
    return "\n\n".join(f"{doc.title}\n{doc.text}" for doc in docs)


def _brief(docs: list[Document]) -> str:
    return "".join(f"Doc {i}: {' '.join(doc.text.split())}\n" for i, doc in enumerate(docs, start=1))


def _zerosearch_simulator(docs: list[Document]) -> str:
    # The simulator's verbatim documents are consecutive pieces of its post-processed output.
    return "".join(doc.text for doc in docs)


def _zerosearch_google(docs: list[Document]) -> str:
    # ZeroSearch concatenates an organic result's title and snippet with nothing between them.
    return "\n".join(f"Doc {i}: {doc.title}{doc.text}" for i, doc in enumerate(docs, start=1))


RENDERERS: dict[str, Callable[[list[Document]], str]] = {
    "search-r1": _search_r1,
    "plain": _plain,
    "brief": _brief,
    "zerosearch-simulator": _zerosearch_simulator,
    "zerosearch-google": _zerosearch_google,
}
"""Every rendering style: name -> renderer. The recipe check and `render_documents` read it."""
RENDER_STYLES: tuple[str, ...] = tuple(RENDERERS)
VERBATIM_STYLE = "zerosearch-simulator"
"""The style that shows the simulator's own text: the simulator must return verbatim documents."""


def render_documents(docs: list[Document], style: RenderStyle = "search-r1") -> str:
    """Renders search results as the text block the policy reads (before wrapping).

    Styles:
        "search-r1" (**compat**, Search-R1): for i = 1..k, `Doc {i}(Title: {title}) {text}\\n`,
            title = the first line of `f"{title}\\n{text}"`, text = the rest.
        "plain": each document as its title line then its text, documents separated by a blank
            line; no numbering.
        "brief": `Doc {i}: {text}\\n`, the text on one line (whitespace runs become one space),
            no title. About 7 fewer tokens a document than "search-r1" with a small vocabulary;
            for corpora whose texts name their subject (the tiny world's do), where the title
            repeats what the text says.
        "zerosearch-simulator" (**compat**, ZeroSearch training): the documents' texts
            concatenated as they are. For the simulator's verbatim documents
            (`SimulatedSearchEngine(verbatim=True)`) that is exactly its post-processed output,
            what ZeroSearch inserted; for any other documents it means nothing useful.
        "zerosearch-google" (**compat**, ZeroSearch with SerpAPI): `Doc {i}: {title}{text}`
            lines joined by `\\n`, title and snippet with no separator, no trailing newline.
            Departure: ZeroSearch shows every organic result SerpAPI returns for `num=top_k`,
            we show the first `top_k` (`retrieval.web`).

    Args:
        docs: the documents, best first.
        style: one of `RENDER_STYLES`.

    Returns:
        The block; empty when there are no documents.

    Raises:
        ValueError: unknown style.
    """
    renderer = RENDERERS.get(style)
    if renderer is None:
        raise ValueError(f"unknown render style {style!r}; choose one of {', '.join(RENDER_STYLES)}")
    return renderer(docs)


def wrap_information(block: str) -> str:
    """Wraps a rendered block as the observation appended after a `</search>` (**compat**).

    The block is stripped of surrounding whitespace first, as Search-R1
    (`search_r1/llm_agent/generation.py:391`) and ZeroSearch (`llm_agent/generation.py:524`) do,
    so the trailing newline of the last "search-r1" line does not reach the policy.

    Args:
        block: rendered documents, or any text the rollout shows as search results.

    Returns:
        `"\\n\\n<information>" + block.strip() + "</information>\\n\\n"`.
    """
    return f"\n\n{INFORMATION_OPEN}{block.strip()}{INFORMATION_CLOSE}\n\n"


_SURROGATES = re.compile("[\ud800-\udfff]")


def encodable(text: str) -> str:
    """`text` with every lone UTF-16 surrogate replaced by U+FFFD; any other text unchanged.

    JSON can spell a lone surrogate (`"\\ud83d"`, half an emoji), so a search API's results may hold
    one; a tokenizer cannot encode it.
    """
    return _SURROGATES.sub("\ufffd", text) if _SURROGATES.search(text) else text
