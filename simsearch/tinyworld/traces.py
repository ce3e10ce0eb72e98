"""Pretraining traces on the tiny world: the tag format and copying, and nothing RL should find.

A trace is a prompt, a `<search>` turn, the `<information>` block and an `<answer>` turn,
tokenized piecewise as `policy.rollout` assembles a trajectory. Its query kind
(`QUERY_KINDS`) and its answer (any value span of the retrieved documents) are random, so
what RL has to learn stays open; the information tokens are out of the LM loss.
`make_copy_drills` builds traces of random tokens that teach copying alone.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from simsearch.data.chat import ToolConversation, search_tool_schema, tool_call_messages, write_call
from simsearch.data.rendering import RenderStyle, render_documents, wrap_information
from simsearch.data.templates import TemplateName, render_prompt
from simsearch.retrieval.base import SearchEngine
from simsearch.tinyworld.values import RELATION_KINDS, value_kind, value_spans, world_values
from simsearch.tinyworld.world import World
from simsearch.types import Document, QAExample, SearchRequest

QUERY_KINDS: tuple[str, ...] = ("name", "words", "mixed")
"""Query kinds of a trace: the entity name, other question words, or both mixed."""

_EMPTY_OBSERVATION = wrap_information("")
# The rollout tokenizes the closing "</information>\n\n" apart from the rest of the observation
# (so a cut observation keeps it whole); we split at the same place.
_OBSERVATION_TAIL = _EMPTY_OBSERVATION[_EMPTY_OBSERVATION.index("</information>") :]
_WORD = re.compile(r"[A-Za-z0-9]+")
_MAX_REDRAWS = 20  # rounds of redrawing queries that retrieved nothing


@dataclass
class Trace:
    """One pretraining sequence and how it was made.

    `loss_mask[i]` is 1 when `input_ids[i]` is a token the policy would generate; `copy_mask[i]` is
    1 on information tokens whose bigram occurs earlier. Position i is predicted from those before it.
    """

    input_ids: list[int]
    loss_mask: list[int]
    copy_mask: list[int]
    # How a search trace was made; None / empty for a copy drill (`make_copy_drills`).
    example: QAExample | None = None
    query_kind: str = ""  # one of QUERY_KINDS
    query: str = ""
    documents: list[Document] = field(default_factory=list)
    # The second search of a two-search trace (`make_traces(two_search_share=...)`); "" / empty otherwise.
    second_query_kind: str = ""
    second_query: str = ""
    second_documents: list[Document] = field(default_factory=list)
    answer: str = ""
    candidates: list[str] = field(default_factory=list)  # the values the answer was drawn from
    reading: bool = False  # a reading trace (`make_traces(reading_share=...)`): its searches are out of the loss


def copy_mask(input_ids: Sequence[int], start: int, end: int) -> list[int]:
    """0/1 per position: 1 at i in `[start, end)` when the bigram ending at i occurred earlier."""
    mask = [0] * len(input_ids)
    seen: set[tuple[int, int]] = set()
    for i in range(1, min(end, len(input_ids))):
        bigram = (input_ids[i - 1], input_ids[i])
        if i >= start and bigram in seen:
            mask[i] = 1
        seen.add(bigram)
    return mask


def make_traces(
    world: World,
    engine: SearchEngine,
    tokenizer: PreTrainedTokenizerBase,
    *,
    n: int,
    seed: int,
    top_k: int = 3,
    template: TemplateName = "search-r1",
    query_mix: Sequence[float] = (1 / 3, 1 / 3, 1 / 3),
    examples: Sequence[QAExample] | None = None,
    typed_answer_share: float = 0.0,
    reading_share: float = 0.0,
    redraw_empty: bool = True,
    rendering: RenderStyle = "search-r1",
    two_search_share: float = 0.0,
    protocol: str = "tags",
) -> list[Trace]:
    """Builds `n` pretraining traces, in draw order; a share of 0 draws nothing (same traces as without it).

    Args:
        engine: The search engine the rollout will use.
        top_k: Documents per search, as in the rollout.
        template: Prompt template, rendered as the rollout renders it; not "search-r1-chat".
        query_mix: Probabilities of the query kinds `QUERY_KINDS`.
        examples: Questions to draw from; `world.train` by default.
        typed_answer_share: Share of traces drawing their answer among values of the asked kind.
        reading_share: Share of reading traces (search the entity name, answer the gold value).
        redraw_empty: Redraw a query that finds nothing; False answers a value of the asked kind.
        two_search_share: Share of traces that search a person's name from the first results.
        protocol: "tags", or "tool-call": Hermes calls in the tokenizer's chat template, as the rollout writes them.

    Raises:
        ValueError: A bad argument, a question not of `world`, or queries still finding nothing
            after redraws.
    """
    _check_trace_args(n, top_k, query_mix, template, typed_answer_share, reading_share, two_search_share)
    if protocol not in ("tags", "tool-call"):
        raise ValueError(f"protocol={protocol!r} is not one of tags, tool-call")
    pool = _question_pool(world, examples)
    rng = random.Random(seed)
    searcher = _Searcher(rng, engine, top_k, query_mix, redraw_empty)
    chosen, reading, first = _first_searches(searcher, world, pool, n, reading_share)
    questions = [example.question for example in chosen]
    second = _second_searches(searcher, world, questions, first, two_search_share) if two_search_share else {}
    results = [[*docs, *second.get(i, _NO_SEARCH).documents] for i, docs in enumerate(first.documents)]
    candidates = [[v for doc in docs for v in value_spans(doc.text, world.cities)] for docs in results]
    answers = _draw_answers(rng, world, chosen, first.queries, results, candidates, typed_answer_share, reading)
    if protocol == "tool-call":
        pieces = _tool_call_pieces(tokenizer, chosen, first, second, answers, template, rendering)
    else:
        pieces = _tokenize_pieces(tokenizer, pool, first, second, answers, template, rendering)
    return [
        _assemble_trace(pieces, i, example, first, second, answers[i], candidates[i], reading[i])
        for i, example in enumerate(chosen)
    ]


def make_copy_drills(
    tokenizer: PreTrainedTokenizerBase,
    *,
    n: int,
    seed: int,
    length: int = 32,
    alphabet: tuple[int, int] = (8, 64),
) -> list[Trace]:
    """Copy drills: `n` random token sequences (`length` tokens, never special) each followed by itself.

    `alphabet` is the inclusive range of distinct tokens per drill. `loss_mask` is 1 on the repeat
    except its first token; `copy_mask` is all 0.
    """
    rng = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    ordinary = [i for i in range(len(tokenizer)) if i not in special]
    drills = []
    for _ in range(n):
        letters = rng.sample(ordinary, rng.randint(*alphabet))
        half = [rng.choice(letters) for _ in range(length)]
        mask = [0] * (length + 1) + [1] * (length - 1)
        drills.append(Trace(input_ids=half + half, loss_mask=mask, copy_mask=[0] * (2 * length)))
    return drills


@dataclass
class _Searches:
    """The names, query kinds, queries and documents found, one entry a trace."""

    names: list[str]
    kinds: list[str]
    queries: list[str]
    documents: list[list[Document]]


@dataclass
class _Search:
    kind: str
    query: str
    documents: list[Document]


_NO_SEARCH = _Search("", "", [])


@dataclass
class _Searcher:
    """Runs the traces' searches, batched, redrawing the queries that find nothing."""

    rng: random.Random
    engine: SearchEngine
    top_k: int
    query_mix: Sequence[float]
    redraw_empty: bool

    def searches(self, questions: list[str], names: list[str], kinds: list[str]) -> _Searches:
        queries = [_random_query(self.rng, q, name, kind) for q, name, kind in zip(questions, names, kinds)]
        return _Searches(names, kinds, queries, self._search(questions, names, kinds, queries))

    def _search(
        self, questions: list[str], names: list[str], kinds: list[str], queries: list[str]
    ) -> list[list[Document]]:
        """Searches all queries in one call; with `redraw_empty`, redraws those that found nothing in place."""
        documents: list[list[Document]] = [[] for _ in queries]
        pending = list(range(len(queries)))
        for attempt in range(1, _MAX_REDRAWS + 1):
            results = self.engine.search([SearchRequest(query=queries[i], top_k=self.top_k) for i in pending])
            for i, docs in zip(pending, results):
                documents[i] = list(docs)
            pending = [i for i in pending if not documents[i]]
            if not pending or not self.redraw_empty:
                return documents
            if attempt == _MAX_REDRAWS:
                break
            last = attempt == _MAX_REDRAWS - 1
            for i in pending:
                kinds[i] = "name" if last else self.rng.choices(QUERY_KINDS, weights=self.query_mix)[0]
                queries[i] = _random_query(self.rng, questions[i], names[i], kinds[i])
        raise ValueError(
            f"{len(pending)} queries, e.g. {queries[pending[0]]!r}, retrieved nothing after {_MAX_REDRAWS - 1} "
            "redraws, the last of them the name alone; check that the engine indexes the world's passages"
        )


