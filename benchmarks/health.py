"""The health monitor against real collapses: how early each rule fires, and how often on healthy runs.

    python -m benchmarks.health                 # the arms below, seeds 0 1, 40 steps (docs/health.md)
    python -m benchmarks.health --smoke         # two arms, 3 steps, in a temp dir (its test)

World: the toy world of `tests.toy_world` (16 "What color is item N?" questions, BM25 over 16
passages, a tiny Qwen2 taught to search once and answer red or blue), validated on its first 4
questions every step. Each arm is a set of `simsearch train` overrides (`ARMS`); collapses are
induced by the learning rate (x3 the toy settings' 1e-3) and by dropping the KL term. Every run
uses `health.on_alarm=warn` with the default rules, so it runs to the end and records every alarm.

A run collapsed when its validation EM falls under half of its best over the first
`BASELINE_EVALS` steps (`em_fall_step`); a rule's lead is the fall's step minus the rule's first
alarm (> 0: before the fall). Each collapsed arm runs once more with `health.on_alarm=rollback`: if
it rolled back, it recovered when it finished with its last validation EM not under half of that
baseline (a run without a rollback counts in neither `rollback_runs` nor the recovered ones).

Last line: one JSON object with `collapsed_runs`, `detected_runs` (collapsed runs with an alarm at
or before the fall), `median_lead_steps`, `false_alarm_runs` (alarms on runs that did not
collapse), `rollback_recovered_runs`, `rollback_runs`, `monitor_share` (the monitor's time,
`time/health_s`, over the step's, `time/step_s`, mean over runs), `leads` (rule -> leads over
collapsed runs), `runs` (the detail), `provenance`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.benchlib import provenance
from simsearch.commands import train
from simsearch.config import TrainRecipe, load_recipe
from simsearch.training.health import HEALTH_FILE
from simsearch.training.runlog import read_metrics
from tests.toy_world import TRAIN_SETTINGS, build_world

ARMS: dict[str, dict[str, object]] = {
    "healthy": {"optim.lr": 3e-4},
    "toy_lr": {"optim.lr": 1e-3},
    "lr_x3": {"optim.lr": 3e-3},
    "no_kl": {"optim.lr": 1e-3, "algorithm.kl_coef": 0.0},
}
"""Arm -> its overrides of the toy world's settings."""

SMOKE_ARMS = ("healthy", "lr_x3")
BASELINE_EVALS = 3
"""The validation EM's baseline: its best over the first this many steps."""


def em_fall_step(rows: list[dict[str, Any]]) -> int | None:
    """The first step whose validation EM is under half of its best over the first `BASELINE_EVALS` steps.

    None without a fall, or when that best is 0 (nothing to fall from).
    """
    evals = [(row["step"], row["val/em"]) for row in rows if row.get("val/em") is not None]
    if len(evals) <= BASELINE_EVALS:
        return None
    best = max(em for _, em in evals[:BASELINE_EVALS])
    return next((step for step, em in evals[BASELINE_EVALS:] if em < 0.5 * best), None) if best > 0 else None


def first_alarms(alarms: list[dict[str, Any]]) -> dict[str, int]:
    """Rule -> the step of its first alarm (rows of health.jsonl that name a rule)."""
    out: dict[str, int] = {}
    for row in alarms:
        if "rule" in row:
            out.setdefault(row["rule"], row["step"])
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The benchmark's figures from each run's `fall`, `alarms` (rule -> first step), `share` and rollback result."""
    collapsed = [r for r in runs if r["fall"] is not None]
    detected = [r for r in collapsed if r["alarms"] and min(r["alarms"].values()) <= r["fall"]]
    leads: dict[str, list[int]] = {}
    for r in collapsed:
        for rule, step in r["alarms"].items():
            leads.setdefault(rule, []).append(r["fall"] - step)
    firsts = [r["fall"] - min(r["alarms"].values()) for r in detected]
    rolled = [r for r in collapsed if r.get("recovered") is not None]
    return {
        "collapsed_runs": len(collapsed),
        "detected_runs": len(detected),
        "median_lead_steps": statistics.median(firsts) if firsts else None,
        "false_alarm_runs": sum(1 for r in runs if r["fall"] is None and r["alarms"]),
        "rollback_recovered_runs": sum(1 for r in rolled if r["recovered"]),
        "rollback_runs": len(rolled),
        "monitor_share": statistics.mean(r["share"] for r in runs) if runs else None,
        "leads": leads,
    }


def _run(world: Path, run_dir: Path, overrides: dict[str, object]) -> list[dict[str, Any]]:
    base = {"run_dir": run_dir, "policy.model.path": world / "policy", "data.train": f"[{world / 'train.jsonl'}]",
            "data.val": f"[{world / 'val.jsonl'}]", "search.corpus": world / "corpus.jsonl", **TRAIN_SETTINGS,
            "eval_every": 1, "trajectory_samples": 0, "resume": "false", "threads": 1, **overrides}  # fmt: skip
    recipe = load_recipe(TrainRecipe, None, [f"{key}={value}" for key, value in base.items()])
    with contextlib.suppress(SystemExit):  # a rollback run stopped past max_rollbacks
        train.main(recipe)
    path = run_dir / HEALTH_FILE
    alarms = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return [{"rows": read_metrics(run_dir), "alarms": alarms}]


def measure(world: Path, out: Path, arms: list[str], seeds: list[int], steps: int) -> list[dict[str, Any]]:
    """One warn run per (arm, seed), and a rollback run of each that collapsed."""
    runs = []
    for arm in arms:
        for seed in seeds:
            overrides = {**ARMS[arm], "seed": seed, "steps": steps}
            (record,) = _run(world, out / f"{arm}_{seed}", overrides)
            rows = record["rows"]
            ems = [r["val/em"] for r in rows if r.get("val/em") is not None]
            run = {"arm": arm, "seed": seed, "fall": em_fall_step(rows), "alarms": first_alarms(record["alarms"]),
                   "share": sum(r["time/health_s"] for r in rows) / sum(r["time/step_s"] for r in rows),
                   "last_em": ems[-1] if ems else None}  # fmt: skip
            if run["fall"] is not None:
                (back,) = _run(world, out / f"{arm}_{seed}_rollback", {**overrides, "health.on_alarm": "rollback"})
                rows_back = back["rows"]
                best = max(r["val/em"] for r in rows[:BASELINE_EVALS] if r.get("val/em") is not None)
                last = rows_back[-1].get("val/em") if rows_back and rows_back[-1]["step"] == steps else None
                rolled_back = any(row.get("action") == "rolled_back" for row in back["alarms"])
                run["recovered"] = (last is not None and last >= 0.5 * best) if rolled_back else None
            runs.append(run)
    return runs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="two arms, 3 steps, seed 0, in a temp dir")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--out", type=Path, default=None, help="where the world and runs go (default: a temp dir)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    began = time.monotonic()
    arms, seeds, steps = (list(SMOKE_ARMS), [0], 3) if args.smoke else (list(ARMS), args.seeds, args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        world = out / "world"
        if not (world / "policy").is_dir():
            world.mkdir(parents=True, exist_ok=True)
            build_world(world)
        runs = measure(world, out, arms, seeds, steps)
    result = {**summarize(runs), "runs": runs, "steps": steps, "seeds": seeds, "smoke": args.smoke,
              "wall_s": time.monotonic() - began, "provenance": provenance()}  # fmt: skip
    for run in runs:
        print(f"{run['arm']:>8} seed {run['seed']}: EM fall {run['fall']}, first alarms {run['alarms']}, "
              f"last EM {run['last_em']}, recovered {run.get('recovered')}")  # fmt: skip
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
