"""How the documents a search engine returns are shown to the policy.

`render_documents` turns documents into a text block; `wrap_information` turns any block into
the observation appended to the trajectory (`\\n\\n<information>{block}</information>\\n\\n`).
They are apart because the rollout wraps other text too (an empty result, an engine error, real
results in self-search) and needs the information tokens' span for the loss mask. The
**compat** styles reproduce what the reference policies read, byte for byte.
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
    """Renders search results (best first) as the text block the policy reads; empty for no documents.

    Styles:
        "search-r1" (**compat**): for i = 1..k, `Doc {i}(Title: {title}) {text}\\n`, title = the
            first line of `f"{title}\\n{text}"`, text = the rest.
        "plain": title line then text, documents separated by a blank line; no numbering.
        "brief": `Doc {i}: {text}\\n`, the text on one line, no title.
        "zerosearch-simulator" (**compat**): the texts concatenated as they are; meaningful only
            for the simulator's verbatim documents.
        "zerosearch-google" (**compat**): `Doc {i}: {title}{text}` lines joined by `\\n`, no
            trailing newline.

    Raises:
        ValueError: unknown style.
    """
    renderer = RENDERERS.get(style)
    if renderer is None:
        raise ValueError(f"unknown render style {style!r}; choose one of {', '.join(RENDER_STYLES)}")
    return renderer(docs)


def wrap_information(block: str) -> str:
    """`"\\n\\n<information>" + block.strip() + "</information>\\n\\n"` (**compat**): the observation
    appended after a `</search>`.
    """
    return f"\n\n{INFORMATION_OPEN}{block.strip()}{INFORMATION_CLOSE}\n\n"


# wrap_information(block) == head + block + OBSERVATION_TAIL; derived from the compat wrapper
# rather than spelled out, so the two cannot disagree.
EMPTY_OBSERVATION = wrap_information("")
OBSERVATION_TAIL = EMPTY_OBSERVATION[EMPTY_OBSERVATION.index(INFORMATION_CLOSE) :]


_SURROGATES = re.compile("[\ud800-\udfff]")


def encodable(text: str) -> str:
    """`text` with every lone UTF-16 surrogate replaced by U+FFFD; any other text unchanged.

    JSON can spell a lone surrogate (`"\\ud83d"`, half an emoji), so a search API's results may hold
    one; a tokenizer cannot encode it.
    """
    return _SURROGATES.sub("\ufffd", text) if _SURROGATES.search(text) else text
