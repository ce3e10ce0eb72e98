"""The knowing simulator: a simulator that has read the world, as an LLM has read Wikipedia, and is fit on
other people than the ones RL asks about (`tinyworld.knowing`); and its fidelity to BM25 before any RL.

`KNOWING_DESIGNS` are the ways it can be made. Its stages, each fingerprinted and reused when finished: the
base reads (`reading_stage`), the fit people's data (`fit_data`), their pairs collected (`collect_overrides`),
the SFT file (`write_sft_file`) and the fine-tuning (`finetune_overrides`). `knowing_simulator` runs them for a
study under RUN/knowing; the quickstart's `simulator=knowing` runs them as its stages 3-4
(`experiments.pipeline.knowing_stages`). `measure_fidelity` measures it against BM25 before any RL.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from simsearch.config import TrainRecipe, load_recipe
from simsearch.data.qa import write_qa_jsonl
from simsearch.experiments.stages import SMOKE_STAGES, collect_stage, final_model, finetune_stage
from simsearch.factory.build import build_search_engine
from simsearch.fingerprints import building, digest
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
SMOKE_COLLECT = SMOKE_STAGES["collect"]
SMOKE_SIMULATOR = SMOKE_STAGES["simulator"]


KNOWING_DESIGN = "mixed"
"""The design the quickstart's knowing simulator and the controls' knowing arm are made in: the first candidate
to pass docs/controls.md's gate (development worlds 100-102)."""


def reading_fingerprint(base_fp: str, reading: Reading, threads: int) -> str:
    """The fingerprint of the knowing base read as `reading` says from the policy's base of `base_fp`."""
    return digest({"stage": "knowing_base", "inputs": [base_fp], "fit_people": KNOWING_FIT_PEOPLE,
                   "reading": asdict(reading), "threads": threads})  # fmt: skip


def reading_stage(base: Path, out: Path, base_fp: str, world: World, reading: Reading, *, seed: int,
                  threads: int) -> str:  # fmt: skip
    """The knowing base in `out`: the policy's base at `base` after reading the training and fit people's and
    the cities' passages (`reading_passages`); its fingerprint (a finished one is reused)."""
    fingerprint = reading_fingerprint(base_fp, reading, threads)
    with building(out, fingerprint) as todo:
        if todo:
            passages = reading_passages(world, KNOWING_FIT_PEOPLE)
            pretrain_knowing_base(base, out, passages, seed=seed, **asdict(reading))
    return fingerprint


def fit_paths(out: Path) -> dict[str, Path]:
    """Where `fit_data` writes in `out`: the fit people's questions, and the corpus and BM25 index of their pairs."""
    return {"questions": out / "fit.jsonl", "corpus": out / "corpus_fit.jsonl", "index": out / "index_fit"}


def fit_data(world: World, out: Path, world_fp: str) -> dict[str, Path]:
    """The fit people's questions and the corpus and BM25 index their SFT pairs are collected from (no RL person's
    passage, no held-out person's), written into `out` (`fit_paths`); their paths by name."""
    files = fit_paths(out)
    out.mkdir(parents=True, exist_ok=True)
    write_qa_jsonl(fit_questions(world, KNOWING_FIT_PEOPLE), files["questions"])
    with building(files["index"], world_fp) as todo:
        if todo:
            write_corpus(fit_corpus(world), files["corpus"])
            build_search_engine(SearchConfig(kind="bm25", corpus=str(files["corpus"]), index_dir=str(files["index"])))
    return files


def collect_overrides(out: Path, base: Path, files: dict[str, Path], seed: int) -> list[str]:
    """collect.yaml's overrides for the knowing simulator's SFT pairs: the policy's base at `base` (never the
    knowing base) searching `fit_data`'s corpus for the fit people's questions only, into `out`/collect."""
    return [
        f"run_dir={out / 'collect'}", f"seed={seed}", f"policy.model.path={base}",
        f"data.train=[{files['questions']}]", f"search.corpus={files['corpus']}", f"search.index_dir={files['index']}",
    ]  # fmt: skip


