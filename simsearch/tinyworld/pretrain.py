"""Pretraining a tiny "base" model on the tag format, in-process: the quickstart's stand-in for a
pretrained LM.

The papers start RL from Qwen-2.5 / LLaMA-3.2 checkpoints that already know the tag syntax well
enough to emit `<search>` and `<answer>` now and then, and can copy text from their context. A
randomly initialised tiny model knows neither, and RL from it would never see a reward. So
`simsearch quickstart` first trains the tiny model on traces of the form

    prompt  <search> query </search>  \\n\\n<information>Doc 1(Title: ...) ...</information>\\n\\n
    <answer> value </answer>

that teach the format and the skill of copying, and nothing RL is meant to find:

- the query is drawn at random from three kinds: the question's entity name alone, a random
  subset of the other question words, or the name mixed with some of those words; so the trace
  never says which query is the right one. By default a query that finds nothing is redrawn,
  which favours the name where no question word occurs in the corpus ("What job does X
  have?"); with `redraw_empty=False` it is kept, and its trace answers with a guess;
- the answer is a value drawn uniformly from all the value-like spans (city names, occupations,
  years) of the retrieved documents, whatever the question asks; so the trace never says which
  document or relation to trust, and a value is the gold answer only as often as chance makes
  it (`make_traces` documents the rate); with `typed_answer_share`, that share of the traces
  draws only among the values of the kind the question asks for (a city for a birthplace): the
  reading any pretrained LM brings, which still leaves open which query finds the entity and
  which of its passages (its birth, or a visit that names another city) holds the answer;
- with `reading_share`, that share are reading traces: the query is the entity name and the
  answer the gold value of the passage stating it (reading comprehension, as a pretrained LM
  has it). Their search turn is out of the LM loss, so they teach reading without teaching
  which query to write; and they are about background people, whose facts no RL or evaluation
  question asks;
- with `two_search_share`, that share of the traces searches twice before answering, the
  multi-turn format (search, read, search again, answer) with nothing more to it: the second
  query is of a random kind as the first, its "name" a person's name copied from the first
  results (any of them), and the answer is drawn from the values of both result sets; so a
  two-hop question's trace finds its answer only as often as chance makes it;
- the information tokens are out of the LM loss (as in RL), so the model never learns a fact of
  the world; an auxiliary **copy loss** trains, inside the information block, only the tokens
  whose bigram already occurred earlier in the sequence (a name repeated from the question, a
  title repeated in the text, the `Doc i(Title:` scaffolding): next-token prediction that
  in-context copying alone can solve, which teaches the copying skill without teaching facts.

The prompt, the search and answer turns and the information block are tokenized apart and
concatenated, exactly as `policy.rollout` assembles a trajectory (prompt with
`render_prompt(...)` and the tokenizer's special tokens, each generated turn on its own, the
observation as `wrap_information(block)` minus its closing tail, then the tail), so pretraining
and RL see the same token sequences.

The answer is drawn from the pooled values of all retrieved documents, not from one random
document, so no relation is favoured (drawing a document first would favour the relation of the
passage holding the fewest values). Why the quickstart needs this stage: docs/quickstart-notes.md.
"""

from __future__ import annotations

import functools
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from simsearch.data.rendering import RenderStyle, render_documents, wrap_information
from simsearch.data.templates import TemplateName, render_prompt
from simsearch.eval.metrics import extract_answer
from simsearch.generation.hf import HFEngine
from simsearch.retrieval.base import SearchEngine
from simsearch.tinyworld.world import OCCUPATIONS, TWO_HOP, YEARS, World
from simsearch.types import Document, QAExample, SamplingParams, SearchRequest

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

    `loss_mask[i]` is 1 when `input_ids[i]` is a token the policy would generate (the search and
    answer turns; the answer turn only, in a reading trace), 0 on the prompt and the information
    block. `copy_mask[i]` is 1 on the tokens of the information block whose bigram
    `(input_ids[i-1], input_ids[i])` occurs at an earlier position of the sequence. Both masks
    mark targets: position i is predicted from the tokens before it.
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


