"""The knowing simulator: a simulator that has read the world, as an LLM has read Wikipedia, and is fit on
other people than the ones RL asks about (`tinyworld.knowing`); and its fidelity to BM25 before any RL.

`KNOWING_DESIGNS` are the ways it can be made; `knowing_simulator` builds one design's stages for a
quickstart world (fingerprinted, reused when finished), `measure_fidelity` measures it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from simsearch.config import TrainRecipe, load_recipe
from simsearch.data.qa import write_qa_jsonl
from simsearch.experiments import pipeline
from simsearch.experiments.stages import collect_stage, finetune_stage
from simsearch.factory.build import build_search_engine
from simsearch.fingerprints import claim_stage, digest, finish_stage
from simsearch.simulator.recipe import SearchConfig
from simsearch.tinyworld.knowing import (
    fit_corpus,
    fit_questions,
    mixed_sft_file,
    pretrain_knowing_base,
    reading_passages,
    results_fidelity,
)
from simsearch.tinyworld.world import World, write_corpus

KNOWING_FIT_PEOPLE = 200  # background people the knowing simulator's SFT pairs ask about (as many as RL's)


@dataclass(frozen=True)
class Reading:
    """How the knowing base reads the world (`tinyworld.knowing.pretrain_knowing_base`)."""

    steps: int
    batch_size: int
    lr: float
    articles: int  # per sequence
    style: str = "articles"  # tinyworld.knowing.READING_STYLES


@dataclass(frozen=True)
class KnowingDesign:
    """How the knowing simulator is made: its base's reading, and how much of its SFT is reading too."""

    reading: Reading
    sft_reading_share: float = 0.0  # share of the SFT file that is reading (`tinyworld.knowing.mixed_sft_file`)


_READING = Reading(steps=1500, batch_size=16, lr=2e-3, articles=2)
KNOWING_DESIGNS = {
    "articles": KnowingDesign(_READING),
    "mixed": KnowingDesign(_READING, sft_reading_share=0.5),
    "results": KnowingDesign(Reading(1500, 16, 2e-3, 2, style="mixed"), sft_reading_share=0.5),
    "longer": KnowingDesign(Reading(3000, 16, 2e-3, 2, style="mixed"), sft_reading_share=0.5),
}
"""The knowing simulator's designs, in the order the gate of benchmarks/controls.py tries them. `articles`:
1,500 x 16 sequences of 2 articles, about 109 reads of each of the 440 articles (200 RL people, 200 fit people,
40 cities), then SFT on the fit people's pairs alone; `mixed`: the same, half the SFT file reading (mixed
training); `results`: and half the articles read as results pages; `longer`: and twice the reading."""

SMOKE_READING = Reading(steps=2, batch_size=4, lr=5e-3, articles=1)