def _first_searches(
    searcher: _Searcher, world: World, pool: Sequence[QAExample], n: int, reading_share: float
) -> tuple[list[QAExample], list[bool], _Searches]:
    """The questions drawn, which traces are reading traces, and the first searches."""
    rng = searcher.rng
    chosen = [rng.choice(pool) for _ in range(n)]
    kinds = rng.choices(QUERY_KINDS, weights=searcher.query_mix, k=n)
    reading = [rng.random() < reading_share for _ in range(n)] if reading_share else [False] * n
    kinds = ["name" if read else kind for kind, read in zip(kinds, reading)]
    names = [world.facts[example.id].named for example in chosen]
    return chosen, reading, searcher.searches([example.question for example in chosen], names, kinds)


def _second_searches(
    searcher: _Searcher, world: World, questions: list[str], first: _Searches, share: float
) -> dict[int, _Search]:
    """The second search of a `share` of the traces: a person's name from the first results."""
    rng = searcher.rng
    twice = [i for i in range(len(questions)) if rng.random() < share]
    if not twice:
        return {}
    people = {entity.name for entity in world.entities}
    names = []
    for i in twice:
        found = [w for doc in first.documents[i] for w in _WORD.findall(doc.text) if w in people]
        names.append(rng.choice(list(dict.fromkeys(found))) if found else first.names[i])
    kinds = rng.choices(QUERY_KINDS, weights=searcher.query_mix, k=len(twice))
    second = searcher.searches([questions[i] for i in twice], names, kinds)
    return {i: _Search(second.kinds[j], second.queries[j], second.documents[j]) for j, i in enumerate(twice)}