def value_spans(text: str, cities: Sequence[str]) -> list[str]:
    """The value-like spans of a passage: city names, occupations and years, in text order.

    Whole words only: "bakers" holds no "baker", "17120" no year.

    Args:
        text: Passage text.
        cities: The world's city names.

    Returns:
        Every occurrence (repeats included), ordered by position in the text.
    """
    return _value_pattern(tuple(cities)).findall(text)


RELATION_KINDS = {"birth_city": "city", "occupation": "occupation", "founding_year": "year", TWO_HOP: "city"}
"""The kind of value (`value_kind`) each tiny-world relation asks for."""


def value_kind(value: str, cities: Sequence[str]) -> str:
    """ "city", "year" or "occupation": the kind of a span `value_spans` found."""
    if value in cities:
        return "city"
    return "year" if value.isdigit() else "occupation"


@functools.lru_cache(maxsize=8)
def _value_pattern(cities: tuple[str, ...]) -> re.Pattern[str]:
    # One alternation, longest first, so "salt trader" is preferred over any shorter value.
    values = sorted((*cities, *OCCUPATIONS), key=len, reverse=True)
    return re.compile(r"\b(?:" + "|".join(map(re.escape, values)) + r"|\d{4})\b")


def copy_mask(input_ids: Sequence[int], start: int, end: int) -> list[int]:
    """Marks the tokens in `[start, end)` whose bigram already occurred earlier in the sequence.

    Position i (start <= i < end, i >= 1) gets 1 when `(input_ids[i-1], input_ids[i])` equals
    `(input_ids[j-1], input_ids[j])` for some 1 <= j < i: the token can be predicted by copying
    what followed the same token before.

    Args:
        input_ids: The whole sequence.
        start: First position that may be marked.
        end: One past the last position that may be marked.

    Returns:
        A 0/1 list as long as `input_ids`.
    """
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
) -> list[Trace]:
    """Builds `n` pretraining traces with random queries and randomly copied answers.

    Each trace takes a question drawn uniformly from `examples`, a query of a kind drawn with
    `query_mix`, the top-k documents `engine` returns for it (all queries in one batched
    `search` call; a query that retrieves nothing is redrawn, kind included, unless
    `redraw_empty` is False), and as answer a value drawn uniformly from the pooled `value_spans`
    of those documents. The answer is therefore the gold answer exactly as often as the gold
    answer's share of the candidates: about 1/6 for a query holding the entity name (its three
    passages hold six values), about 0 otherwise. Reading traces (`reading_share`) differ: the
    name alone, the gold answer. The name of a two-hop question (`world.TWO_HOP`) is the
    venture's, which finds the founding passage only.

    Args:
        world: The tiny world: questions, facts (for the entity name) and city names.
        engine: The search engine the rollout will use (BM25 in the quickstart).
        tokenizer: The policy's tokenizer.
        n: Number of traces.
        seed: Seeds every random choice; the same arguments give the same traces.
        top_k: Documents per search, as in the rollout.
        template: Prompt template, rendered with `render_prompt` as the rollout renders it;
            "search-r1-chat" is not supported (its rendering needs the tokenizer's chat template).
        query_mix: Probabilities of the query kinds `QUERY_KINDS` (name, words, mixed).
        examples: Questions to draw from; defaults to `world.train` (held-out questions must stay
            unseen).
        typed_answer_share: Share of traces whose answer is drawn only from the candidates of
            the kind the question asks for (a city for a birthplace, `value_kind`), when the
            documents hold one; the rest draw from all candidates.
        reading_share: Share of reading traces (module docstring): query the name alone, out of
            the LM loss, answer the gold value when the results hold the answer passage
            (`Fact.passage_id`). Drawn only when > 0: at 0 (the default) the traces are those of
            before.
        redraw_empty: Redraw a query that retrieves nothing (the default). False keeps it: the
            information block is empty and the answer a value of the asked kind drawn from the
            whole world (`world.cities`, `OCCUPATIONS`, `YEARS`), a guess.
        rendering: How the documents are shown, as in the rollout (`render_documents`).
        two_search_share: Share of traces that search a second time before answering (module
            docstring); drawn after the first searches and before the answers, but only when the
            share is > 0: at 0 (the default) nothing is drawn and the traces are those of before.

    Returns:
        The traces, in draw order.

    Raises:
        ValueError: A bad `n`, `top_k`, `query_mix`, `typed_answer_share`, `two_search_share` or template, a
            question whose fact is not in `world.facts`, or queries that still retrieve nothing
            after repeated redraws.
    """
    _check_trace_args(n, top_k, query_mix, template, typed_answer_share, reading_share, two_search_share)
    pool = _question_pool(world, examples)

    rng = random.Random(seed)
    chosen = [rng.choice(pool) for _ in range(n)]
    kinds = rng.choices(QUERY_KINDS, weights=query_mix, k=n)
    reading = [rng.random() < reading_share for _ in range(n)] if reading_share else [False] * n
    kinds = ["name" if read else kind for kind, read in zip(kinds, reading)]
    names = [world.facts[example.id].named for example in chosen]
    queries = [_random_query(rng, example.question, name, kind) for example, name, kind in zip(chosen, names, kinds)]
    questions = [example.question for example in chosen]
    documents = _search(rng, engine, questions, names, kinds, queries, top_k, query_mix, redraw_empty)
    first = _Searches(names, kinds, queries, documents)
    second = (
        _second_searches(rng, engine, world, questions, first, two_search_share, top_k, query_mix, redraw_empty)
        if two_search_share
        else {}
    )
    results = [[*docs, *second.get(i, _NO_SEARCH).documents] for i, docs in enumerate(first.documents)]
    candidates = [[v for doc in docs for v in value_spans(doc.text, world.cities)] for docs in results]
    # Only without redraws can a search find nothing.
    answers = _draw_answers(
        rng, world, chosen, queries, [bool(docs) for docs in results], candidates, typed_answer_share
    )
    for i, example in enumerate(chosen):
        fact = world.facts[example.id]
        if reading[i] and fact.passage_id in {doc.id for doc in results[i]}:
            answers[i] = fact.answer

    pieces = _tokenize_pieces(tokenizer, pool, first, second, answers, template, rendering)
    return [
        _assemble_trace(pieces, i, example, first, second, answers[i], candidates[i], reading[i])
        for i, example in enumerate(chosen)
    ]


