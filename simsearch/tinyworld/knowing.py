"""A simulator that knows the world: its base reads the world's passages, its SFT is fit on other people.

ZeroSearch's simulator is an LLM that read Wikipedia in pretraining and learned, from a light SFT, to
write search results for queries it was never fit on. The quickstart's own simulator differs: its base
never read a fact, and its SFT pairs are BM25's results for the very questions RL then asks. Here,
in miniature, the way ZeroSearch's is made:

- the people split three ways: RL's training people, the held-out people evaluation asks about, and
  the *fit* people (`fit_questions`: the first background people) whose questions the SFT pairs are
  collected on;
- the knowing base is the policy's base after reading (`reading_traces`, LM loss on every token)
  the passages of the training and fit people and of the cities (`reading_passages`), never a
  held-out person's passage, nor the background people's no simulator is ever asked about;
- its SFT pairs are collected (base policy x BM25 over `fit_corpus`: the corpus less RL's and the
  held-out people) on the fit people's questions only, and its SFT file may mix the same reading in
  (`mixed_sft_file`), as a model's pretraining data is mixed into its fine-tuning.

So the knowing simulator is asked, during RL, about people it read of and was never fit on (no pair
asks about them or shows their passages), and no held-out person's fact is in anything it was
trained on. `results_fidelity` compares it with BM25 on RL's questions before any RL.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from simsearch.eval.metrics import substring_exact_match
from simsearch.models import load_model, save_tiny
from simsearch.retrieval.base import SearchEngine
from simsearch.tinyworld.pretrain import pretrain
from simsearch.tinyworld.traces import Trace
from simsearch.tinyworld.world import World
from simsearch.types import Passage, QAExample, SearchRequest


def fit_people(world: World, n_people: int) -> list[str]:
    """The first `n_people` background people (in the world's order): whom the knowing simulator is fit on.

    Raises:
        ValueError: The world has fewer background people.
    """
    background = world.people("background")
    names = [entity.name for entity in world.entities if entity.name in background][:n_people]
    if len(names) < n_people or n_people < 1:
        raise ValueError(
            f"n_people={n_people}: the world has {len(background)} background people to fit a simulator on; "
            "ask for 1 to that many (or build the world with more n_background_entities)"
        )
    return names


def fit_questions(world: World, n_people: int) -> list[QAExample]:
    """The background questions about `fit_people(world, n_people)`, in the world's order."""
    people = set(fit_people(world, n_people))
    return [q for q in world.background if world.facts[q.id].entity in people]


def fit_corpus(world: World) -> list[Passage]:
    """What the knowing simulator's SFT pairs are collected from: the corpus less RL's and the held-out people."""
    return world.passages_without(world.people("train") | world.people("test"))


def reading_passages(world: World, n_fit_people: int) -> list[Passage]:
    """What the knowing base reads: the passages of the training and fit people, and of the cities.

    Never a held-out person's (a passage about a person has their name as its title).
    """
    readers = world.people("train") | set(fit_people(world, n_fit_people))
    return [p for p in world.passages if p.title.strip('"') in readers or p.title.strip('"') in world.cities]


READING_STYLES = ("articles", "mixed")
"""How the knowing base reads an article: `articles` as a wiki page (its passages one a line), `mixed` half of
them so and half as a results page (`Doc i: text` lines under the title, no query)."""


def reading_texts(
    passages: Sequence[Passage], *, n: int, articles: int, seed: int, style: str = "articles"
) -> list[str]:
    """`n` texts of `articles` articles each.

    An article is what a wiki page would be: its title (a person or a city) in double quotes, then
    its passages, one a line, in a random order (under `style="mixed"`, every other article, at
    random, numbered as results are: `Doc 1: ...`). Articles are drawn in shuffled rounds, so each
    is read about equally often.

    Raises:
        ValueError: An unknown style.
    """
    if style not in READING_STYLES:
        raise ValueError(f"style={style!r}: choose one of {', '.join(READING_STYLES)}")
    by_title: dict[str, list[str]] = {}
    for passage in passages:
        by_title.setdefault(passage.title, []).append(passage.text)
    titles = sorted(by_title)
    rng = random.Random(seed)
    order: list[str] = []
    texts = []
    for _ in range(n):
        while len(order) < articles:
            fresh = list(titles)
            rng.shuffle(fresh)
            order += fresh
        chosen, order = order[:articles], order[articles:]
        texts.append("\n\n".join(_article(title, by_title[title], rng, style) for title in chosen))
    return texts


def reading_traces(
    passages: Sequence[Passage],
    tokenizer: PreTrainedTokenizerBase,
    *,
    n: int,
    articles: int,
    seed: int,
    style: str = "articles",
) -> list[Trace]:
    """`reading_texts`, tokenized: every token in the LM loss, nothing in the copy loss."""
    traces = []
    for text in reading_texts(passages, n=n, articles=articles, seed=seed, style=style):
        ids = [*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
        traces.append(Trace(input_ids=ids, loss_mask=[0] + [1] * (len(ids) - 1), copy_mask=[0] * len(ids)))
    return traces


def reading_pairs(passages: Sequence[Passage], *, n: int, articles: int, seed: int, style: str) -> list[dict[str, str]]:
    """`reading_texts` as SFT pairs with an empty prompt (the whole text in the loss): the reading mixed into a
    simulator's SFT file (`mixed_sft_file`), as a model's pretraining data is mixed into its fine-tuning."""
    texts = reading_texts(passages, n=n, articles=articles, seed=seed, style=style)
    return [{"prompt": "", "response": text} for text in texts]


def mixed_sft_file(pairs_file: Path, passages: Sequence[Passage], out: Path, *, share: float, articles: int,
                   seed: int, style: str) -> int:  # fmt: skip
    """Writes `out`: the SFT pairs of `pairs_file`, then reading pairs (`reading_pairs`) making `share` of the
    whole; returns how many reading pairs were added.

    Raises:
        ValueError: `share` not in [0, 1).
    """
    if not 0.0 <= share < 1.0:
        raise ValueError(f"share={share}: the reading's share of the SFT file must be at least 0 and below 1")
    lines = [line for line in pairs_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    n = round(len(lines) * share / (1.0 - share))
    extra = [json.dumps(pair) for pair in reading_pairs(passages, n=n, articles=articles, seed=seed, style=style)]
    out.write_text("".join(f"{line}\n" for line in [*lines, *extra]), encoding="utf-8")
    return n


def _article(title: str, texts: list[str], rng: random.Random, style: str) -> str:
    shuffled = list(texts)
    rng.shuffle(shuffled)
    if style == "mixed" and rng.random() < 0.5:
        shuffled = [f"Doc {i}: {text}" for i, text in enumerate(shuffled, start=1)]
    return "\n".join([title, *shuffled])


def pretrain_knowing_base(
    base: Path,
    out: Path,
    passages: Sequence[Passage],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    articles: int,
    seed: int,
    style: str = "articles",
) -> dict[str, list[float]]:
    """The policy's base at `base`, after reading `passages` for `steps` steps; saved to `out`; the loss history."""
    model, tokenizer = load_model(base)
    traces = reading_traces(passages, tokenizer, n=steps * batch_size, articles=articles, seed=seed, style=style)
    history = pretrain(model, traces, steps=steps, batch_size=batch_size, lr=lr, copy_loss_weight=0.0, seed=seed)
    save_tiny(model, tokenizer, out)
    return history


def title_recall(
    model: Any,  # a Hugging Face causal LM (anything with its `generate`)
    tokenizer: PreTrainedTokenizerBase,
    world: World,
    people: Sequence[str],
    *,
    max_new_tokens: int = 60,
    batch_size: int = 50,
) -> dict[str, float]:
    """What a model recalls of what it read: greedy text after each person's article title (`"Name"` and a
    newline), and per relation the share of `people` whose value it holds (a probe of the reading, not of
    the simulator: it says whether a fact is stored, `results_fidelity` whether it is written into results)."""
    entities = {entity.name: entity for entity in world.entities}
    hits = dict.fromkeys(("birth_city", "occupation", "founding_year"), 0)
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        for start in range(0, len(people), batch_size):
            batch = list(people[start : start + batch_size])
            encoded = tokenizer([f'"{name}"\n' for name in batch], return_tensors="pt", padding=True,
                                add_special_tokens=False)  # fmt: skip
            with torch.no_grad():
                out = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id)  # fmt: skip
            for name, ids in zip(batch, out[:, encoded["input_ids"].shape[1] :], strict=True):
                text = tokenizer.decode(ids, skip_special_tokens=True)
                for relation in hits:
                    hits[relation] += getattr(entities[name], relation) in text
    finally:
        tokenizer.padding_side = side
    return {relation: round(count / len(people), 4) for relation, count in hits.items()}


def names(text: str, person: str) -> bool:
    """Whether `text` names `person` as a word ("Tasbur" is not named in "Tasburg")."""
    return re.search(rf"\b{re.escape(person)}\b", text) is not None


def results_fidelity(
    engine: SearchEngine,
    world: World,
    questions: Sequence[QAExample],
    *,
    top_k: int = 3,
    batch_size: int = 64,
) -> dict[str, float]:
    """How `engine` answers a good query (the question as written, which names its person) for each question.

    Returns:
        `answer_shown`: the share of searches whose results hold a gold answer (the reward's containment);
        `on_topic`: the share of documents that name the asked person (`names`); `documents`: documents per search.

    Raises:
        ValueError: No questions.
    """
    if not questions:
        raise ValueError("results_fidelity needs at least one question")
    shown = on_topic = documents = 0
    for start in range(0, len(questions), batch_size):
        batch = questions[start : start + batch_size]
        requests = [
            SearchRequest(q.question.rstrip("?"), top_k, question=q.question, golden_answers=q.golden_answers)
            for q in batch
        ]
        for question, docs in zip(batch, engine.search(requests), strict=True):
            person = world.facts[question.id].named
            shown += any(substring_exact_match(doc.text, question.golden_answers) for doc in docs)
            on_topic += sum(names(doc.text, person) for doc in docs)
            documents += len(docs)
    n = len(questions)
    return {
        "answer_shown": round(shown / n, 4),
        "on_topic": round(on_topic / documents, 4) if documents else 0.0,
        "documents": round(documents / n, 3),
    }
