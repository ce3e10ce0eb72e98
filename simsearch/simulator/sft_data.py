"""Simulator SFT data: real searches (`SearchRecord`) labelled useful or noisy and rendered as JSONL pairs.

Targets (`build_sft_pairs`): "trajectory" labels a search by its trajectory's outcome, "judged"
by a judge of the documents, "retrieved" gives each record a useful pair (what the retriever
returned) and a noisy pair (`noisy_documents`). `contrast_records` adds records for perturbed
queries. The train/validation split is by question.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tqdm import tqdm

from simsearch.data.rendering import RenderStyle
from simsearch.eval.metrics import exact_match, normalize_answer, substring_exact_match
from simsearch.generation.base import GenerationEngine
from simsearch.retrieval.base import SearchEngine
from simsearch.simulator.engine import PAD_TEXT
from simsearch.simulator.prompts import (
    PRESETS,
    Preset,
    PromptTemplates,
    as_chat,
    format_response,
    render,
)
from simsearch.types import Document, SamplingParams, SearchRequest, Trajectory

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Target = Literal["trajectory", "judged", "retrieved"]
TARGETS: tuple[str, ...] = ("trajectory", "judged", "retrieved")
"""How pairs are labelled (module docstring)."""
OUTCOME_METRICS: dict[str, Callable[[str | None, Sequence[str]], float]] = {
    "substring_em": substring_exact_match,
    "em": exact_match,
}
"""target="trajectory": how a trajectory's final answer is scored; 1 means it reached the answer."""
Judge = Callable[[list["SearchRecord"]], list["bool | None"]]
"""Labels a batch of records: True useful, False noisy, None when it could not decide."""


@dataclass
class SearchRecord:
    """One real search made while answering a question."""

    question: str
    golden_answers: list[str]
    query: str
    documents: list[Document]
    answered_correctly: bool | None = None  # the trajectory's outcome; None: not from a scored trajectory


def records_from_trajectories(
    trajectories: Sequence[Trajectory], *, outcome_metric: str = "substring_em"
) -> list[SearchRecord]:
    """Every search the engine ran in the trajectories (refused and self-search ones left out), in order.

    `outcome_metric` (a key of `OUTCOME_METRICS`) sets each record's `answered_correctly`.
    """
    metric = OUTCOME_METRICS[outcome_metric]
    records = []
    for t in trajectories:
        correct = metric(t.answer, t.example.golden_answers) == 1.0
        for turn in t.turns:
            if turn.action != "search" or not turn.executed:
                continue
            # A tool-call turn's calls, one record each; a tag turn's one query.
            searches = (
                zip(turn.call_queries, turn.call_documents) if turn.call_queries else [(turn.query, turn.documents)]
            )
            for query, documents in searches:
                records.append(
                    SearchRecord(
                        question=t.example.question,
                        golden_answers=list(t.example.golden_answers),
                        query=query,
                        documents=list(documents),
                        answered_correctly=correct,
                    )
                )
    return records


def outcome_judge(records: list[SearchRecord]) -> list[bool | None]:
    """target="trajectory": useful when the trajectory answered correctly (`ValueError` if unscored)."""
    for i, r in enumerate(records):
        if r.answered_correctly is None:
            raise ValueError(
                f"record {i} (query {r.query!r}) has no trajectory outcome: target='trajectory' labels "
                "only records from records_from_trajectories (no contrast queries)"
            )
    return [r.answered_correctly for r in records]


@dataclass
class SFTData:
    """Rendered pairs and what happened on the way."""

    train: list[dict]
    val: list[dict]
    stats: dict[str, float]


def contains_answer(documents: Sequence[Document], golden_answers: Sequence[str]) -> bool:
    """True when a normalized gold answer occurs as whole words in the documents (empty golds never match)."""
    text = " " + normalize_answer(" ".join(f"{d.title} {d.text}" for d in documents)) + " "
    golds = (normalize_answer(g) for g in golden_answers)
    return any(f" {gold} " in text for gold in golds if gold)


def rule_judge(records: list[SearchRecord]) -> list[bool | None]:
    return [contains_answer(r.documents, r.golden_answers) for r in records]


_JUDGE_PROMPT = (
    "You are checking search results.\n"
    "Question: {question}\n"
    "Search query: {query}\n"
    "Search results:\n{documents}\n\n"
    "Do these search results contain enough information to answer the question? "
    "Reply with one word: yes or no.\n"
    "Reply:"
)
_YES = {"yes", "y", "true", "useful"}
_NO = {"no", "n", "false", "noisy", "not"}
_VERDICT_WORD = re.compile(r"\b(yes|no)\b")


