"""`simsearch simulator collect RECIPE`: simulator SFT data from real-search trajectories.

Setup refuses a run directory holding pairs of another recipe, then builds the policy, the real
retriever and the judge; the loop rolls the policy out on the QA set in batches and keeps every
executed search as a (question, answers, query, documents) record, with whether its trajectory
reached the gold answer; cleanup labels, balances, renders and writes the pairs with their
statistics, then `recipe.yaml` (nothing is written before, so a failed run leaves the directory
as it was).

`target: trajectory` labels as the ZeroSearch paper does (by the trajectory's outcome). Our
departures, each its own choice: `target: judged` labels by the documents' content (a rule or LLM
judge), `target: retrieved` keeps the retriever's query sensitivity, and `contrast_queries` sends
variants of each query (a word dropped, cut short or swapped) to the retriever too (see
`simsearch.simulator.sft_data`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, cast

from tqdm import tqdm

from simsearch.commands import preflight
from simsearch.config import CollectRecipe, save_recipe
from simsearch.data.qa import load_qa
from simsearch.errors import SimsearchError
from simsearch.factory.build import build_generation_engine, build_search_engine
from simsearch.generation.base import GenerationEngine
from simsearch.policy.rollout import RolloutSettings, generate_trajectories
from simsearch.retrieval.base import SearchEngine
from simsearch.simulator.prompts import Preset
from simsearch.simulator.sft_data import (
    Judge,
    LLMJudge,
    SearchRecord,
    Target,
    build_sft_pairs,
    contrast_records,
    records_from_trajectories,
    rule_judge,
    write_pairs,
)
from simsearch.types import QAExample, SamplingParams


def main(recipe: CollectRecipe) -> dict[str, float]:
    """Collect, label and write the pairs; returns the collection statistics."""
    run_dir = Path(recipe.run_dir)
    preflight.set_threads(recipe.threads)
    preflight.check_paths(recipe)
    preflight.check_collected(recipe, run_dir)
    policy, tokenizer, _ = build_generation_engine(recipe.policy)
    search = build_search_engine(recipe.search, seed=recipe.seed)
    assert search is not None  # CollectRecipe.check refuses kind=self
    judge = _judge(recipe)
    examples = [e for path in recipe.data.train for e in load_qa(path)]
    if recipe.max_questions:
        examples = examples[: recipe.max_questions]
    records = _collect(recipe, examples, policy, tokenizer, search)

    if not records:
        raise SimsearchError(
            f"collect: the policy ran no search on {len(examples)} questions, so there is nothing to "
            "learn from; check that policy.model.path is a model that searches in rollout.protocol's format "
            f"({recipe.rollout.protocol})"
        )
    if recipe.contrast_queries:
        records += contrast_records(
            records, search, n=recipe.contrast_queries, top_k=recipe.search.top_k, seed=recipe.seed,
            edits=recipe.contrast_edits,
        )  # fmt: skip
    data = build_sft_pairs(
        records,
        preset=cast(Preset, recipe.preset),  # both checked by the recipe
        target=cast(Target, recipe.target),
        judge=judge,
        balance=recipe.balance,
        val_fraction=recipe.val_fraction,
        seed=recipe.seed,
        show_question=recipe.show_question,
        show_answer=recipe.show_answer,
        top_k=recipe.search.top_k,
        style=recipe.search.rendering,  # the simulator writes results as the policy reads them
    )
    # recipe.yaml last, and gone while the pairs are rewritten: it only ever describes the pairs beside it
    (run_dir / "recipe.yaml").unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_pairs(data.train, run_dir / "train.jsonl")
    write_pairs(data.val, run_dir / "val.jsonl")
    (run_dir / "stats.json").write_text(json.dumps(data.stats, indent=2, sort_keys=True))
    save_recipe(recipe, run_dir)
    print(
        f"collect: {len(records)} searches -> {len(data.train)} train / {len(data.val)} val pairs "
        f"(useful share {data.stats['collect/train_useful_share']:.2f}) in {run_dir}"
    )
    return data.stats


def _collect(
    recipe: CollectRecipe, examples: list[QAExample], policy: GenerationEngine, tokenizer: Any, search: SearchEngine
) -> list[SearchRecord]:
    """Rolls the policy out with the real retriever, `batch_size` questions at a time; every executed search."""
    settings = RolloutSettings(recipe.rollout, recipe.search.top_k, recipe.search.rendering)
    sampling = SamplingParams(
        temperature=recipe.sampling.temperature,
        top_p=recipe.sampling.top_p,
        max_new_tokens=recipe.sampling.max_new_tokens,
        seed=recipe.seed,
    )
    records: list[SearchRecord] = []
    rng = random.Random(recipe.seed)
    progress = tqdm(range(0, len(examples), recipe.batch_size), desc="collect", unit="batch")
    for start in progress:
        batch = examples[start : start + recipe.batch_size]
        result = generate_trajectories(
            batch,
            policy=policy,
            tokenizer=tokenizer,
            search=search,
            settings=settings,
            sampling=sampling,
            group_size=recipe.rollout.group_size,
            rng=rng,
        )
        records += records_from_trajectories(result.trajectories, outcome_metric=recipe.outcome_metric)
        progress.set_postfix(records=len(records))
    return records


def _judge(recipe: CollectRecipe) -> Judge:
    """The rule judge, or the LLM judge the recipe names (`judge.kind`)."""
    if recipe.judge.kind != "llm":
        return rule_judge
    assert recipe.judge.generation is not None  # JudgeConfig.check: kind=llm needs it
    judge_engine, judge_tokenizer, _ = build_generation_engine(recipe.judge.generation)
    return LLMJudge(judge_engine, tokenizer=judge_tokenizer, chat=True)