def knowing_simulator(
    root: Path,
    seed: int,
    paths: dict[str, str],
    fingerprints: dict[str, str],
    world: World,
    *,
    design: str,
    recipes: Path,
    threads: int,
    smoke: bool = False,
) -> tuple[str, str]:
    """The knowing simulator of a world in `design` (`KNOWING_DESIGNS`), built under root/knowing: its base
    reads, its pairs are collected on the fit people with `recipes`' collect.yaml, it is fine-tuned with their
    simulator.yaml (with reading mixed into its SFT file if the design says so); its fingerprint and model path.

    `paths` and `fingerprints` are the quickstart's stages' (corpus, base, world...); every stage is
    fingerprinted, so a finished one is reused. `smoke`: a few steps of each."""
    out = root / "knowing"
    how = KNOWING_DESIGNS[design]
    reading = SMOKE_READING if smoke else how.reading
    passages = reading_passages(world, KNOWING_FIT_PEOPLE)
    base = out / ("base" if reading in (_READING, SMOKE_READING) else f"base-{reading.style}-{reading.steps}")
    base_fp = digest({"stage": "knowing_base", "inputs": [fingerprints["base"]], "fit_people": KNOWING_FIT_PEOPLE,
                      "reading": asdict(reading), "threads": threads})  # fmt: skip
    if not claim_stage(base, base_fp):
        pretrain_knowing_base(Path(paths["base"]), base, passages, seed=seed, **asdict(reading))
        finish_stage(base, base_fp)
    write_qa_jsonl(fit_questions(world, KNOWING_FIT_PEOPLE), out / "fit.jsonl")
    corpus, index = out / "corpus_fit.jsonl", out / "index_fit"
    if not claim_stage(index, fingerprints["world"]):  # no RL person's passage, no held-out person's
        write_corpus(fit_corpus(world), corpus)
        build_search_engine(SearchConfig(kind="bm25", corpus=str(corpus), index_dir=str(index)))
        finish_stage(index, fingerprints["world"])
    smoke_stages = pipeline.SMOKE if smoke else {}
    collect = [
        f"run_dir={out / 'collect'}", f"seed={seed}", f"threads={threads}", f"policy.model.path={paths['base']}",
        f"data.train=[{out / 'fit.jsonl'}]",  # the fit people only: never a question RL asks
        f"search.corpus={corpus}", f"search.index_dir={index}", *smoke_stages.get("collect", []),
    ]  # fmt: skip
    inputs = [fingerprints["base"], fingerprints["world"]]  # the policy's base collects, never the knowing base
    collect_fp = collect_stage(recipes / "collect.yaml", collect, inputs)
    train_file = out / "collect" / "train.jsonl"
    if how.sft_reading_share:  # the reading mixed in: a file of its own per design, its bytes fingerprinted
        train_file = out / f"sft-{design}.jsonl"
        mixed_sft_file(out / "collect" / "train.jsonl", passages, train_file, share=how.sft_reading_share,
                       articles=reading.articles, seed=seed, style=reading.style)  # fmt: skip
    mixed = digest(train_file.read_text(encoding="utf-8")) if how.sft_reading_share else ""
    val = out / "collect" / "val.jsonl"
    simulator = out / ("simulator" if design == "articles" else f"simulator-{design}")
    finetune = [
        f"run_dir={simulator}", f"seed={seed}", f"threads={threads}", f"model.path={base}",
        f"train_file={train_file}", f"val_file={val}" if val.stat().st_size else "val_file=''",
        *smoke_stages.get("simulator", []),
    ]  # fmt: skip
    fingerprint = finetune_stage(recipes / "simulator.yaml", finetune, [collect_fp, base_fp, mixed])
    return fingerprint, str(pipeline.final_model(simulator))


def measure_fidelity(
    root: Path, world: World, paths: dict[str, str], *, design: str, recipes: Path, limit: int = 0
) -> dict[str, Any]:
    """Before any RL: the knowing simulator (paths["knowing"]), the quickstart's and real BM25 asked a good query
    for each of RL's questions (the first `limit`; 0: all) as `recipes`' train.yaml builds each engine (greedy,
    no noise); `tinyworld.knowing.results_fidelity` per engine, cached in root/knowing/fidelity-DESIGN.json."""
    cached = root / "knowing" / f"fidelity-{design}.json"
    engines = {"knowing": paths["knowing"], "simulator": paths["simulator"], "bm25": ""}
    if cached.is_file() and json.loads(cached.read_text()).get("models") == engines:
        return json.loads(cached.read_text())
    questions = world.train[:limit] if limit else world.train
    figures: dict[str, Any] = {"models": engines, "questions": len(questions)}
    for name, model in engines.items():
        overrides = [f"search.simulator.generation.model.path={model}", "search.cache=''"] if model else [
            "search.kind=bm25", f"search.corpus={paths['corpus']}", f"search.index_dir={paths['bm25']}",
            "search.cache=''"]  # fmt: skip
        search = load_recipe(TrainRecipe, recipes / "train.yaml", overrides).search
        engine = build_search_engine(search)
        assert engine is not None  # a simulator or BM25, never self-search
        figures[name] = results_fidelity(engine, world, questions, top_k=search.top_k)
    cached.write_text(json.dumps(figures, indent=2) + "\n")
    return figures