def sft_path(out: Path, design: str) -> Path:
    """The knowing simulator's SFT file in `out`: the collected pairs, or with the reading mixed in when `design`
    says so (`write_sft_file`)."""
    mixed = KNOWING_DESIGNS[design].sft_reading_share
    return out / f"sft-{design}.jsonl" if mixed else out / "collect" / "train.jsonl"


def write_sft_file(out: Path, world: World, design: str, *, reading: Reading, seed: int) -> Path:
    """`sft_path`, written when the reading is mixed in: the pairs in `out`/collect, then the reading (from the
    pairs, the reading and the seed alone: `sft_fingerprint`)."""
    path = sft_path(out, design)
    share = KNOWING_DESIGNS[design].sft_reading_share
    if share:
        passages = reading_passages(world, KNOWING_FIT_PEOPLE)
        mixed_sft_file(out / "collect" / "train.jsonl", passages, path, share=share, articles=reading.articles,
                       seed=seed, style=reading.style)  # fmt: skip
    return path


def sft_fingerprint(design: str, reading: Reading, seed: int) -> str:
    """What `write_sft_file` adds to the collected pairs, as a fingerprint ("" when it adds nothing)."""
    share = KNOWING_DESIGNS[design].sft_reading_share
    if not share:
        return ""
    return digest({"stage": "sft_mix", "share": share, "articles": reading.articles, "style": reading.style,
                   "fit_people": KNOWING_FIT_PEOPLE, "seed": seed})  # fmt: skip


def finetune_overrides(simulator: Path, base: Path, train_file: Path, val_file: Path, seed: int) -> list[str]:
    """simulator.yaml's overrides: the knowing base at `base` fine-tuned on `train_file` into `simulator`
    (validated on `val_file` when it holds pairs or does not exist yet, as when planning)."""
    has_val = not val_file.is_file() or val_file.stat().st_size > 0
    return [f"run_dir={simulator}", f"seed={seed}", f"model.path={base}", f"train_file={train_file}",
            f"val_file={val_file}" if has_val else "val_file=''"]  # fmt: skip


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
    """The knowing simulator of a quickstart world in `design` (`KNOWING_DESIGNS`), built under root/knowing: its
    base reads (`reading_stage`), its pairs are collected on the fit people with `recipes`' collect.yaml, it is
    fine-tuned with their simulator.yaml on `write_sft_file`'s; its fingerprint and model path.

    `paths` and `fingerprints` are the quickstart's stages' (corpus, base, world...); every stage is
    fingerprinted, so a finished one is reused. `smoke`: a few steps of each."""
    out = root / "knowing"
    reading = SMOKE_READING if smoke else KNOWING_DESIGNS[design].reading
    base = out / ("base" if reading in (_READING, SMOKE_READING) else f"base-{reading.style}-{reading.steps}")
    base_fp = reading_stage(Path(paths["base"]), base, fingerprints["base"], world, reading, seed=seed,
                            threads=threads)  # fmt: skip
    files = fit_data(world, out, fingerprints["world"])
    collect = [*collect_overrides(out, Path(paths["base"]), files, seed), f"threads={threads}",
               *(SMOKE_COLLECT if smoke else [])]  # fmt: skip
    collect_fp = collect_stage(recipes / "collect.yaml", collect, [fingerprints["base"], fingerprints["world"]])
    train_file = write_sft_file(out, world, design, reading=reading, seed=seed)
    simulator = out / ("simulator" if design == "articles" else f"simulator-{design}")
    finetune = [*finetune_overrides(simulator, base, train_file, out / "collect" / "val.jsonl", seed),
                f"threads={threads}", *(SMOKE_SIMULATOR if smoke else [])]  # fmt: skip
    inputs = [collect_fp, base_fp, sft_fingerprint(design, reading, seed)]
    fingerprint = finetune_stage(recipes / "simulator.yaml", finetune, inputs)
    return fingerprint, str(final_model(simulator))


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