def _check_trace_args(
    n: int,
    top_k: int,
    query_mix: Sequence[float],
    template: TemplateName,
    typed_answer_share: float,
    reading_share: float,
    two_search_share: float,
) -> None:
    if n < 1 or top_k < 1:
        raise ValueError(f"n={n} and top_k={top_k} must both be >= 1")
    if len(query_mix) != len(QUERY_KINDS) or min(query_mix) < 0 or not math.isclose(sum(query_mix), 1.0):
        raise ValueError(f"query_mix={query_mix} must give {len(QUERY_KINDS)} probabilities {QUERY_KINDS} summing to 1")
    if template == "search-r1-chat":
        raise ValueError("template='search-r1-chat' is not supported for pretraining traces; use 'search-r1'")
    for name, share in (
        ("typed_answer_share", typed_answer_share),
        ("reading_share", reading_share),
        ("two_search_share", two_search_share),
    ):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{name}={share} must lie in [0, 1]")


def _question_pool(world: World, examples: Sequence[QAExample] | None) -> list[QAExample]:
    """The questions to draw from, each checked to belong to `world`."""
    pool = list(world.train if examples is None else examples)
    if not pool:
        raise ValueError("make_traces got no examples to draw questions from")
    for example in pool:
        # Ids repeat across worlds ("train_0"), so the entity must also be the one asked about.
        if example.id not in world.facts or world.facts[example.id].named not in example.question:
            raise ValueError(
                f"example {example.id!r} ({example.question!r}) is not a question of this world "
                "(no fact under its id in world.facts, or another entity); pass world.train or world.test"
            )
    return pool


