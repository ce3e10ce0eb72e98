"""How many RL steps the quickstart needs: its RL run at shorter budgets against its full one, on development
worlds (the pre-registration and its rule: docs/budget.md).

    python -m benchmarks.budget --seeds 100 101 102 --jobs 1 --threads 1 --run-dir runs/controls   # as registered
    python -m benchmarks.budget --smoke                                       # a pipeline check
    python -m benchmarks.budget --seeds 100 101 102 --run-dir runs/controls --aggregate   # the finished worlds again

Per world (seed): `simsearch quickstart` in RUN_DIR/world_SEED/quickstart (a finished stage is reused); then
for each of `BUDGETS` the same RL stage with only `steps`, its run directory and its search cache changed
(RUN_DIR/world_SEED/budget/steps_N), and that policy's greedy held-out EM on BM25 and dense, as the quickstart
evaluates its own. The reference is the full run of `FULL` steps: the quickstart's own RL run when it takes
that many, else trained as a budget is.

Output: each world's record, RUN_DIR/world_SEED/budget.json; the `results` block of docs/budget.md; as the last
line one JSON object: `em` (steps -> engine -> mean over worlds), `minus_full` (steps -> engine -> the paired
difference from the full run: mean, ci_low, ci_high), `chosen` (the steps the rule picks), `rl_s` (steps ->
seconds of RL, mean over worlds), `interval_method`, `by_world` and the runner's keys.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks import study
from benchmarks.benchlib import INTERVAL_METHOD, difference_cell, paired

BUDGETS = (50, 100, 150)  # RL steps tried against the full run's
SMOKE_BUDGETS = (1,)
FULL = 250  # the quickstart's RL steps when the study was registered (it picked 50 for the default since)
SMOKE_FULL = 2  # the quickstart smoke's
ENGINES = ("bm25", "dense")
TOLERANCE = 2.0  # EM points a shorter budget may lose, in the mean over worlds, on each engine (the rule)
SMOKE_LIMIT = 8  # held-out questions per evaluation in smoke mode, as the quickstart's smoke


def run_world(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """The quickstart, then the RL stage at each budget and its policy's held-out EM; the world's record."""
    from simsearch.config import TrainRecipe, load_recipe
    from simsearch.experiments import pipeline, quickstart

    run = study.Run(seed, args)
    qs = study.quickstart_recipe(run.root / "quickstart", seed, args)
    report = quickstart.main(qs)  # sets this process's torch threads
    qs_dir = Path(qs.run_dir)
    run.paths, run.fingerprints = pipeline.finished_run(qs_dir)
    full, em, rl_s = SMOKE_FULL if args.smoke else FULL, {}, {}
    budgets = SMOKE_BUDGETS if args.smoke else BUDGETS
    if load_recipe(TrainRecipe, qs_dir / "train" / "recipe.yaml", []).steps == full:  # the quickstart ran it
        em[str(full)] = {engine: report["em"]["rl_search"][engine] for engine in ENGINES}
        rl_s[str(full)] = rl_seconds(qs_dir / "train")
    else:
        budgets = (*budgets, full)
    for steps in budgets:
        cache = run.root / "cache" / f"budget_{steps}.sqlite"
        overrides = [
            f"steps={steps}", f"threads={args.threads}", f"search.cache={cache}",
            f"search.simulator.generation.model.path={run.paths['simulator']}",
            *(["save_every=1"] if args.smoke else []),  # as the quickstart's smoke
        ]  # fmt: skip
        out = run.root / "budget" / f"steps_{steps}"
        policy_fp = study.train(out, seed=seed, base=run.paths["base"], questions=run.paths["train"],
                                inputs=[run.fingerprints["base"], run.fingerprints["simulator"]], overrides=overrides,
                                smoke=args.smoke)  # fmt: skip
        em[str(steps)] = run.heldout_em(run.root / "eval_budget" / f"steps_{steps}", pipeline.final_model(out),
                                        [policy_fp, run.fingerprints["world"]], ENGINES, [f"threads={args.threads}"],
                                        smoke_limit=SMOKE_LIMIT)  # fmt: skip
        rl_s[str(steps)] = rl_seconds(out)
    return {"full": full, "em": em, "rl_s": rl_s}


def rl_seconds(run: Path) -> float:
    """The seconds an RL run's steps took (the sum of `time/step_s`)."""
    from simsearch.training.runlog import read_metrics

    return round(sum(float(row.get("time/step_s", 0.0)) for row in read_metrics(run)), 1)


