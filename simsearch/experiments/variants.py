"""Stages the studies build beside a quickstart run: simulators made as its own but with other collect settings
(`simulator_variant`), a base that knows the training people's facts for self-search (`self_search_base`), and the
answers a simulator leaks before any RL (`leakage`). Each stage is fingerprinted and reused when finished.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from simsearch.config import TrainRecipe, load_recipe
from simsearch.experiments.probes import answer_leakage
from simsearch.experiments.stages import SMOKE_STAGES, collect_stage, final_model, finetune_stage
from simsearch.factory.build import build_search_engine
from simsearch.fingerprints import building, digest
from simsearch.models import load_model, save_tiny
from simsearch.retrieval.bm25 import BM25SearchEngine
from simsearch.tinyworld.pretrain import pretrain
from simsearch.tinyworld.traces import make_traces
from simsearch.tinyworld.world import World

# The smoke base rarely searches: 128 questions give outcome labels pairs on 2 questions at least (train and
# validation), where 32 gave one pair; they may hold no correct trajectory, hence no balance.
SMOKE_COLLECT = ["max_questions=128", "balance=false"]
SELF_SEARCH_BASE, SMOKE_SELF_SEARCH_BASE = (400, 32), (2, 4)  # steps and batch of pretraining on the facts
SELF_SEARCH_LR = 1e-3
TOLD = ("show_question", "show_answer")  # the simulator settings a told simulator is trained and asked with


def simulator_variant(
    root: Path, name: str, recipes: Path, *, seed: int, paths: Mapping[str, str], base_fp: str,
    collect: Sequence[str], smoke: bool,
) -> tuple[str, str]:  # fmt: skip
    """A simulator built as the quickstart's (`recipes`' collect.yaml with BM25 by the base at paths["base"], then
    simulator.yaml on that base) with the collect overrides `collect`: its pairs in root/collect_NAME, itself in
    root/simulator_NAME. Its fingerprint and model path."""
    collected, out = root / f"collect_{name}", root / f"simulator_{name}"
    collect_fp = collect_stage(
        recipes / "collect.yaml",
        [f"run_dir={collected}", f"seed={seed}", f"policy.model.path={paths['base']}", f"data.train=[{paths['train']}]",
         f"search.corpus={paths['corpus']}", f"search.index_dir={paths['bm25']}", *collect,
         *(SMOKE_COLLECT if smoke else [])],
        [base_fp],
    )  # fmt: skip
    fingerprint = finetune_stage(
        recipes / "simulator.yaml",
        [f"run_dir={out}", f"seed={seed}", f"model.path={paths['base']}", f"train_file={collected / 'train.jsonl'}",
         f"val_file={collected / 'val.jsonl'}", *(SMOKE_STAGES["simulator"] if smoke else [])],
        [collect_fp],
    )  # fmt: skip
    return fingerprint, str(final_model(out))


def self_search_base(
    out: Path, base: str, base_fp: str, world: World, rl: TrainRecipe, *, seed: int, typed: float, smoke: bool
) -> str:
    """The model at `base` further pretrained on self-search traces (`make_traces`) about the training people only,
    their information blocks in the loss, so that it knows their facts; saved in `out`. `rl`: the RL recipe whose
    search settings the traces take; `typed`: the share of typed answers. Its fingerprint."""
    steps, batch = SMOKE_SELF_SEARCH_BASE if smoke else SELF_SEARCH_BASE
    settings = {"steps": steps, "batch": batch, "lr": SELF_SEARCH_LR, "seed": seed}
    fingerprint = digest({"stage": "knowing_base", "inputs": [base_fp], "settings": settings})
    with building(out, fingerprint) as todo:
        if todo:
            _pretrain_self_search(out, base, world, rl, steps=steps, batch=batch, seed=seed, typed=typed)
    return fingerprint


def _pretrain_self_search(
    out: Path, base: str, world: World, rl: TrainRecipe, *, steps: int, batch: int, seed: int, typed: float
) -> None:
    model, tokenizer = load_model(base)
    engine = BM25SearchEngine.build(world.passages, show_progress=False)
    traces = make_traces(
        world, engine, tokenizer, n=steps * batch, seed=seed, top_k=rl.search.top_k, template="self-search",
        examples=world.train, typed_answer_share=typed, rendering=rl.search.rendering,
    )  # fmt: skip
    for trace in traces:
        first = trace.loss_mask.index(1)  # the search turn opens the generated part
        trace.loss_mask[first:] = [1] * (len(trace.loss_mask) - first)
    pretrain(model, traces, steps=steps, batch_size=batch, lr=SELF_SEARCH_LR, copy_loss_weight=0.0, seed=seed)
    save_tiny(model, tokenizer, out)


def leakage(
    train_recipe: Path, world: World, simulators: Mapping[str, tuple[str, bool]], *, n: int, seed: int
) -> dict[str, dict[str, float]]:
    """`probes.answer_leakage` of each simulator (name -> model path, told), built as `train_recipe` builds its
    engine (uncached) but with the noisy documents' answers kept: what it writes before the recipe's redaction;
    and of BM25 for reference, whose no-name share alone is one (a real engine has no noisy mode)."""
    leak: dict[str, dict[str, float]] = {}
    top_k = load_recipe(TrainRecipe, train_recipe, ["run_dir=unused"]).search.top_k
    for name, (model, told) in simulators.items():
        overrides = [
            f"search.simulator.generation.model.path={model}",
            "search.cache=''",
            "search.simulator.noisy_answers=keep",
            *(f"search.simulator.{key}=true" for key in TOLD if told),
        ]
        search = load_recipe(TrainRecipe, train_recipe, ["run_dir=unused", *overrides]).search
        engine = build_search_engine(search, seed=seed)
        assert engine is not None  # kind=simulator
        leak[name] = answer_leakage(engine, world, n=n, top_k=top_k)
    bm25 = BM25SearchEngine.build(world.passages, show_progress=False)
    leak["bm25"] = {"no_name": answer_leakage(bm25, world, n=n, top_k=top_k)["no_name"]}
    return leak