def judge_prompt(record: SearchRecord) -> str:
    """The LLM judge's question for one record."""
    return _JUDGE_PROMPT.format(
        question=record.question, query=record.query, documents=format_response(record.documents)
    )


def parse_verdict(text: str) -> bool | None:
    """A yes/no reply as True, False, or None when it holds neither."""
    lowered = text.lower()
    words = re.findall(r"[a-z]+", lowered)
    if words and words[0] in _YES:
        return True
    if words and words[0] in _NO:
        return False
    match = _VERDICT_WORD.search(lowered)
    return None if match is None else match.group(1) == "yes"


class LLMJudge:
    """A `Judge` that asks a model, one batched generate call per batch of records.

    `chat` applies `tokenizer`'s chat template; without a tokenizer the generator must be a chat endpoint.
    """

    def __init__(
        self,
        generator: GenerationEngine,
        *,
        tokenizer: PreTrainedTokenizerBase | None = None,
        chat: bool = False,
        max_new_tokens: int = 8,
    ) -> None:
        self.generator = generator
        self.tokenizer = tokenizer
        self.chat = chat
        self.max_new_tokens = max_new_tokens

    def __call__(self, records: list[SearchRecord]) -> list[bool | None]:
        if not records:
            return []
        texts = [judge_prompt(r) for r in records]
        prompts: list[str] | list[list[int]] = texts
        if self.chat and self.tokenizer is not None:
            prompts = [self.tokenizer(as_chat(p, self.tokenizer), add_special_tokens=False)["input_ids"] for p in texts]
        params = SamplingParams(temperature=0.0, max_new_tokens=self.max_new_tokens)
        completions = self.generator.generate(prompts, params)
        return [parse_verdict(c.text) for c in completions]


def balance_indices(labels: Sequence[bool], seed: int) -> list[int]:
    """Ascending indices kept after downsampling the majority class to the minority's size (seeded)."""
    useful = [i for i, label in enumerate(labels) if label]
    noisy = [i for i, label in enumerate(labels) if not label]
    minority, majority = sorted((useful, noisy), key=len)
    kept = minority + random.Random(seed).sample(majority, len(minority))
    return sorted(kept)


