"""`simulator collect` turns a policy's real searches into balanced simulator SFT pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simsearch.commands import simulator_collect
from simsearch.config import CollectRecipe, load_recipe
from simsearch.errors import RecipeError, SimsearchError
from simsearch.models import train_tokenizer
from simsearch.tinyworld.world import build_world
from simsearch.types import Completion


class ScriptedPolicy:
    """Searches for the entity named in the prompt's question on turn one, then answers."""

    def __init__(self, tokenizer, world) -> None:
        self.tokenizer = tokenizer
        self.names = sorted((f.entity for f in world.facts.values()), key=len, reverse=True)
        self.calls = 0

    def generate(self, prompts, params):
        self.calls += 1
        out = []
        for ids in prompts:
            text = self.tokenizer.decode(ids)
            question = text[text.rindex("Question:") :]
            name = next(n for n in self.names if n in question)
            # Alternate a good query (the name) and a bad one (question words only).
            query = name if len(out) % 2 == 0 else "who was born"
            searched = "<information>" in question  # the template itself mentions the tag earlier
            reply = "<answer> x </answer>" if searched else f"<search> {query} </search>"
            reply_ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
            stop = "</search>" if reply.endswith("</search>") else "</answer>"
            out.append(Completion(token_ids=reply_ids, text=reply, finish_reason="stop", stop=stop))
        return out


@pytest.fixture
def world_files(tmp_path: Path):
    world = build_world(seed=1, n_entities=30, n_train_entities=20, n_cities=6)
    return world, world.write(tmp_path / "world")


def _collect(tmp_path: Path, world_files, monkeypatch, *overrides: str) -> tuple[dict, ScriptedPolicy]:
    """Runs collect with the scripted policy and real BM25 (top 2) over the world's train questions."""
    world, files = world_files
    tokenizer = train_tokenizer(world.texts_for_tokenizer(300), vocab_size=600)
    policy = ScriptedPolicy(tokenizer, world)
    monkeypatch.setattr(simulator_collect, "build_generation_engine", lambda cfg: (policy, tokenizer, None))
    recipe = load_recipe(
        CollectRecipe,
        None,
        [
            f"run_dir={tmp_path / 'collect'}",
            "policy.model.path=scripted",
            f"data.train=[{files['train']}]",
            f"search.corpus={files['corpus']}",
            "search.top_k=2",
            "rollout.max_turns=1",
            "target=retrieved",
            *overrides,
        ],
    )
    return simulator_collect.main(recipe), policy


def _written(tmp_path: Path, split: str = "train") -> list[dict]:
    """The pairs `_collect` wrote to `split`.jsonl."""
    return [json.loads(line) for line in (tmp_path / "collect" / f"{split}.jsonl").read_text().splitlines()]


def _checked(tmp_path: Path, *overrides: str) -> CollectRecipe:
    """A collect recipe with its required keys and `overrides`, loaded and checked (nothing runs)."""
    required = [f"run_dir={tmp_path}", "policy.model.path=m", "data.train=[t]", "search.corpus=c.jsonl"]
    return load_recipe(CollectRecipe, None, [*required, *overrides])


