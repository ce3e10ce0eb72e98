"""The RAG baseline: the question as the one query, the documents in the `rag` template, one generation.

It is run here rather than by the rollout, whose templates take no documents. A prompt longer than its budget
has its documents' text cut from the end until it fits (`rag_prompt`); the row says how much.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from simsearch.data.templates import render_prompt
from simsearch.errors import DataError
from simsearch.eval import report
from simsearch.eval.metrics import extract_answer
from simsearch.generation.base import GenerationEngine
from simsearch.policy.tags import ANSWER_STOP, parse_action
from simsearch.retrieval.base import SearchEngine
from simsearch.types import Completion, Document, QAExample, SamplingParams, SearchRequest, Turn


def rag_rows(
    examples: Sequence[QAExample],
    *,
    policy: GenerationEngine,
    tokenizer: Any,
    engine: SearchEngine,
    top_k: int,
    noise: Callable[[int], int] | None,
    sampling: SamplingParams,
    n: int,
    max_context_tokens: int,
    normalization: str,
) -> list[dict[str, Any]]:
    """The RAG baseline on a chunk: one search call for all questions, one generate call.

    Each question is its own query; the `rag` template shows the documents (cut to fit
    `max_context_tokens - sampling.max_new_tokens` tokens, see `rag_prompt`), so every answer
    gets the whole `max_new_tokens`; generation stops at `</answer>`. `num_searches` is 1 per
    sample (the one retrieval). Each row's `retrieval` holds the documents as retrieved and
    `truncated_chars`, the characters of their text left out of the prompt.

    Raises:
        ValueError: The engine answered the wrong number of requests.
        DataError: A question too long for the prompt even without documents (naming it).
    """
    requests = [
        SearchRequest(
            query=ex.question,
            top_k=top_k,
            question=ex.question,
            golden_answers=list(ex.golden_answers),
            num_noisy=0 if noise is None else noise(top_k),
        )
        for ex in examples
    ]
    results = engine.search(requests)
    if len(results) != len(requests):
        raise ValueError(f"the RAG engine returned {len(results)} result lists for {len(requests)} questions")
    budget = max_context_tokens - sampling.max_new_tokens
    built = [rag_prompt(ex, list(docs), tokenizer, budget) for ex, docs in zip(examples, results)]
    prompts = [ids for ids, _ in built]
    params = replace(sampling, stop=[ANSWER_STOP], n=n)
    completions = policy.generate(prompts, params)
    if len(completions) != len(prompts) * n:
        raise ValueError(
            f"the policy engine returned {len(completions)} completions for {len(prompts)} prompts x n={n}"
        )
    rows = []
    for i, (ex, request, docs, (_, cut)) in enumerate(zip(examples, requests, results, built)):
        samples = [_rag_sample(c) for c in completions[i * n : (i + 1) * n]]
        retrieval = {
            "query": request.query,
            "num_noisy": request.num_noisy,
            "documents": [report.document_record(d) for d in docs],
            "truncated_chars": cut,
        }
        rows.append(report.example_row(ex, samples, normalization=normalization, retrieval=retrieval))
    return rows


def rag_prompt(example: QAExample, documents: list[Document], tokenizer: Any, budget: int) -> tuple[list[int], int]:
    """Token ids of the RAG prompt, at most `budget` of them, cutting the documents' text to fit.

    When the whole prompt is too long, the documents' text is kept from the start (best
    document first) up to the largest number of characters that fits, found by bisection; a
    document left with no character is dropped. The instruction and the question are never cut.

    Returns:
        (ids, characters of document text left out; 0 when everything fit).

    Raises:
        DataError: The prompt exceeds `budget` even without any document text.
    """
    total = sum(len(doc.text) for doc in documents)

    def encode(kept: int) -> list[int]:
        shown = documents if kept >= total else _first_chars(documents, kept)
        return tokenizer.encode(render_prompt(example.question, template="rag", documents=shown))

    ids = encode(total)
    if len(ids) <= budget:
        return ids, 0
    bare = len(encode(0))
    if bare > budget:
        raise DataError(
            f"RAG prompt of example {example.id!r}: without any document text it takes {bare} tokens, over "
            f"rollout.max_context_tokens - sampling.max_new_tokens = {budget}; raise max_context_tokens"
        )
    fits, fails = 0, total  # characters kept: `fits` fits, `fails` is known too long
    while fails - fits > 1:
        middle = (fits + fails) // 2
        if len(encode(middle)) <= budget:
            fits = middle
        else:
            fails = middle
    return encode(fits), total - fits


def _first_chars(documents: list[Document], kept: int) -> list[Document]:
    """The documents holding only the first `kept` characters of their texts, in order."""
    shown = []
    for doc in documents:
        if kept <= 0:
            break
        shown.append(replace(doc, text=doc.text[:kept]))
        kept -= len(doc.text)
    return shown


def _rag_sample(completion: Completion) -> dict[str, Any]:
    text = completion.text
    action = parse_action(text)
    finish = "answer" if action.kind == "answer" else "length" if completion.finish_reason == "length" else "gave_up"
    return {
        "answer": extract_answer(text),
        "response": text,
        "finish": finish,
        "num_searches": 1,
        "num_invalid": int(action.kind != "answer"),
        "policy_tokens": len(completion.token_ids),
        "turns": [report.turn_record(Turn(text=text, action=action.kind))],
    }
