"""Simulator fidelity before and after SFT, on held-out questions of the tiny world.

    python -m benchmarks.simulator_fidelity RUN_DIR      # RUN_DIR of a finished `simsearch quickstart`

Compares the untuned base LM and the fine-tuned simulator of a quickstart run (both driven by
the same `simsearch` preset, greedy, top-3) with real BM25 as the reference, on queries of two
kinds per held-out question: the entity name plus the question's words (a good query) — the
corrupted query of `measure_fidelity` is another question's query. Prints a table; last line
JSON with `gap_before`, `gap_after` (useful-contains-answer minus noisy-contains-answer) and
`query_sensitivity_after`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from simsearch.data.qa import load_qa
from simsearch.experiments import pipeline
from simsearch.generation.hf import HFEngine
from simsearch.models import load_model
from simsearch.retrieval.bm25 import BM25SearchEngine
from simsearch.simulator.engine import SimulatedSearchEngine
from simsearch.simulator.fidelity import FidelityExample, measure_fidelity
from simsearch.tinyworld.world import build_world
from simsearch.training.checkpoint import latest_checkpoint


def simulator(path: Path) -> SimulatedSearchEngine:
    model, tokenizer = load_model(path)
    engine = HFEngine(model, tokenizer, batch_size=64, prefix_cache=False)
    return SimulatedSearchEngine(engine, preset="simsearch", temperature=0.0, max_new_tokens=96, model_name=str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--questions", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    run = args.run_dir
    recipe = pipeline.saved_recipe(run)  # the run's world, rebuilt
    tiny = recipe.tinyworld
    world = build_world(
        seed=recipe.seed, n_entities=tiny.n_entities, n_train_entities=tiny.n_train_entities,
        n_background_entities=tiny.n_background_entities,
    )  # fmt: skip
    test = load_qa(run / "world" / "test.jsonl")[: args.questions]
    examples = [
        FidelityExample(e.question, e.golden_answers, f"{world.facts[e.id].entity} {e.question.rstrip('?')}")
        for e in test
    ]
    reference = BM25SearchEngine.build(world.passages, show_progress=False)
    tuned = latest_checkpoint(run / "simulator") / "model"
    rows = {
        "base LM (no SFT)": measure_fidelity(simulator(run / "base"), examples, top_k=3, reference=reference),
        "fine-tuned simulator": measure_fidelity(simulator(tuned), examples, top_k=3, reference=reference),
    }
    keys = sorted({k for r in rows.values() for k in r})
    print("| measure | " + " | ".join(rows) + " |\n|---|" + "---|" * len(rows))
    for key in keys:
        print(f"| {key} | " + " | ".join(f"{r.get(key, float('nan')):.3f}" for r in rows.values()) + " |")
    before, after = rows.values()
    print(
        json.dumps(
            {
                "questions": len(examples),
                "gap_before": round(before["fidelity/gap"], 3),
                "gap_after": round(after["fidelity/gap"], 3),
                "query_sensitivity_after": round(after.get("fidelity/query_sensitivity", float("nan")), 3),
            }
        )
    )


if __name__ == "__main__":
    main()