@dataclass
class _Searches:
    """The names queries were drawn around, query kinds, queries and the documents found, one entry a trace."""

    names: list[str]
    kinds: list[str]
    queries: list[str]
    documents: list[list[Document]]


@dataclass
class _Search:
    """One trace's second search."""

    kind: str
    query: str
    documents: list[Document]


_NO_SEARCH = _Search("", "", [])


def _second_searches(
    rng: random.Random,
    engine: SearchEngine,
    world: World,
    questions: list[str],
    first: _Searches,
    share: float,
    top_k: int,
    query_mix: Sequence[float],
    redraw_empty: bool,
) -> dict[int, _Search]:
    """The second search of a `share` of the traces, by trace index.

    Its "name" is a person's name drawn uniformly from the distinct ones in the first results
    (the first search's name when they hold none), its kind drawn as the first's.
    """
    twice = [i for i in range(len(questions)) if rng.random() < share]
    if not twice:
        return {}
    people = {entity.name for entity in world.entities}
    names = []
    for i in twice:
        found = [w for doc in first.documents[i] for w in _WORD.findall(doc.text) if w in people]
        names.append(rng.choice(list(dict.fromkeys(found))) if found else first.names[i])
    kinds = rng.choices(QUERY_KINDS, weights=query_mix, k=len(twice))
    asked = [questions[i] for i in twice]
    queries = [_random_query(rng, question, name, kind) for question, name, kind in zip(asked, names, kinds)]
    documents = _search(rng, engine, asked, names, kinds, queries, top_k, query_mix, redraw_empty)
    return {i: _Search(kinds[j], queries[j], documents[j]) for j, i in enumerate(twice)}


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
    """The questions to draw from (`world.train` by default), each checked to belong to `world`."""
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
    found: Sequence[bool],
    candidates: Sequence[list[str]],
    typed_answer_share: float,
) -> list[str]:
    """One answer per trace, drawn from its candidates (typed to the question for a share), or from
    the whole world's values of the asked kind when the search found nothing."""
    answers = []
    for i, values in enumerate(candidates):
        kind = RELATION_KINDS[world.facts[chosen[i].id].relation]
        if not found[i]:
            answers.append(rng.choice(_world_values(world, kind)))
            continue
        if not values:
            raise ValueError(
                f"the documents retrieved for query {queries[i]!r} hold no city, occupation or year; "
                "make_traces expects a tiny-world corpus"
            )
        if typed_answer_share and rng.random() < typed_answer_share:
            values = [v for v in values if value_kind(v, world.cities) == kind] or values
        answers.append(rng.choice(values))
    return answers