def _draw_answers(
    rng: random.Random,
    world: World,
    chosen: Sequence[QAExample],
    queries: Sequence[str],
    results: Sequence[list[Document]],
    candidates: Sequence[list[str]],
    typed_answer_share: float,
    reading: Sequence[bool],
) -> list[str]:
    """One answer per trace, drawn from its candidates (or the world's values of the asked kind when none)."""
    answers = []
    for i, values in enumerate(candidates):
        kind = RELATION_KINDS[world.facts[chosen[i].id].relation]
        # Only without redraws can a search find nothing.
        if not results[i]:
            answers.append(rng.choice(world_values(world, kind)))
            continue
        if not values:
            raise ValueError(
                f"the documents retrieved for query {queries[i]!r} hold no city, occupation or year; "
                "make_traces expects a tiny-world corpus"
            )
        if typed_answer_share and rng.random() < typed_answer_share:
            values = [v for v in values if value_kind(v, world.cities) == kind] or values
        answers.append(rng.choice(values))
    for i, example in enumerate(chosen):
        fact = world.facts[example.id]
        if reading[i] and fact.passage_id in {doc.id for doc in results[i]}:
            answers[i] = fact.answer
    return answers


@dataclass
class _TracePieces:
    """The token ids of every piece of the traces, tokenized apart as the rollout tokenizes them."""

    prompt_ids: dict[str, list[int]]  # by example id
    search_ids: list[list[int]]
    head_ids: list[list[int]]  # the observation minus its closing tail
    tail_ids: list[int]
    answer_ids: list[list[int]]
    second_search_ids: dict[int, list[int]]  # by trace index, for the traces that search twice
    second_head_ids: dict[int, list[int]]


def _tokenize_pieces(
    tokenizer: PreTrainedTokenizerBase,
    pool: Sequence[QAExample],
    first: _Searches,
    second: dict[int, _Search],
    answers: Sequence[str],
    template: TemplateName,
    rendering: RenderStyle,
) -> _TracePieces:
    # Tokenized piece by piece, in batches, as the rollout tokenizes them.
    prompt_text = {example.id: render_prompt(example.question, template=template) for example in pool}

    def heads(documents: Sequence[list[Document]]) -> list[list[int]]:
        texts = [wrap_information(render_documents(docs, rendering))[: -len(_OBSERVATION_TAIL)] for docs in documents]
        return _encode(tokenizer, texts) if texts else []

    def searches(queries: Sequence[str]) -> list[list[int]]:
        return _encode(tokenizer, [f"<search> {q} </search>" for q in queries]) if queries else []

    return _TracePieces(
        prompt_ids=dict(zip(prompt_text, tokenizer(list(prompt_text.values()))["input_ids"])),
        search_ids=searches(first.queries),
        head_ids=heads(first.documents),
        tail_ids=_encode(tokenizer, [_OBSERVATION_TAIL])[0],
        answer_ids=_encode(tokenizer, [f"<answer> {a} </answer>" for a in answers]),
        second_search_ids=dict(zip(second, searches([s.query for s in second.values()]))),
        second_head_ids=dict(zip(second, heads([s.documents for s in second.values()]))),
    )


# The tiny world's calls open the query's JSON string with a space: a name copied from the question
# then keeps the tokens it has there (" R", "e", "fo"); right after the quote its first piece is
# another token ("R"), which a tiny base does not learn to copy into its query (docs/toolcall.md).
# The parser strips the space.
CALL_QUERY_PREFIX = " "


