"""`simsearch quickstart`: the ZeroSearch pipeline end to end on a tiny world, offline on CPU.

Stages: build a fictional world; pretrain a tiny base LM on copy drills and on traces about
background entities only; collect simulator SFT data with it and BM25 (`simulator collect`);
fine-tune a tiny simulator (`simulator finetune`; with `simulator=knowing`, a simulator whose base
first read the world and whose pairs ask about other people); RL the policy against the simulator
(`train`), and without search; evaluate both on held-out questions against the simulator,
BM25, dense retrieval and no search (`eval`), and write `report.json`, `report.md` and plots.
Stages 3-6 run `recipes/quickstart/` with their paths pointed into the run directory. The stages
themselves are `simsearch.experiments.pipeline`'s; this module runs them in order and reports.
"""

from __future__ import annotations

import json
import platform
import resource
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from simsearch.commands.evaluate import examples_file
from simsearch.config import QuickstartRecipe, TrainRecipe
from simsearch.eval import report
from simsearch.eval.view import write_page
from simsearch.experiments import pipeline
from simsearch.models import load_model
from simsearch.policy.tags import extract_queries
from simsearch.retrieval.bm25 import BM25SearchEngine
from simsearch.tinyworld.diagnostics import QUERY_NAMING, query_naming, reading_accuracy
from simsearch.tinyworld.world import World
from simsearch.training.runlog import read_metrics

ENGINES = ("simulator", "bm25", "dense", "none")  # none: every search finds nothing
# The no-search policy is evaluated as it was trained: given a search engine at test time, its
# score would be the base's search habit plus 50 steps of noise, not what RL without search learns.
POLICY_ENGINES = {"base": ENGINES, "rl_search": ENGINES, "rl_nosearch": ("none",)}
POLICIES = tuple(POLICY_ENGINES)
COLLECT_BANNERS = {
    "fit": "3/6 simulator SFT data (base policy x real BM25)",
    "knowing": "3/6 the knowing simulator: its base reads the world, SFT data on other people (base policy x BM25)",
}
"""Stage 3's banner, by `QuickstartRecipe.simulator`."""
SIMULATORS = {"knowing": "the knowing one: it read the world, fit on other people", "fit": "fit on RL's own questions"}
"""How report.md names the simulator, by `QuickstartRecipe.simulator`."""


def main(recipe: QuickstartRecipe) -> dict[str, Any]:
    """Runs every stage; returns what `report.json` holds.

    In the same `run_dir`, a stage whose inputs are unchanged is reused (or resumed), any other
    rebuilt (`fingerprints.claim_stage`).
    """
    began = time.perf_counter()
    clock = _StageClock()
    stages, rl_recipe, world, world_fp, base_fp = pipeline.first_stages(recipe, clock.start)
    run = stages.run
    reading = _base_reading(run / "base", world, rl_recipe, recipe.protocol)
    clock.start("collect", COLLECT_BANNERS[recipe.simulator])
    simulator_fp = pipeline.simulator_stages(stages, world, world_fp, base_fp, clock.start)
    clock.start("rl", "5/6 RL against the simulator, then RL without search")
    policy_fps = {"base": base_fp, **pipeline.rl_stages(stages, base_fp, simulator_fp)}
    clock.start("eval", "6/6 held-out evaluation: simulator, BM25, dense, no search")
    policies = {
        "base": run / "base",
        "rl_search": pipeline.final_model(run / "train"),
        "rl_nosearch": pipeline.final_model(run / "train_nosearch"),
    }
    for name, model_dir in policies.items():
        pipeline.eval_stage(stages, name, model_dir, [policy_fps[name], simulator_fp, world_fp])
    summaries = {name: json.loads((run / "eval" / name / "summary.json").read_text()) for name in POLICIES}
    page = write_page(run / "eval" / "rl_search")  # the RL policy's trajectories, engine by engine

    naming = {name: evaluation_query_naming(run / "eval" / name, world) for name in ("base", "rl_search")}
    result = _report(
        recipe, run, summaries, {"base_reading": reading, "query_naming": naming},
        wall_s=time.perf_counter() - began, stage_s=clock.stop(),
    )  # fmt: skip
    print((run / "report.md").read_text())
    print(f"simsearch quickstart: the RL policy's trajectories, engine by engine: {page}")
    return result