def _world_values(world: World, kind: str) -> Sequence[str]:
    """Every value of `kind` ("city", "occupation" or "year") the world's passages can hold."""
    return {"city": world.cities, "occupation": OCCUPATIONS, "year": YEARS}[kind]


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
    """Trace `i`: prompt, search turn, observation (again, for a two-search trace) and answer turn, with its
    loss and copy masks."""
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


def make_copy_drills(
    tokenizer: PreTrainedTokenizerBase,
    *,
    n: int,
    seed: int,
    length: int = 32,
    alphabet: tuple[int, int] = (8, 64),
) -> list[Trace]:
    """Copy drills: a random token sequence followed by itself, the LM loss on the repeat.

    A few hundred steps on these form induction heads (attend to the earlier occurrence of the
    current context, predict what followed it) far faster than the search traces alone, whose
    copy targets are few and mostly ambiguous single-token matches. Each drill draws its tokens
    from a random alphabet of 8-64 ordinary tokens, so in small alphabets single tokens repeat
    and only the preceding tokens together say where to copy from, as when copying a name that
    shares its first piece with another. Drills hold no text at all, let alone world facts.

    Args:
        tokenizer: The policy's tokenizer; its special tokens are never drawn.
        n: Number of drills.
        seed: Seeds the tokens.
        length: Tokens per half; a drill has 2 * length tokens.
        alphabet: Range (inclusive) of the number of distinct tokens per drill.

    Returns:
        Traces with `loss_mask` 1 on the second half except its first token (which cannot be
        predicted), `copy_mask` all 0 and no search metadata.
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


def _encode(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[list[int]]:
    # Generated turns and observations carry no BOS/EOS: the rollout appends them as they are.
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def _random_query(rng: random.Random, question: str, name: str, kind: str) -> str:
    """A query of `kind` for a question about `name`."""
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


def _search(
    rng: random.Random,
    engine: SearchEngine,
    questions: list[str],
    names: list[str],
    kinds: list[str],
    queries: list[str],
    top_k: int,
    query_mix: Sequence[float],
    redraw_empty: bool,
) -> list[list[Document]]:
    """Searches all queries in one call; with `redraw_empty`, redraws (in place) kind and query of
    those that found nothing until they find something.

    The kind is redrawn too: for some phrasings ("What job does X have?") no subset of the
    question words occurs in the corpus, so only a query with the name finds anything. The last
    redraw is the name alone, which finds its person's passages whatever `query_mix` says.
    """
    documents: list[list[Document]] = [[] for _ in queries]
    pending = list(range(len(queries)))
    for attempt in range(1, _MAX_REDRAWS + 1):
        results = engine.search([SearchRequest(query=queries[i], top_k=top_k) for i in pending])
        for i, docs in zip(pending, results):
            documents[i] = list(docs)
        pending = [i for i in pending if not documents[i]]
        if not pending or not redraw_empty:
            return documents
        if attempt == _MAX_REDRAWS:
            break
        last = attempt == _MAX_REDRAWS - 1
        for i in pending:
            kinds[i] = "name" if last else rng.choices(QUERY_KINDS, weights=query_mix)[0]
            queries[i] = _random_query(rng, questions[i], names[i], kinds[i])
    raise ValueError(
        f"{len(pending)} queries, e.g. {queries[pending[0]]!r}, retrieved nothing after {_MAX_REDRAWS - 1} "
        "redraws, the last of them the name alone; check that the engine indexes the world's passages"
    )


def trace_loss(
    model: PreTrainedModel,
    traces: Sequence[Trace],
    *,
    copy_loss_weight: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The pretraining loss of a batch: LM loss on policy tokens plus the weighted copy loss.

    Each part is a mean over its own marked target tokens in the batch; the total is
    `policy + copy_loss_weight * copy`.

    Two shortcuts, both exact: the prefix all traces of the batch share (the prompt template up
    to the question, ~110 of ~250 tokens) runs through the model once and its keys and values
    are broadcast to the batch, since under causal attention its hidden states do not depend on
    what follows; and the vocabulary projection runs only on positions with a marked target.
    Sequences are right-padded with no attention mask: causal attention already keeps every
    real token from seeing the padding after it, and padded positions carry no target.

    Args:
        model: A Hugging Face causal LM exposing `get_decoder()` and `get_output_embeddings()`,
            whose decoder takes `past_key_values` (a `DynamicCache`).
        traces: The batch.
        copy_loss_weight: Weight of the copy loss; 0 skips it.

    Returns:
        (total loss with gradient, {"losses/total", "losses/policy", "losses/copy"} as floats).
    """
    device = next(model.parameters()).device
    width = max(len(t.input_ids) for t in traces)
    ids = torch.zeros((len(traces), width), dtype=torch.long)  # [B, L]
    policy_mask = torch.zeros_like(ids)
    copy = torch.zeros_like(ids)
    for b, trace in enumerate(traces):
        length = len(trace.input_ids)
        ids[b, :length] = torch.tensor(trace.input_ids)
        policy_mask[b, :length] = torch.tensor(trace.loss_mask)
        copy[b, :length] = torch.tensor(trace.copy_mask)
    if copy_loss_weight == 0:
        copy.zero_()
    shared = _shared_prefix(traces, policy_mask + copy)
    ids, policy_mask, copy = ids.to(device), policy_mask.to(device), copy.to(device)

    decoder = model.get_decoder()
    cache = None
    if shared > 0:
        cache = decoder(input_ids=ids[:1, :shared], use_cache=True).past_key_values
        for layer in cache.layers:  # [1, kv_heads, P, head_dim] -> [B, kv_heads, P, head_dim]
            layer.keys = layer.keys.expand(len(traces), -1, -1, -1)
            layer.values = layer.values.expand(len(traces), -1, -1, -1)
    suffix = decoder(input_ids=ids[:, shared:], past_key_values=cache, use_cache=cache is not None)
    hidden = suffix.last_hidden_state  # [B, L-P, H]
    targets = ids[:, shared + 1 :]  # [B, L-P-1]: position i is predicted from hidden state i-1
    policy_mask, copy = policy_mask[:, shared + 1 :], copy[:, shared + 1 :]
    selected = (policy_mask + copy) > 0  # [B, L-P-1]
    logits = model.get_output_embeddings()(hidden[:, :-1][selected])  # [N, V]
    token_loss = F.cross_entropy(logits.float(), targets[selected], reduction="none")  # [N]
    policy_weights = policy_mask[selected].float()  # [N]
    copy_weights = copy[selected].float()  # [N]
    policy_loss = (token_loss * policy_weights).sum() / policy_weights.sum().clamp(min=1.0)
    copy_loss = (token_loss * copy_weights).sum() / copy_weights.sum().clamp(min=1.0)
    total = policy_loss + copy_loss_weight * copy_loss
    stats = {
        "losses/total": total.item(),
        "losses/policy": policy_loss.item(),
        "losses/copy": copy_loss.item(),
    }
    return total, stats