def tiny_call(query: str) -> str:
    """The Hermes call a tiny-world trace writes for `query`, its JSON string opening with `CALL_QUERY_PREFIX`."""
    return write_call(CALL_QUERY_PREFIX + query, "hermes")


def _tool_call_pieces(
    tokenizer: PreTrainedTokenizerBase,
    chosen: Sequence[QAExample],
    first: _Searches,
    second: dict[int, _Search],
    answers: Sequence[str],
    template: TemplateName,
    rendering: RenderStyle,
) -> _TracePieces:
    """`_tokenize_pieces` for tool calls: each conversation rendered turn by turn, as the rollout renders it."""
    tools, eos = [search_tool_schema()], tokenizer.eos_token
    prompts: dict[str, list[int]] = {}
    searches, heads, second_searches, second_heads = [], [], {}, {}
    for i, example in enumerate(chosen):
        conversation = ToolConversation(tokenizer, tools, tool_call_messages(example.question, template))
        prompts.setdefault(example.id, _encode(tokenizer, [conversation.text])[0])
        turns = [(first.queries[i], first.documents[i])]
        if i in second:
            turns.append((second[i].query, second[i].documents))
        for turn, (query, documents) in enumerate(turns):
            call = tiny_call(query)
            added = conversation.add_turn(call + eos, call, [render_documents(documents, rendering)])
            search_ids, head_ids = _encode(tokenizer, [call + eos, added])
            if turn == 0:
                searches.append(search_ids)
                heads.append(head_ids)
            else:
                second_searches[i], second_heads[i] = search_ids, head_ids
    return _TracePieces(
        prompt_ids=prompts, search_ids=searches, head_ids=heads, tail_ids=[],
        answer_ids=_encode(tokenizer, [f"<answer> {a} </answer>{eos}" for a in answers]),
        second_search_ids=second_searches, second_head_ids=second_heads,
    )  # fmt: skip


def _assemble_trace(
    pieces: _TracePieces,
    i: int,
    example: QAExample,
    first: _Searches,
    second: dict[int, _Search],
    answer: str,
    candidates: list[str],
    reading: bool,
) -> Trace:
    """Trace `i` assembled from its pieces, with its loss and copy masks."""
    ids = list(pieces.prompt_ids[example.id])
    loss_mask = [0] * len(ids)
    spans = []  # [start, end) of each observation
    turns = [(pieces.search_ids[i], pieces.head_ids[i])]
    if i in second:
        turns.append((pieces.second_search_ids[i], pieces.second_head_ids[i]))
    for search, head in turns:
        observation = head + pieces.tail_ids
        spans.append((len(ids) + len(search), len(ids) + len(search) + len(observation)))
        ids += search + observation
        loss_mask += [0 if reading else 1] * len(search) + [0] * len(observation)
    ids += pieces.answer_ids[i]
    loss_mask += [1] * len(pieces.answer_ids[i])
    copy = [max(marks) for marks in zip(*(copy_mask(ids, start, end) for start, end in spans))]
    extra = second.get(i, _NO_SEARCH)
    return Trace(
        input_ids=ids,
        loss_mask=loss_mask,
        copy_mask=copy,
        example=example,
        query_kind=first.kinds[i],
        query=first.queries[i],
        documents=first.documents[i],
        answer=answer,
        candidates=candidates,
        second_query_kind=extra.kind,
        second_query=extra.query,
        second_documents=extra.documents,
        reading=reading,
    )


def _encode(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[list[int]]:
    # Generated turns and observations carry no BOS/EOS: the rollout appends them as they are.
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def _random_query(rng: random.Random, question: str, name: str, kind: str) -> str:
    words = [w for w in _WORD.findall(question) if w != name]
    # A non-empty random subset of the other question words, in question order.
    subset = sorted(rng.sample(range(len(words)), rng.randint(1, len(words)))) if words else []
    picked = [words[j] for j in subset]
    if kind == "name" or not picked:
        return name
    if kind == "words":
        return " ".join(picked)
    position = rng.randint(0, len(picked))
    return " ".join([*picked[:position], name, *picked[position:]])