def _base_reading(base: Path, world: World, rl: TrainRecipe, protocol: str) -> dict[str, dict[str, float]]:
    """The base model's reading of held-out results per relation (`reading_accuracy`), cached in base/."""
    path = base / "reading.json"
    if path.is_file():
        return json.loads(path.read_text())
    model, tokenizer = load_model(str(base))
    engine = BM25SearchEngine.build(world.passages, show_progress=False)
    reading = reading_accuracy(
        model, tokenizer, world, engine, world.test,
        top_k=rl.search.top_k, template=rl.rollout.template, rendering=rl.search.rendering, protocol=protocol,
    )  # fmt: skip
    path.write_text(json.dumps(reading, indent=2) + "\n")
    return reading


def evaluation_query_naming(
    eval_dir: Path, world: World, *, engine: str = "bm25", dataset: str = "heldout"
) -> dict[str, dict[str, float]]:
    """Per query kind (`QUERY_NAMING`), the share and EM of an evaluation's questions (by default the
    held-out ones with BM25) whose first query names the asked person that way."""
    rows = [json.loads(line) for line in examples_file(eval_dir, engine, dataset).read_text().splitlines()]
    kinds: dict[str, list[float]] = {kind: [] for kind in QUERY_NAMING}
    for row in rows:
        kinds[query_naming(first_query(row["samples"][0]), world.facts[row["id"]].entity)].append(row["scores"]["em"])
    return {
        kind: {"share": len(ems) / len(rows), "em": sum(ems) / len(ems) if ems else 0.0} for kind, ems in kinds.items()
    }


def first_query(sample: dict[str, Any]) -> str:
    """The first query of an evaluation sample or saved RL trajectory: its first tool call, else its
    first `<search>` tag ("" for none)."""
    calls = [q for turn in sample["turns"] for q in turn.get("call_queries", [])]
    queries = calls or extract_queries(sample["response"])
    return queries[0] if queries else ""


def machine() -> dict[str, Any]:
    """What a run's float results depend on besides its recipe: CPU, threads, library versions."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [
            line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    packages = ("simsearch", "torch", "transformers", "tokenizers", "numpy", "bm25s", "sentence-transformers")
    return {
        "cpu": cpu,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "versions": {name: _version(name) for name in packages},
    }


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _report(
    recipe: QuickstartRecipe,
    run: Path,
    summaries: dict[str, dict],
    diagnostics: dict[str, dict[str, Any]],
    *,
    wall_s: float,
    stage_s: dict[str, float],
) -> dict[str, Any]:
    """`report.json` (figures), `report.md` (the table), `bars.png` and `curves.png`."""
    em = {
        policy: {engine: 100.0 * summaries[policy]["rows"][engine]["average"]["em"] for engine in engines}
        for policy, engines in POLICY_ENGINES.items()
    }
    rl = summaries["rl_search"]["rows"]
    baselines = {name: 100.0 * rl[name]["average"]["em"] for name in ("direct", "rag") if name in rl}
    # This process's peak plus that of any child process (Linux reports KiB): an upper bound.
    peak_kib = sum(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    peak_rss_gb = peak_kib / 2**20
    result = {
        "wall_s": round(wall_s, 1),
        "stage_s": stage_s,
        # the stages whose model was installed from the release, not built (`install_released`)
        "released": [stage for stage in ("base", "simulator") if (run / stage / pipeline.RELEASED).is_file()],
        "peak_rss_gb": round(peak_rss_gb, 3),
        "smoke": recipe.smoke,
        "seed": recipe.seed,
        "machine": machine(),
        "em": em,
        **diagnostics,  # base_reading, query_naming
        "rl_search_baselines_em": baselines,
        "fidelity": summaries["rl_search"]["fidelity"],
    }
    (run / "report.json").write_text(json.dumps(result, indent=2) + "\n")
    markdown = _report_markdown(recipe, em, baselines, diagnostics, wall_s, peak_rss_gb)
    (run / "report.md").write_text(markdown)
    _plot_report(run, summaries)
    return result


def _report_markdown(
    recipe: QuickstartRecipe,
    em: dict[str, dict[str, float]],
    baselines: dict[str, float],
    diagnostics: dict[str, dict[str, Any]],
    wall_s: float,
    peak_rss_gb: float,
) -> str:
    """report.md: the held-out exact-match table, the RL policy's baselines and the diagnostics."""
    lines = [
        "# simsearch quickstart" + (" (smoke: a pipeline check, not a result)" if recipe.smoke else ""),
        "",
        "Held-out exact match (%), greedy; the RL policy only ever searched the simulator",
        f"({SIMULATORS[recipe.simulator]}), and the no-search policy never got a search result (none: every",
        "search finds nothing).",
        "",
        "| policy | " + " | ".join(ENGINES) + " |",
        "|---|" + "---|" * len(ENGINES),
        *(f"| {p} | " + " | ".join(f"{em[p][e]:.1f}" if e in em[p] else "-" for e in ENGINES) + " |" for p in POLICIES),
        "",
        *(f"RL policy, {name} baseline: {value:.1f}" for name, value in baselines.items()),
        "",
        *_diagnostic_lines(diagnostics),
        "",
        f"Wall time {wall_s / 60:.1f} min, peak memory {peak_rss_gb:.2f} GB.",
        "",
    ]
    return "\n".join(lines)


