"""The search-engine interface every real retriever and the simulator implement, and how the
documents it returns are shown to the policy.

Rendering is split in two steps because the rollout needs them apart: `render_documents` turns
documents into the text block, `wrap_information` turns any block into the observation appended
to the trajectory (`\\n\\n<information>{block}</information>\\n\\n`). The rollout wraps text that
does not come from `Document`s too (an empty result, an engine error, the self-search mode that
swaps the policy's own information for real results), and it needs to know where the information
tokens start and end for the loss mask. `render_information` composes the two for the common case.

The default style, "search-r1", is **compat**: byte-identical to what Search-R1 and ZeroSearch
policies saw (Search-R1 `LLMGenerationManager._passages2string` and `execute_predictions`).
"""

from __future__ import annotations

from typing import Literal, Protocol

import numpy as np

from simsearch.types import Document, SearchRequest

RenderStyle = Literal["search-r1", "plain", "brief"]
RENDER_STYLES: tuple[RenderStyle, ...] = ("search-r1", "plain", "brief")


class SearchEngine(Protocol):
    """Answers a batch of queries in one call: one list of documents per request, in order."""

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]: ...


def render_documents(docs: list[Document], style: RenderStyle = "search-r1") -> str:
    """Renders search results as the text block the policy reads (before wrapping).

    Styles:
        "search-r1" (**compat**): for i = 1..k, `Doc {i}(Title: {title}) {text}\\n`. Search-R1 builds
            each line from the server's `contents = f"{title}\\n{text}"`, taking the title as the
            first line and the text as the rest; we split the same way, so a title containing a
            newline renders exactly as it would through a Search-R1 server.
        "plain": each document as its title line then its text, documents separated by a blank
            line; no numbering.
        "brief": `Doc {i}: {text}\n`, the text on one line (whitespace runs become one space),
            no title. About 7 fewer tokens a document than "search-r1" with a small vocabulary;
            for corpora whose texts name their subject (the tiny world's do), where the title
            repeats what the text says.

    Args:
        docs: the documents, best first.
        style: one of the styles above.

    Returns:
        The block; empty when there are no documents.

    Raises:
        ValueError: unknown style.
    """
    if style == "search-r1":
        lines = []
        for i, doc in enumerate(docs, start=1):
            title, _, text = f"{doc.title}\n{doc.text}".partition("\n")
            lines.append(f"Doc {i}(Title: {title}) {text}\n")
        return "".join(lines)
    if style == "plain":
        return "\n\n".join(f"{doc.title}\n{doc.text}" for doc in docs)
    if style == "brief":
        return "".join(f"Doc {i}: {' '.join(doc.text.split())}\n" for i, doc in enumerate(docs, start=1))
    raise ValueError(f"unknown render style {style!r}; choose one of {', '.join(RENDER_STYLES)}")


def wrap_information(block: str) -> str:
    """Wraps a rendered block as the observation appended after a `</search>` (**compat**).

    The block is stripped of surrounding whitespace first, as Search-R1 does, so the trailing
    newline of the last "search-r1" line does not reach the policy.

    Args:
        block: rendered documents, or any text the rollout shows as search results.

    Returns:
        `"\\n\\n<information>" + block.strip() + "</information>\\n\\n"`.
    """
    return f"\n\n<information>{block.strip()}</information>\n\n"


def render_information(docs: list[Document], style: RenderStyle = "search-r1") -> str:
    """Renders documents and wraps them: the full observation for one search call.

    Args:
        docs: the documents, best first.
        style: see `render_documents`.

    Returns:
        `wrap_information(render_documents(docs, style))`.
    """
    return wrap_information(render_documents(docs, style))


def check_top_k(requests: list[SearchRequest], corpus_size: int) -> None:
    """Rejects a `top_k` a corpus retriever cannot honour.

    A retriever over a fixed corpus cannot return more passages than it holds, and silently
    returning fewer would change what the policy sees without anyone noticing; both are input
    errors (see `SearchRequest`).

    Args:
        requests: the batch.
        corpus_size: number of passages in the index.

    Raises:
        ValueError: naming the first offending request, its query and the allowed range.
    """
    for i, request in enumerate(requests):
        if not 1 <= request.top_k <= corpus_size:
            raise ValueError(
                f"request {i} (query {request.query!r}) has top_k={request.top_k}; "
                f"top_k must be between 1 and the corpus size, {corpus_size}"
            )


def select_top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the `k` largest scores, best first; ties go to the lower position.

    The tie rule makes results reproducible across runs, batch sizes and engines (argpartition
    alone orders ties arbitrarily).

    Args:
        scores: one score per candidate. # [N]
        k: how many to keep; more than N keeps all N.

    Returns:
        int64 positions into `scores`. # [min(k, N)]
    """
    n = scores.shape[0]
    k = min(k, n)
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    if k < n:
        # The k-th largest value; everything strictly above it is in, ties at it are cut by position.
        kth = np.partition(scores, n - k)[n - k]
        candidates = np.flatnonzero(scores >= kth)
    else:
        candidates = np.arange(n)
    # lexsort sorts by the last key first: score descending, then position ascending.
    order = np.lexsort((candidates, -scores[candidates]))
    return candidates[order[:k]].astype(np.int64)
