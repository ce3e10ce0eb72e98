"""The knowing simulator's world: three groups of people, what its base reads, and no held-out fact in any of it."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from simsearch.models import build_tiny_model, load_model, save_tiny
from simsearch.retrieval.bm25 import BM25SearchEngine
from simsearch.retrieval.empty import EmptySearchEngine
from simsearch.tinyworld.knowing import (
    fit_corpus,
    fit_people,
    fit_questions,
    mixed_sft_file,
    names,
    pretrain_knowing_base,
    reading_passages,
    reading_texts,
    reading_traces,
    results_fidelity,
    title_recall,
)
from simsearch.tinyworld.world import build_world
from simsearch.types import Document


@pytest.fixture(scope="module")
def three_groups():
    return build_world(seed=5, n_entities=24, n_train_entities=16, n_cities=6, n_background_entities=20)


def _held_out_facts(world) -> set[str]:
    """Every held-out person's name: each of their passages, and each question about them, holds it."""
    return world.people("test")


def test_the_fit_people_are_neither_rl_nor_held_out_people(three_groups) -> None:
    world = three_groups
    fit = fit_people(world, 8)
    assert len(fit) == len(set(fit)) == 8
    assert not set(fit) & (world.people("train") | world.people("test"))
    questions = fit_questions(world, 8)
    assert len(questions) == 3 * 8  # one a relation
    assert {world.facts[q.id].entity for q in questions} == set(fit)
    assert fit_people(world, 3) == fit[:3]  # the first ones, in the world's order: a prefix
    with pytest.raises(ValueError, match="20 background people"):
        fit_people(world, 21)
    # The SFT pairs are collected from a corpus without RL's and the held-out people: no pair shows them.
    corpus = fit_corpus(world)
    assert len(corpus) == len(world.passages) - 3 * 24
    assert not any(names(p.text, name) for p in corpus for name in world.people("train") | world.people("test"))
    assert {p.title.strip('"') for p in corpus} >= set(fit)


def test_the_knowing_base_reads_rl_and_fit_people_and_cities_never_a_held_out_person(three_groups, tokenizer) -> None:
    world = three_groups
    passages = reading_passages(world, 8)
    titles = {p.title.strip('"') for p in passages}
    assert titles == world.people("train") | set(fit_people(world, 8)) | set(world.cities)
    assert len(passages) == 3 * (16 + 8) + 6  # bio, founding and visit of each person, one a city
    held_out = _held_out_facts(world)
    # No held-out name in any passage read, nor in any sequence the base trains on.
    assert not any(names(p.text, name) for p in passages for name in held_out)
    traces = reading_traces(passages, tokenizer, n=60, articles=2, seed=0)
    texts = [tokenizer.decode(t.input_ids) for t in traces]
    assert not any(names(text, name) for text in texts for name in held_out)
    # The reading is read: every token but the first in the loss, none in the copy loss; an article is a title
    # line, then its passages; articles come in shuffled rounds: 60 x 2 = 120 reads of 30 articles, 4 each.
    assert all(sum(t.loss_mask) == len(t.input_ids) - 1 and not any(t.copy_mask) for t in traces)
    read = Counter(line.strip('"') for text in texts for line in text.split("\n") if line.startswith('"'))
    assert set(read) == titles and set(read.values()) == {4}


def test_mixed_reading_numbers_half_the_articles_as_results_and_reads_the_same_articles(three_groups) -> None:
    passages = reading_passages(three_groups, 8)
    plain = reading_texts(passages, n=200, articles=1, seed=3)
    mixed = reading_texts(passages, n=200, articles=1, seed=3, style="mixed")
    assert not any("Doc 1: " in text for text in plain)
    as_results = [text for text in mixed if text.split("\n")[1].startswith("Doc 1: ")]
    assert 70 <= len(as_results) <= 130  # about half, at random
    for text in as_results:  # a title, then its passages numbered from 1
        lines = text.split("\n")
        assert lines[0].startswith('"') and [line.split(": ")[0] for line in lines[1:]] == [
            f"Doc {i}" for i in range(1, len(lines))
        ]
    # Numbered or not, every article is read equally often: 210 reads of 30 articles, 7 each.
    titles = Counter(text.split("\n")[0] for text in reading_texts(passages, n=210, articles=1, seed=3, style="mixed"))
    assert len(titles) == 30 and set(titles.values()) == {7}
    with pytest.raises(ValueError, match="style='wiki'"):
        reading_texts(passages, n=1, articles=1, seed=0, style="wiki")


