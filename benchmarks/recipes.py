"""The shipped CPU training recipes, run as shipped on the quickstart's artifacts: does each one learn?

    python -m benchmarks.recipes                  # builds runs/quickstart's world and base if missing
    python -m benchmarks.recipes --smoke          # two steps each, on a smoke world and base, in a temp dir

For each recipe of `CPU_RECIPES` (the train recipes whose inputs are the quickstart's world and base
policy), the world and base are built by `pipeline.world_and_base` (stages 1-2 of `simsearch
quickstart`, reused when they exist: the same fingerprints), every `runs/quickstart` path in the
recipe is pointed at them, and the recipe trains for its own `steps` (2 with --smoke) in its own
run directory under --run-dir. recipes/quickstart/train.yaml also needs the fine-tuned simulator:
benchmarks/quickstart.py runs it.

Output: a table on stdout, then as the last line one JSON object: per recipe `reward_first5` and
`reward_last5` (mean `reward/mean` of the first and last five steps; with fewer than ten steps, the
first and last halves), `steps` and `wall_s`; and `smoke`, `threads`.

Measured with `python -m benchmarks.recipes --artifacts runs/recipes_quickstart --threads 1` (2-core
AMD EPYC, 1 torch thread, another benchmark on the second core; the quickstart's default world and
base, which the run built first, in about 17 min):

| recipe | steps | reward, first 5 | reward, last 5 | wall (s) |
|---|---|---|---|---|
| tiny_cpu | 40 | 0.125 | 0.458 | 205 |
| quickstart_train_nosearch | 50 | 0.033 | 0.006 | 67 |

tiny_cpu learns to search and read; the no-search contrast has nothing to read and only its
memory to train (the quickstart evaluates it as trained, with no search).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from simsearch.config import QuickstartRecipe, TrainRecipe, load_recipe
from simsearch.experiments import pipeline, stages
from simsearch.training.runlog import read_metrics

ROOT = Path(__file__).resolve().parents[1]
CPU_RECIPES = {
    "tiny_cpu": ROOT / "recipes" / "train" / "tiny_cpu.yaml",
    "quickstart_train_nosearch": ROOT / "recipes" / "quickstart" / "train_nosearch.yaml",
}
"""Train recipes that run on a CPU from the quickstart's world and base policy alone."""
QUICKSTART_DIR = "runs/quickstart"  # where the shipped recipes expect the quickstart's files
SMOKE_WORLD = ["tinyworld.n_entities=24", "tinyworld.n_train_entities=16", "tinyworld.n_background_entities=48"]
SMOKE_TRAIN = ["steps=2", "prompts_per_step=2", "rollout.group_size=2", "eval_every=0", "save_every=0"]


def moved_paths(recipe_file: Path, artifacts: str) -> list[str]:
    """Overrides pointing every `runs/quickstart` path of the recipe (strings and lists of them) at `artifacts`."""
    container = OmegaConf.to_container(OmegaConf.load(recipe_file))
    overrides = []
    for key, value in _leaves(container):
        values = value if isinstance(value, list) else [value]
        if key == "run_dir" or not any(isinstance(v, str) and v.startswith(QUICKSTART_DIR + "/") for v in values):
            continue
        moved = [artifacts + v[len(QUICKSTART_DIR) :] if isinstance(v, str) else v for v in values]
        overrides.append(f"{key}=[{','.join(moved)}]" if isinstance(value, list) else f"{key}={moved[0]}")
    return overrides


def _leaves(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [leaf for key, item in value.items() for leaf in _leaves(item, f"{prefix}{key}.")]
    return [(prefix.rstrip("."), value)]


def first_and_last(rewards: list[float]) -> tuple[float, float]:
    """Mean of the first and of the last five values (of each half when there are fewer than ten)."""
    width = min(5, max(1, len(rewards) // 2))
    return statistics.fmean(rewards[:width]), statistics.fmean(rewards[-width:])


def run_recipe(name: str, recipe_file: Path, artifacts: str, run_dir: Path, *, smoke: bool) -> dict[str, Any]:
    """Trains one recipe as shipped (its paths moved to `artifacts`); returns its reward figures."""
    overrides = [*moved_paths(recipe_file, artifacts), f"run_dir={run_dir / name}", "resume=false"]
    recipe = load_recipe(TrainRecipe, recipe_file, [*overrides, *(SMOKE_TRAIN if smoke else [])])
    began = time.perf_counter()
    stages.train(recipe)
    rewards = [row["reward/mean"] for row in read_metrics(recipe.run_dir) if "reward/mean" in row]
    first, last = first_and_last(rewards)
    return {"reward_first5": round(first, 4), "reward_last5": round(last, 4), "steps": len(rewards),
            "wall_s": round(time.perf_counter() - began, 1)}  # fmt: skip


def table_lines(results: dict[str, dict[str, Any]]) -> list[str]:
    """The results as a Markdown table."""
    lines = ["| recipe | steps | reward, first 5 | reward, last 5 | wall (s) |", "|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['steps']} | {r['reward_first5']:.3f} | {r['reward_last5']:.3f} | {r['wall_s']:.0f} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Builds (or reuses) the quickstart's world and base, trains every CPU recipe; prints and returns the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="two steps each, on a smoke world and base")
    parser.add_argument("--run-dir", default="", help="runs/recipes_benchmark, or a temporary directory with --smoke")
    parser.add_argument(
        "--artifacts", default="", help=f"the quickstart's run directory ({QUICKSTART_DIR}; smoke: in --run-dir)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0 = every core)")
    args = parser.parse_args(argv)
    run_dir = Path(
        args.run_dir or (tempfile.mkdtemp(prefix="recipes-smoke-") if args.smoke else "runs/recipes_benchmark")
    )
    artifacts = args.artifacts or (str(run_dir / "quickstart") if args.smoke else QUICKSTART_DIR)
    if args.threads:
        torch.set_num_threads(args.threads)
    world_recipe = load_recipe(
        QuickstartRecipe, None, [f"run_dir={artifacts}", f"threads={args.threads}", f"smoke={str(args.smoke).lower()}",
                                 *(SMOKE_WORLD if args.smoke else [])],
    )  # fmt: skip
    pipeline.world_and_base(world_recipe)
    results = {name: run_recipe(name, path, artifacts, run_dir, smoke=args.smoke) for name, path in CPU_RECIPES.items()}
    print("\n".join(table_lines(results)))
    figures = {**results, "smoke": args.smoke, "threads": torch.get_num_threads()}
    print(json.dumps(figures), flush=True)
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
