"""A trainer's search tool speaking to `simsearch serve`: the `/retrieve` body and the rendered answer.

The body carries what the server's curriculum and the ZeroSearch presets need beyond Search-R1's
`queries` / `topk`: the sample's `question` and `golden_answers` and the trainer's `step`, each
only when known, so an answer-blind server reads it as a plain Search-R1 request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simsearch.data.rendering import render_documents
from simsearch.types import Document


@dataclass(frozen=True)
class SampleContext:
    """What a dataset row tells the simulator about the question a trajectory answers."""

    question: str | None = None
    golden_answers: tuple[str, ...] = ()

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> SampleContext:
        """From a row's tool kwargs: `question` (str) and `golden_answers` (a str or a list of them).

        Raises:
            ValueError: A field of the wrong type, naming it.
        """
        question = kwargs.get("question")
        if question is not None and not isinstance(question, str):
            raise ValueError(f"tools_kwargs question must be a string, got {type(question).__name__}")
        answers = kwargs.get("golden_answers", ())
        answers = [answers] if isinstance(answers, str) else list(answers)
        if not all(isinstance(a, str) for a in answers):
            raise ValueError(f"tools_kwargs golden_answers must be strings, got {answers!r}")
        return cls(question, tuple(answers))


def retrieve_body(
    queries: list[str], *, topk: int, context: SampleContext, step: int | None = None, client: str = ""
) -> dict[str, Any]:
    """Search-R1's `/retrieve` body for `queries` of one sample, with its context, step and client when known."""
    body: dict[str, Any] = {"queries": queries, "topk": topk, "return_scores": True}
    if context.question is not None:
        body["question"] = [context.question] * len(queries)
    if context.golden_answers:
        body["golden_answers"] = [list(context.golden_answers)] * len(queries)
    if step is not None:
        body["step"] = step
    if client:
        body["client"] = client
    return body


def documents(result: list[Any]) -> list[Document]:
    """One query's documents from a `/retrieve` answer (with or without scores): `contents` is the
    title line, then the text."""
    docs = []
    for item in result:
        document = item.get("document", item)
        title, _, text = str(document["contents"]).partition("\n")
        docs.append(Document(title=title, text=text, score=item.get("score"), id=document.get("id")))
    return docs


def render_answer(answer: dict[str, Any], style: str = "search-r1") -> str:
    """The text a policy reads for an answer to a `/retrieve` body: each query's documents rendered
    in `style` (`data.rendering`), queries separated by a blank line."""
    return "\n".join(render_documents(documents(result), style) for result in answer["result"]).strip()