def _plot_report(run: Path, summaries: dict[str, dict]) -> None:
    """bars.png (engines as the groups, policies as the bars: does what was learned against the
    simulator carry over to real retrievers?) and curves.png (the training metrics)."""
    by_engine = {
        "datasets": list(ENGINES),
        "rows": {
            p: {
                "kind": "policy",
                "search": "trained vs simulator" if p == "rl_search" else "",
                "results": {e: summaries[p]["rows"][e]["average"] for e in POLICY_ENGINES[p]},
                "average": {},
            }
            for p in POLICIES
        },
    }
    report.plot_bars(by_engine, run / "bars.png", metric="em", title="Held-out exact match (%) per search engine")
    rows = read_metrics(run / "train")
    if rows:
        report.plot_training_curves(rows, run / "curves.png")


def _diagnostic_lines(diagnostics: dict[str, dict[str, Any]]) -> list[str]:
    """report.md's tables of the base's reading and of how each policy's queries name the person."""
    return [
        "The base's reading of held-out results (name query; share of questions whose answer is a",
        "value of the asked kind copied from the results / found nowhere in them / the gold answer):",
        "",
        "| relation | copied | invented | right |",
        "|---|---|---|---|",
        *(
            f"| {rel} | {row['copied']:.2f} | {row['invented']:.2f} | {row['right']:.2f} |"
            for rel, row in diagnostics["base_reading"].items()
        ),
        "",
        "How the first query names the asked person (held-out, BM25; share of questions, and their EM):",
        "",
        "| policy | " + " | ".join(QUERY_NAMING) + " |",
        "|---|" + "---|" * len(QUERY_NAMING),
        *(
            f"| {policy} | "
            + " | ".join(f"{kinds[k]['share']:.2f} ({kinds[k]['em']:.2f})" for k in QUERY_NAMING)
            + " |"
            for policy, kinds in diagnostics["query_naming"].items()
        ),
    ]


class _StageClock:
    """Prints each stage's banner and keeps how long every stage took (seconds)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._current: tuple[str, float] | None = None

    def start(self, key: str, banner: str) -> None:
        self.stop()
        print(f"\n=== simsearch quickstart: {banner} ===", flush=True)
        self._current = (key, time.perf_counter())

    def stop(self) -> dict[str, float]:
        if self._current is not None:
            key, began = self._current
            self.seconds[key] = round(time.perf_counter() - began, 1)
            self._current = None
        return self.seconds