def _done(record: dict[str, Any]) -> str:
    return "BM25 EM by steps: " + ", ".join(f"{steps} {em['bm25']:.1f}" for steps, em in record["em"].items())


def summarize(worlds: dict[int, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The figures: EM per budget (means over worlds), each budget minus the full run paired by world, the
    budget the rule picks, RL seconds."""
    del args
    records = list(worlds.values())
    fulls = {record["full"] for record in records}
    if len(fulls) != 1:
        raise SystemExit(f"budget: the worlds' full runs differ in steps ({sorted(fulls)}); sum up one recipe")
    full = str(fulls.pop())
    budgets = sorted({steps for record in records for steps in record["em"]}, key=int)
    em = {b: {e: round(mean([r["em"][b][e] for r in records]), 2) for e in ENGINES} for b in budgets}
    minus_full = {b: {e: paired(differences(records, b, full, e)) for e in ENGINES} for b in budgets if b != full}
    return {
        "full": int(full),
        "em": em,
        "minus_full": minus_full,
        "chosen": choose(minus_full, int(full)),
        "rl_s": {b: round(mean([r["rl_s"][b] for r in records]), 1) for b in budgets},
        "interval_method": INTERVAL_METHOD,
        "by_world": {str(seed): record for seed, record in worlds.items()},
    }


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def differences(records: list[dict[str, Any]], budget: str, full: str, engine: str) -> list[float]:
    """Per world: the budget's held-out EM minus the full run's, on `engine`."""
    return [record["em"][budget][engine] - record["em"][full][engine] for record in records]


def choose(minus_full: dict[str, dict[str, dict[str, float | None]]], full: int) -> int:
    """The rule: the fewest steps whose mean EM is at most `TOLERANCE` points under the full run's on every
    engine; the full run's steps when none is."""
    kept = [int(b) for b, by_engine in minus_full.items() if all(d["mean"] >= -TOLERANCE for d in by_engine.values())]
    return min(kept, default=full)


def page(figures: dict[str, Any], args: argparse.Namespace) -> dict[str, str]:
    """docs/budget.md's `results` block: per world and in mean, the paired differences and the rule's pick."""
    worlds, full = figures["by_world"], str(figures["full"])
    budgets = list(figures["em"])
    smoke = " (smoke: a pipeline check, not a result)" if figures["smoke"] else ""
    command = (f"python -m benchmarks.budget --seeds {' '.join(worlds)} --jobs {args.jobs} --threads {args.threads} "
               f"--run-dir {args.run_dir}")  # fmt: skip
    records = list(worlds.values())
    cells = [[b, *(study.spread([r["em"][b][e] for r in records]) for e in ENGINES), f"{figures['rl_s'][b]:.0f}"]
             for b in budgets]  # fmt: skip
    per_world = ([seed, *(f"{w['em'][b]['bm25']:.1f} / {w['em'][b]['dense']:.1f}" for b in budgets)]
                 for seed, w in worlds.items())  # fmt: skip
    minus = ([b, *(difference_cell(differences(records, b, full, e)) for e in ENGINES)]
             for b in budgets if b != full)  # fmt: skip
    lines = [
        f"Command: `{command}`{smoke}. {study.measured(figures['provenance'])}",
        "",
        "Held-out EM (%), greedy, BM25 / dense, by RL steps:",
        "",
        *study.table(["world", *(f"{b} steps" for b in budgets)], per_world),
        "",
        *study.table(["RL steps", "BM25", "dense", "RL seconds (mean)"], cells),
        "",
        f"Each budget minus the full run ({full} steps), paired by world: mean, and {INTERVAL_METHOD}:",
        "",
        *study.table(["RL steps", *ENGINES], minus),
        "",
        f"The rule (at most {TOLERANCE:g} points under the full run on each engine, fewest steps) picks "
        f"**{figures['chosen']} steps**.",
    ]
    return {"results": "\n".join(lines)}


STUDY = study.Study(
    name="budget",
    description=__doc__ or "",
    title="The quickstart's RL budget",
    seeds=(100, 101, 102),  # development worlds
    world=run_world,
    summary=summarize,
    page=page,
    done=_done,
)


main = STUDY.main


if __name__ == "__main__":
    main()