def _shared_prefix(traces: Sequence[Trace], marked: torch.Tensor) -> int:
    """Length P of the prefix to run once: shared by all traces and holding no marked target.

    A target at position i needs the hidden state at i - 1, so every marked position must be
    at least P + 1. `marked` is [B, L], nonzero where a target is marked.
    """
    first = traces[0].input_ids
    common = min(len(t.input_ids) for t in traces)
    for trace in traces[1:]:
        common = next((i for i, (a, b) in enumerate(zip(first, trace.input_ids[:common])) if a != b), common)
    positions = marked.nonzero()[:, 1]
    first_marked = int(positions.min()) if len(positions) else common + 1
    # Keep at least one token for the second pass (which also predicts the first suffix token).
    return max(0, min(common, first_marked - 1, common - 1))


def pretrain(
    model: PreTrainedModel,
    traces: Sequence[Trace],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    copy_loss_weight: float,
    seed: int,
    warmup: float = 0.05,
    min_lr_ratio: float = 0.1,
    weight_decay: float = 0.01,
    max_grad_norm: float = 1.0,
    progress: bool = True,
) -> dict[str, list[float]]:
    """Trains `model` in place on `traces`: AdamW, linear warmup, cosine decay, gradient clipping.

    Batches are consecutive slices of a seeded shuffle of the traces, reshuffled every epoch.

    Args:
        model: The model to train (left in eval mode afterwards).
        traces: From `make_traces`.
        steps: Optimizer steps.
        batch_size: Traces per step.
        lr: Peak learning rate.
        copy_loss_weight: Weight of the copy loss (see `trace_loss`).
        seed: Seeds the batch order.
        warmup: Share of `steps` spent warming up linearly from 0 to `lr`.
        min_lr_ratio: The cosine ends at `lr * min_lr_ratio`.
        weight_decay: AdamW weight decay.
        max_grad_norm: Gradient-norm clip.
        progress: Show a tqdm progress bar.

    Returns:
        Per-step lists under "losses/total", "losses/policy", "losses/copy", "lr" and
        "grad_norm".

    Raises:
        ValueError: Non-positive steps or batch size, or no traces.
    """
    if steps < 1 or batch_size < 1 or not traces:
        raise ValueError(f"steps={steps} and batch_size={batch_size} must be >= 1 and traces non-empty")
    warmup_steps = max(1, round(warmup * steps))

    def schedule(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        done = (step - warmup_steps) / max(1, steps - warmup_steps)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * done))

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    rng = random.Random(seed)
    order: list[int] = []
    keys = ("losses/total", "losses/policy", "losses/copy", "lr", "grad_norm")
    history: dict[str, list[float]] = {key: [] for key in keys}
    model.train()
    try:
        bar = tqdm(range(steps), desc="pretrain", disable=not progress)
        for _ in bar:
            if len(order) < batch_size:
                fresh = list(range(len(traces)))
                rng.shuffle(fresh)
                order += fresh
            batch, order = [traces[i] for i in order[:batch_size]], order[batch_size:]
            loss, stats = trace_loss(model, batch, copy_loss_weight=copy_loss_weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            history["lr"].append(float(scheduler.get_last_lr()[0]))
            optimizer.step()
            scheduler.step()
            for key, value in stats.items():
                history[key].append(value)
            history["grad_norm"].append(float(grad_norm))
            bar.set_postfix(policy=f"{stats['losses/policy']:.3f}", copy=f"{stats['losses/copy']:.3f}")
    finally:
        model.eval()
    return history


QUERY_NAMING: tuple[str, ...] = ("exact", "miscopied", "unnamed")
"""How a query names the person its question asks about (`query_naming`)."""


def query_naming(query: str, name: str) -> str:
    """How `query` names the person `name`, one of `QUERY_NAMING`.

    `exact`: the name is one of the query's words. `miscopied`: it is not, but a word starting
    with the name's first three letters is (the first syllable copied, the rest not: `Konis`
    searched as `Konbe`). `unnamed`: neither (question words only). A miscopied query finds
    nobody; RL has to learn to name the person, and a policy that cannot copy names cannot.
    """
    words = re.findall(r"[A-Za-z]+", query)
    if name in words:
        return "exact"
    return "miscopied" if any(word.startswith(name[:3]) for word in words) else "unnamed"


def reading_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    world: World,
    engine: SearchEngine,
    examples: Sequence[QAExample],
    *,
    top_k: int,
    template: TemplateName,
    rendering: RenderStyle,
    batch_size: int = 64,
) -> dict[str, dict[str, float]]:
    """How well a base model reads results, per relation: what RL has to start from.

    Each one-hop question is searched with its entity's name (the query RL should learn), and the
    model continues greedily after the results block, as in a rollout's answer turn. Two-hop
    questions are left out: one search for the entity does not find their answer. Per relation,
    the shares of questions whose answer is (`score_reading`)

    - `copied`: a value of the asked kind found in the results, written whole (a year, a city);
    - `invented`: a value of the asked kind found nowhere in the results (digits or name
      pieces mixed up while copying);
    - `right`: the gold answer.

    Args:
        model: The policy (any causal LM, greedy decoding).
        tokenizer: Its tokenizer.
        world: The tiny world the examples come from.
        engine: The search engine (BM25 in the quickstart).
        examples: Questions of `world` (held-out ones measure the skill, not memory).
        top_k: Documents per search, as in RL.
        template: The policy prompt template, as in RL.
        rendering: How results are shown, as in RL.
        batch_size: Prompts per generation batch.

    Returns:
        {relation: {"copied", "invented", "right", "questions"}} plus the same under "all".
    """
    examples = [example for example in examples if world.facts[example.id].relation != TWO_HOP]
    names = [world.facts[example.id].entity for example in examples]
    documents = engine.search([SearchRequest(query=name, top_k=top_k) for name in names])
    prompt_ids = tokenizer([render_prompt(e.question, template=template) for e in examples])["input_ids"]
    search_ids = _encode(tokenizer, [f"<search> {name} </search>" for name in names])
    observation_ids = _encode(tokenizer, [wrap_information(render_documents(docs, rendering)) for docs in documents])
    contexts = [p + s + o for p, s, o in zip(prompt_ids, search_ids, observation_ids)]
    params = SamplingParams(temperature=0.0, max_new_tokens=24, stop=["</answer>"])
    completions = HFEngine(model, tokenizer, batch_size=batch_size, prefix_cache=False).generate(contexts, params)
    return score_reading(world, examples, documents, [completion.text for completion in completions])


def score_reading(
    world: World, examples: Sequence[QAExample], documents: Sequence[list[Document]], completions: Sequence[str]
) -> dict[str, dict[str, float]]:
    """`reading_accuracy`'s shares, from each one-hop question's results and the answer turn written after them."""
    counts: dict[str, dict[str, float]] = {}
    cities = world.cities
    for example, docs, completion in zip(examples, documents, completions, strict=True):
        relation = world.facts[example.id].relation
        kind = RELATION_KINDS[relation]
        found = {v for doc in docs for v in value_spans(doc.text, cities) if value_kind(v, cities) == kind}
        answer = (extract_answer(completion) or "").strip()
        is_kind = bool(answer) and value_spans(answer, cities) == [answer] and value_kind(answer, cities) == kind
        for key in (relation, "all"):
            row = counts.setdefault(key, dict.fromkeys(("copied", "invented", "right", "questions"), 0.0))
            row["copied"] += is_kind and answer in found
            row["invented"] += is_kind and answer not in found
            row["right"] += answer in example.golden_answers
            row["questions"] += 1
    for row in counts.values():
        for key in ("copied", "invented", "right"):
            row[key] /= row["questions"]
    return counts