def test_collect_writes_balanced_pairs_from_real_bm25_searches(tmp_path: Path, world_files, monkeypatch) -> None:
    world, _ = world_files
    stats, policy = _collect(tmp_path, world_files, monkeypatch, "batch_size=16", "val_fraction=0.2")

    n_questions = len(world.train)
    assert policy.calls == 2 * -(-n_questions // 16)  # two turns per batch of 16 questions
    assert stats["collect/records"] == n_questions  # one executed search per question
    train, val = _written(tmp_path), _written(tmp_path, "val")
    assert len(train) + len(val) == stats["collect/train"] + stats["collect/val"] > 0
    # target=retrieved: one useful and one noisy pair per record.
    labels = [p["label"] for p in train + val]
    assert labels.count("useful") == labels.count("noisy")
    # Name queries find the answer with BM25; question-word queries mostly do not.
    useful = [p for p in train + val if p["label"] == "useful"]
    by_name = [p for p in useful if p["query"] != "who was born"]
    by_words = [p for p in useful if p["query"] == "who was born"]
    assert sum(p["contains_answer"] for p in by_name) / len(by_name) > 0.7  # 23/30 at this seed
    assert sum(p["contains_answer"] for p in by_words) / len(by_words) < 0.5
    assert not any(p["contains_answer"] for p in train + val if p["label"] == "noisy")
    assert (tmp_path / "collect" / "recipe.yaml").is_file()


def test_contrast_queries_are_searched_with_the_real_retriever(tmp_path: Path, world_files, monkeypatch) -> None:
    world, _ = world_files
    stats, policy = _collect(tmp_path, world_files, monkeypatch, "val_fraction=0.0", "contrast_queries=2")

    n_questions = len(world.train)
    assert n_questions < stats["collect/records"] <= 3 * n_questions
    pairs = _written(tmp_path)
    names = set(policy.names)
    contrast = [p for p in pairs if p["query"] not in names and p["query"] != "who was born"]
    assert contrast
    # A name cut short retrieves nothing: its useful pair is an empty response.
    cut = [p for p in contrast if len(p["query"].split()) == 1 and any(n.startswith(p["query"]) for n in names)]
    assert cut and all(p["response"] == "" for p in cut)
    assert stats["collect/empty"] >= len(cut) / 2


def test_collect_refuses_a_simulator_as_its_retriever(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="collect needs a real retriever"):
        _checked(tmp_path, "search.kind=simulator", "search.simulator.generation.model.path=m")


def test_collect_refuses_negative_contrast_queries(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="contrast_queries=-1"):
        _checked(tmp_path, "contrast_queries=-1")


def test_collect_takes_every_preset_but_custom(tmp_path: Path) -> None:
    assert _checked(tmp_path, "preset=simsearch-brief").preset == "simsearch-brief"
    with pytest.raises(RecipeError, match="preset"):
        _checked(tmp_path, "preset=custom")


def test_collect_renders_responses_as_the_policy_reads_them_only_with_the_brief_preset(
    tmp_path: Path, world_files, monkeypatch
) -> None:
    _collect(tmp_path, world_files, monkeypatch, "val_fraction=0.0", "preset=simsearch-brief", "search.rendering=brief")
    written = [p["response"] for p in _written(tmp_path) if p["response"]]
    assert written and all(r.startswith("Doc 1: ") and "(Title:" not in r for r in written)
    with pytest.raises(RecipeError, match=r"search\.rendering=brief.*preset simsearch asks for"):
        _checked(tmp_path, "search.rendering=brief")


def test_trajectory_target_labels_every_search_by_its_trajectory_s_answer(
    tmp_path: Path, world_files, monkeypatch
) -> None:
    # The scripted policy always answers "x", never a gold answer: under the paper's labelling every
    # search it made is noisy, even those whose BM25 results hold the answer.
    stats, _ = _collect(tmp_path, world_files, monkeypatch, "target=trajectory", "balance=false", "val_fraction=0.0")
    pairs = _written(tmp_path)
    assert stats["collect/trajectory_noisy"] == len(pairs) == stats["collect/records"] > 0
    assert stats["collect/trajectory_useful"] == 0
    assert {p["label"] for p in pairs} == {"noisy"} and any(p["contains_answer"] for p in pairs)


def test_collect_refuses_contrast_queries_with_the_trajectory_target(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="contrast_queries=1 with target=trajectory"):
        _checked(tmp_path, "target=trajectory", "contrast_queries=1")
    with pytest.raises(RecipeError, match="outcome_metric='f1' is not one of substring_em, em"):
        _checked(tmp_path, "outcome_metric=f1")


# --------------------------------------------------------------------------- a run directory never lies


class SilentPolicy(ScriptedPolicy):
    """Answers at once: no search, so nothing to collect."""

    def generate(self, prompts, params):
        reply = "<answer> x </answer>"
        ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
        return [Completion(token_ids=ids, text=reply, finish_reason="stop", stop="</answer>") for _ in prompts]


def test_collect_refuses_pairs_of_another_recipe_and_a_failed_run_writes_nothing(
    tmp_path: Path, world_files, monkeypatch
) -> None:
    _collect(tmp_path, world_files, monkeypatch, "val_fraction=0.2")
    run = tmp_path / "collect"
    kept = {name: (run / name).read_bytes() for name in ("recipe.yaml", "train.jsonl", "val.jsonl", "stats.json")}
    with pytest.raises(RecipeError, match=r"holds pairs collected with another recipe .*val_fraction \(0.2 -> 0.3\)"):
        _collect(tmp_path, world_files, monkeypatch, "val_fraction=0.3")
    # a failed run (the policy never searched) leaves the directory as it was: recipe.yaml and pairs agree
    world, _ = world_files
    tokenizer = train_tokenizer(world.texts_for_tokenizer(300), vocab_size=600)
    silent = SilentPolicy(tokenizer, world)
    monkeypatch.setattr(simulator_collect, "build_generation_engine", lambda cfg: (silent, tokenizer, None))
    recipe = load_recipe(CollectRecipe, run / "recipe.yaml")
    with pytest.raises(SimsearchError, match="the policy ran no search"):
        simulator_collect.main(recipe)
    assert {name: (run / name).read_bytes() for name in kept} == kept
    # the same recipe (threads aside) collects again in place
    _collect(tmp_path, world_files, monkeypatch, "val_fraction=0.2", "threads=2")
    assert load_recipe(CollectRecipe, run / "recipe.yaml").threads == 2