def split_by_question(pairs: list[dict], val_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """Train and validation pairs, split by question (seeded, `round(val_fraction * questions)` held out)."""
    questions = sorted({p["question"] for p in pairs})
    rng = random.Random(seed)
    rng.shuffle(questions)
    n_val = round(val_fraction * len(questions))
    if val_fraction > 0 and len(questions) >= 2:
        n_val = min(max(n_val, 1), len(questions) - 1)
    val_questions = set(questions[:n_val])
    train = [p for p in pairs if p["question"] not in val_questions]
    val = [p for p in pairs if p["question"] in val_questions]
    rng.shuffle(train)
    rng.shuffle(val)
    return train, val


def noisy_documents(
    record: SearchRecord,
    same_question: Sequence[Document],
    pool: Sequence[Document],
    rng: random.Random,
) -> tuple[list[Document], int]:
    """The documents with each answer-bearing one replaced (from `same_question`, then `pool`), and how many."""
    golds = record.golden_answers
    used = {(d.title, d.text) for d in record.documents}

    def usable(doc: Document) -> bool:
        return (doc.title, doc.text) not in used and not contains_answer([doc], golds)

    local = [d for d in {(d.title, d.text): d for d in same_question}.values() if usable(d)]
    out: list[Document] = []
    replaced = 0
    for doc in record.documents:
        if not contains_answer([doc], golds):
            out.append(doc)
            continue
        replaced += 1
        pick = local.pop(rng.randrange(len(local))) if local else _draw_usable(pool, usable, rng)
        if pick is None:
            out.append(Document(title="", text=PAD_TEXT, source=doc.source))
        else:
            used.add((pick.title, pick.text))
            out.append(pick)
    return out, replaced


def _draw_usable(pool: Sequence[Document], usable: Callable[[Document], bool], rng: random.Random) -> Document | None:
    # Random draws first: nearly every document of a large pool is usable, and scanning the whole
    # pool for each of thousands of records was quadratic. The scan is the rare fallback.
    for _ in range(min(64, len(pool))):
        doc = pool[rng.randrange(len(pool))]
        if usable(doc):
            return doc
    rest = [d for d in pool if usable(d)]
    return rng.choice(rest) if rest else None


CONTRAST_EDITS: tuple[str, ...] = ("drop", "cut", "swap", "respell")
"""The edits `query_variants` draws from (`CollectRecipe.contrast_edits`)."""


def query_variants(
    query: str,
    n: int,
    rng: random.Random,
    donors: Sequence[str],
    edits: Sequence[str] = ("drop", "cut", "swap"),
) -> list[str]:
    """Up to `n` distinct perturbations of `query`, one `edits` edit each (drop, cut, swap, respell)."""
    words = query.split()
    donor_words = [w for d in donors for w in d.split()]
    out: list[str] = []
    for _ in range(8 * n):
        if len(out) == n or not words:
            break
        i = rng.randrange(len(words))
        edited = list(words)
        edited[i : i + 1] = _edit(words[i], rng.choice(tuple(edits)), len(words), donor_words, rng)
        variant = " ".join(edited)
        if edited != words and variant not in out:
            out.append(variant)
    return out


def _edit(word: str, edit: str, n_words: int, donor_words: list[str], rng: random.Random) -> list[str]:
    """`word` after one edit: [] (dropped), one word, or `[word]` when the edit does not apply."""
    if edit == "drop" and n_words >= 2:
        return []
    if edit == "cut" and len(word) >= 4:
        return [word[: rng.randrange(2, len(word) - 1)]]
    if edit == "swap" and donor_words:
        return [rng.choice(donor_words)]
    if edit == "respell" and len(word) >= 4 and donor_words:
        donor = rng.choice(donor_words)
        keep = rng.randrange(2, len(word) - 1)
        return [word[:keep] + donor[min(keep, len(donor) - 1) :].lower()]
    return [word]


def contrast_records(
    records: Sequence[SearchRecord],
    search: SearchEngine,
    *,
    n: int,
    top_k: int,
    seed: int,
    chunk_size: int = 256,
    edits: Sequence[str] = ("drop", "cut", "swap"),
) -> list[SearchRecord]:
    """`n` variants of each record's query searched with `search`, as records of the same question."""
    rng = random.Random(seed)
    queries = [r.query for r in records]
    sources: list[SearchRecord] = []
    variants: list[str] = []
    for r in records:
        for variant in query_variants(r.query, n, rng, donors=[rng.choice(queries)], edits=edits):
            sources.append(r)
            variants.append(variant)
    out: list[SearchRecord] = []
    for start in tqdm(range(0, len(variants), chunk_size), desc="contrast queries", unit="batch"):
        chunk = variants[start : start + chunk_size]
        results = search.search([SearchRequest(query=q, top_k=top_k) for q in chunk])
        for source, query, documents in zip(sources[start : start + chunk_size], chunk, results):
            out.append(SearchRecord(source.question, list(source.golden_answers), query, list(documents)))
    return out


def _pair(
    record: SearchRecord,
    documents: list[Document],
    *,
    noisy: bool,
    preset: Preset,
    templates: PromptTemplates | None,
    show_question: bool,
    show_answer: bool,
    top_k: int | None,
    style: RenderStyle,
) -> dict:
    prompt = render(
        preset,
        query=record.query,
        question=record.question if show_question else None,
        golden_answers=record.golden_answers if show_answer else [],
        noisy=noisy,
        top_k=top_k or len(documents),
        templates=templates,
    )
    return {
        "prompt": prompt,
        "response": format_response(documents, style),
        "label": "noisy" if noisy else "useful",
        "query": record.query,
        "question": record.question,
        "golden_answers": list(record.golden_answers),
        "contains_answer": contains_answer(documents, record.golden_answers),
    }


def build_sft_pairs(
    records: list[SearchRecord],
    *,
    preset: Preset,
    target: Target = "judged",
    judge: Judge = rule_judge,
    balance: bool = True,
    val_fraction: float = 0.1,
    seed: int = 0,
    templates: PromptTemplates | None = None,
    show_question: bool = True,
    show_answer: bool = True,
    top_k: int | None = None,
    style: RenderStyle = "search-r1",
) -> SFTData:
    """Labels, balances, renders and splits records into simulator SFT pairs.

    Args:
        records: Real-retriever searches; duplicates and empty records are dropped (empty ones kept
            for "retrieved" with `top_k`).
        preset: Prompt preset of the pairs (the simulator must run with it).
        target: "trajectory" (needs `answered_correctly`), "judged" (needs `judge`) or "retrieved".
        balance: For "judged" and "trajectory", downsample the majority label.
        show_question: Render the question into the prompts, as `SimulatedSearchEngine` does.
        show_answer: Render the gold answers into the prompts, as `SimulatedSearchEngine` does.
        top_k: Results every prompt asks for; None: each record's own number of documents.
        style: How responses write the documents (`format_response`).

    Returns:
        Train and validation pairs, plus counts under `collect/...`.
    """
    if target not in TARGETS:
        raise ValueError(f"target={target!r} is not one of {', '.join(TARGETS)}")
    if style != "search-r1" and not (preset in PRESETS and PRESETS[preset].any_response_style):
        raise ValueError(
            f"style={style!r} needs preset='simsearch-brief': preset {preset!r} asks for Doc i(Title: t) lines"
        )
    stats: dict[str, float] = {"collect/records": float(len(records))}
    kept = _usable_records(records, keep_empty=target == "retrieved" and top_k is not None, stats=stats)
    rendering: dict[str, Any] = {
        "preset": preset,
        "templates": templates,
        "show_question": show_question,
        "show_answer": show_answer,
        "top_k": top_k,
        "style": style,
    }
    if target in ("judged", "trajectory"):
        labeller = outcome_judge if target == "trajectory" else judge
        pairs = _labelled_pairs(kept, target, labeller, balance, seed, rendering, stats)
    else:
        pairs = _retrieved_pairs(kept, seed, rendering, stats)
    train, val = split_by_question(pairs, val_fraction, seed)
    stats.update(_split_stats(pairs, train, val))
    return SFTData(train=train, val=val, stats=stats)


def _split_stats(
    pairs: list[dict[str, Any]], train: list[dict[str, Any]], val: list[dict[str, Any]]
) -> dict[str, float]:
    """`collect/useful_contains_answer` over all pairs, and each split's size and share of useful pairs."""
    useful_pairs = [p for p in pairs if p["label"] == "useful"]
    stats = {
        "collect/useful_contains_answer": (
            sum(p["contains_answer"] for p in useful_pairs) / len(useful_pairs) if useful_pairs else 0.0
        )
    }
    for name, split in (("train", train), ("val", val)):
        stats[f"collect/{name}"] = float(len(split))
        stats[f"collect/{name}_useful_share"] = (
            sum(p["label"] == "useful" for p in split) / len(split) if split else 0.0
        )
    return stats


def _count(stats: dict[str, float], key: str) -> None:
    stats[key] = stats.get(key, 0.0) + 1


def _usable_records(records: list[SearchRecord], *, keep_empty: bool, stats: dict[str, float]) -> list[SearchRecord]:
    """The records without duplicates (and empty ones unless `keep_empty`); counts both into `stats`."""
    seen: set[str] = set()
    kept: list[SearchRecord] = []
    for r in records:
        documents = [[d.title, d.text] for d in r.documents]
        key = json.dumps([r.question, r.query, documents, r.answered_correctly])
        if not r.documents:
            _count(stats, "collect/empty")
            if not keep_empty:
                continue
        if key in seen:
            _count(stats, "collect/duplicates")
        else:
            seen.add(key)
            kept.append(r)
    return kept


def _labelled_pairs(
    kept: list[SearchRecord],
    target: str,
    labeller: Judge,
    balance: bool,
    seed: int,
    rendering: dict[str, Any],
    stats: dict[str, float],
) -> list[dict]:
    """One pair per record `labeller` decides (target "judged" or "trajectory"), balanced if asked."""
    labels = labeller(kept) if kept else []
    decided = [(r, label) for r, label in zip(kept, labels) if label is not None]
    stats[f"collect/{target}_useful"] = float(sum(label for _, label in decided))
    stats[f"collect/{target}_noisy"] = float(len(decided) - stats[f"collect/{target}_useful"])
    stats["collect/unjudged"] = float(len(kept) - len(decided))
    if balance and decided:
        chosen = balance_indices([label for _, label in decided], seed)
        stats["collect/dropped_for_balance"] = float(len(decided) - len(chosen))
        decided = [decided[i] for i in chosen]
    return [_pair(r, r.documents, noisy=not label, **rendering) for r, label in decided]


def _retrieved_pairs(
    kept: list[SearchRecord], seed: int, rendering: dict[str, Any], stats: dict[str, float]
) -> list[dict]:
    """Target "retrieved": each record as a useful pair and, with `noisy_documents`, a noisy one."""
    rng = random.Random(seed)
    pool = list({(d.title, d.text): d for r in kept for d in r.documents}.values())
    by_question: dict[str, list[Document]] = {}
    for r in kept:
        by_question.setdefault(r.question, []).extend(r.documents)
    pairs: list[dict] = []
    replaced_total = 0
    for r in kept:
        noisy_docs, replaced = noisy_documents(r, by_question[r.question], pool, rng)
        replaced_total += replaced
        pairs.append(_pair(r, r.documents, noisy=False, **rendering))
        pairs.append(_pair(r, noisy_docs, noisy=True, **rendering))
    stats["collect/noisy_replaced_docs"] = float(replaced_total)
    return pairs


def write_pairs(pairs: list[dict], path: str | Path) -> Path:
    """Writes pairs as UTF-8 JSONL, creating parent directories."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for pair in pairs:
            f.write(json.dumps(pair, ensure_ascii=False) + "\n")
    return out