def test_the_mixed_sft_file_keeps_every_pair_and_adds_reading_to_the_share(three_groups, tmp_path) -> None:
    pairs = tmp_path / "train.jsonl"
    rows = [{"prompt": f"Query: q{i}\nResults:\n", "response": f"Doc 1: d{i}"} for i in range(30)]
    pairs.write_text("".join(json.dumps(row) + "\n" for row in rows))
    passages = reading_passages(three_groups, 8)
    out = tmp_path / "mixed.jsonl"
    added = mixed_sft_file(pairs, passages, out, share=0.25, articles=2, seed=0, style="articles")
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert added == 10 and written[:30] == rows and len(written) == 40  # 10 of 40: a quarter
    reading = written[30:]
    assert all(row["prompt"] == "" and row["response"].startswith('"') for row in reading)
    assert not any(names(row["response"], name) for row in reading for name in three_groups.people("test"))
    assert mixed_sft_file(pairs, passages, out, share=0.0, articles=2, seed=0, style="articles") == 0
    assert out.read_text().splitlines() == pairs.read_text().splitlines()
    with pytest.raises(ValueError, match="below 1"):
        mixed_sft_file(pairs, passages, out, share=1.0, articles=2, seed=0, style="articles")


def test_pretraining_the_knowing_base_lowers_its_loss_and_saves_it(three_groups, tokenizer, tmp_path) -> None:
    model = build_tiny_model(tokenizer, hidden=32, layers=1, heads=2, kv_heads=1, ffn=64, seed=0)
    save_tiny(model, tokenizer, tmp_path / "base")
    passages = reading_passages(three_groups, 4)
    history = pretrain_knowing_base(
        tmp_path / "base", tmp_path / "knowing", passages, steps=30, batch_size=4, lr=5e-3, articles=1, seed=0
    )
    assert history["losses/policy"][-1] < history["losses/policy"][0]
    assert history["losses/copy"] == [0.0] * 30
    loaded, _ = load_model(tmp_path / "knowing")
    assert sum(p.numel() for p in loaded.parameters()) == sum(p.numel() for p in model.parameters())


class Scripted:
    """Answers every search with the asked person's answer passage, then a city's passage (the question's
    facts are looked up in `world`)."""

    def __init__(self, world) -> None:
        self.facts = {q.question: world.facts[q.id] for q in world.train}
        self.by_id = {p.id: p for p in world.passages}
        self.city = next(p for p in world.passages if p.title.strip('"') in world.cities)
        self.queries: list[str] = []

    def search(self, requests):
        self.queries += [r.query for r in requests]
        answers = [self.by_id[self.facts[r.question].passage_id] for r in requests]
        return [[Document(title="", text=a.text), Document(title="", text=self.city.text)] for a in answers]


def test_a_name_is_named_as_a_word() -> None:
    # A held-out "Tasbur" is not named by a passage about the city "Tasburg" (world 0 has both).
    assert names("Rosur was born in the town of Tasburg.", "Rosur")
    assert not names("Rosur was born in the town of Tasburg.", "Tasbur")
    assert names('"Tasbur"\nIn 1700, Tasbur founded a bank.', "Tasbur")


def test_results_fidelity_shares_by_hand_and_against_bm25(three_groups) -> None:
    world = three_groups
    questions = world.train[:30]
    scripted = Scripted(world)
    # Each search shows the answer; of its two documents one names the person: 1.0, 0.5, 2 documents.
    figures = results_fidelity(scripted, world, questions, batch_size=7)
    assert figures == {"answer_shown": 1.0, "on_topic": 0.5, "documents": 2.0}
    assert scripted.queries == [q.question.rstrip("?") for q in questions]  # the question as written, 5 batches
    bm25 = results_fidelity(BM25SearchEngine.build(world.passages, show_progress=False), world, questions)
    # The question names its person: BM25 finds a passage that holds the answer; most of its documents are theirs.
    assert bm25["answer_shown"] == 1.0 and bm25["on_topic"] > 0.6 and bm25["documents"] == 3.0
    assert results_fidelity(EmptySearchEngine(), world, questions) == {"answer_shown": 0.0, "on_topic": 0.0,
                                                                        "documents": 0.0}  # fmt: skip
    with pytest.raises(ValueError, match="at least one question"):
        results_fidelity(EmptySearchEngine(), world, [])


def test_title_recall_counts_the_facts_written_after_a_title(three_groups, tokenizer) -> None:
    world = three_groups
    people = sorted(world.people("train"))[:3]
    entities = {e.name: e for e in world.entities}

    class Reader:
        """Writes, after a title, the person's city and occupation (not the year), for the first two people only."""

        def generate(self, input_ids, attention_mask, max_new_tokens, do_sample, pad_token_id):
            assert not do_sample and tokenizer.padding_side == "left"
            rows = []
            for row in input_ids:
                title = tokenizer.decode(row, skip_special_tokens=True)
                name = title.strip().strip('"')
                fact = (
                    f" born in {entities[name].birth_city}, {entities[name].occupation}" if name in people[:2] else ""
                )
                rows.append(row.tolist() + tokenizer(fact, add_special_tokens=False)["input_ids"])
            width = max(map(len, rows))
            return torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])

    side = tokenizer.padding_side
    recall = title_recall(Reader(), tokenizer, world, people, batch_size=2)
    assert recall == {"birth_city": 0.6667, "occupation": 0.6667, "founding_year": 0.0}  # 2 of 3, 2 of 3, none
    assert tokenizer.padding_side == side  # put back
