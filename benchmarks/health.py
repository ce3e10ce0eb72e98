"""The health monitor against real collapses on the tiny worlds: how early each rule fires, and how often on
healthy runs. A study of `benchmarks.study` (its options, workers, --aggregate and --render).

    python -m benchmarks.health --seeds 101 102 --jobs 2 --threads 1   # the reporting worlds (docs/health.md)
    python -m benchmarks.health --seeds 0 100 --threads 1              # development worlds
    python -m benchmarks.health --seeds 0 --aggregate --health entropy_low=0.1   # other thresholds, nothing run
    python -m benchmarks.health --smoke                                # every stage for a few steps, in a temp dir

Per world (seed), a worker runs the quickstart's stages 1-4 in RUN_DIR/world_SEED/quickstart (its world, base
and simulator; a finished stage is reused, world 0's released models installed), then one RL run per arm
(`ARMS`) in RUN_DIR/world_SEED/health/ARM with `recipes/quickstart/train.yaml` on that base and simulator, only
the learning rate and the budget changing, validated every `EVAL_EVERY` steps on `VAL_SIZE` of RL's training
questions (greedy, the simulator in the loop), with `health.on_alarm=warn`; its record (each run's metrics rows
and alarms) is RUN_DIR/world_SEED/health.json. The rules are replayed over each run's metrics (`Monitor`, the
code the trainer runs) with the `health` settings under test: the recipe's defaults, or `--health KEY=VALUE`
(replayed on finished runs at no cost: `--aggregate`).

A run collapsed when a validation EM falls under half of the best validation before it (`em_fall_step`; a
best under `MIN_BEST` is nothing to fall from). A rule's lead is the fall's step minus its first alarm (>= 0:
at or before the fall). Each collapsed run is trained again with `health.on_alarm=rollback` (checkpoints every
`EVAL_EVERY` steps): it recovered when it rolled back, reached the run's budget and its last validation EM is
at least half of that best.

Prints the worlds' block of docs/health.md (`REPORTING`'s, or `health-development`; `--out` another page): the
figures and a table of the runs, one plot per world (health/world_SEED.png beside the page); and, as its last
line, one JSON object: `collapsed_runs`, `detected_runs` (collapsed runs with an alarm at or before the fall),
`median_lead_steps`, `false_alarm_runs` (runs without a fall that raised an alarm), `rollback_recovered_runs`,
`rollback_runs`, `monitor_share` (the monitor's time, `time/health_s`, over the step's, `time/step_s`, mean over
runs), `leads` (rule -> leads over collapsed runs), `health` (the settings replayed), `world_set`, `runs` (the
detail), `seeds`, `smoke`, `wall_s` and `provenance`.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from benchmarks import study
from benchmarks.benchlib import RECIPES
from simsearch.config import QuickstartRecipe, TrainRecipe, load_recipe
from simsearch.experiments import stages
from simsearch.training.health import HEALTH_FILE, STOP_STATUS, HealthConfig, Monitor
from simsearch.training.runlog import read_metrics


@dataclass(frozen=True)
class Arm:
    """One RL run of a world: the learning rate's multiple of the recipe's, and its steps."""

    lr_factor: float
    steps: int


ARMS = {
    "healthy": Arm(1.0, 150),  # the quickstart's recipe (lr 3e-4)
    "lr_x3": Arm(10 / 3, 150),  # lr 1e-3; world 0: the reward drifted down from step 40, no fall in 140 steps
    "lr_x10": Arm(10.0, 60),  # lr 3e-3; world 0: every group flat, reward 0, from step 8
}
"""Arm -> how it differs from the quickstart's RL recipe (docs/health.md, chosen on world 0)."""
REPORTING: dict[tuple[int, ...], str] = {(101, 102): "health-results", (103, 104): "health-next-results"}
"""Each pre-registered set of reporting worlds (docs/health.md) -> its block of the page; any other set of
worlds is a development set and writes `health-development`."""
REPORTING_WORLDS = (103, 104)  # the next design's (its plan in docs/health.md)
"""The worlds docs/health.md declared before any health run of theirs: no threshold was chosen on them."""
EVAL_EVERY = 1  # a fall is timed at the step it happens (docs/health.md, the next design)
VAL_SIZE = 64
MIN_BEST = 0.1
SMOKE_STEPS = 3
SMOKE_TRAIN = ["prompts_per_step=2", "rollout.group_size=2", "data.val_size=4", "eval_every=1"]


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--health", nargs="*", default=[], help="settings replayed, KEY=VALUE (default: the recipe's)")


def _check(args: argparse.Namespace) -> str:
    """A bad `--health` setting, in one line, before any run."""
    try:
        health_config(args.health)
    except Exception as bad:  # omegaconf's key and type errors, the section's own checks
        return f"--health {' '.join(args.health)}: {str(bad).splitlines()[0]}"
    return ""


def health_config(settings: Sequence[str]) -> HealthConfig:
    """The recipe's default `health` section with `settings` (KEY=VALUE) applied, checked."""
    merged = OmegaConf.merge(OmegaConf.structured(HealthConfig), OmegaConf.from_dotlist(list(settings)))
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, HealthConfig)
    cfg.check("--health")
    return cfg


def run_world(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """The quickstart's stages 1-4, every arm's warn run, and a rollback run of each that collapsed (under
    `args.health`); the world's record: each run's rows and alarms."""
    from simsearch.experiments import pipeline

    root = args.run_dir / f"world_{seed}"
    overrides = [f"run_dir={root / 'quickstart'}", f"seed={seed}", f"smoke={args.smoke}", f"threads={args.threads}",
                 "simulator=fit"]  # fmt: skip
    _, paths, fingerprints = pipeline.through_simulator(load_recipe(QuickstartRecipe, None, overrides))
    runs = []
    for name, arm in ARMS.items():
        run = train_run(root, name, arm, seed, paths, fingerprints, args, [])
        run["rollback"] = None
        if em_fall_step(run["rows"]) is not None:  # trained again, acting on the alarms
            rollback = ["health.on_alarm=rollback", f"save_every={1 if args.smoke else EVAL_EVERY}",
                        *(f"health.{setting}" for setting in args.health)]  # fmt: skip
            run["rollback"] = train_run(root, f"{name}_rollback", arm, seed, paths, fingerprints, args, rollback)
        runs.append({"world": seed, "arm": name, **run})
    return {"seed": seed, "health": args.health, "runs": runs}


def train_run(
    root: Path,
    name: str,
    arm: Arm,
    seed: int,
    paths: dict[str, str],
    fingerprints: dict[str, str],
    args: argparse.Namespace,
    extra: list[str],
) -> dict[str, Any]:
    """One RL run of `arm` (into root/health/NAME, fingerprinted: a finished one is reused); its metrics rows and
    health.jsonl rows."""
    recipe = load_recipe(TrainRecipe, RECIPES / "train.yaml", [])
    out = root / "health" / name
    overrides = [
        f"seed={seed}", f"run_dir={out}", f"policy.model.path={paths['base']}", f"threads={args.threads}",
        f"data.train=[{paths['train']}]", f"data.val=[{paths['train']}]", f"data.val_size={VAL_SIZE}",
        f"eval_every={EVAL_EVERY}", f"steps={SMOKE_STEPS if args.smoke else arm.steps}",
        f"optim.lr={recipe.optim.lr * arm.lr_factor}", "trajectory_samples=0",
        f"search.simulator.generation.model.path={paths['simulator']}", f"search.cache={root / 'cache' / name}.sqlite",
        *(SMOKE_TRAIN if args.smoke else []), *extra,
    ]  # fmt: skip
    inputs = [fingerprints["base"], fingerprints["simulator"]]
    stages.run_stage(TrainRecipe, RECIPES / "train.yaml", overrides, _tolerating_stop(stages.train), inputs)
    path = out / HEALTH_FILE
    alarms = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return {"rows": read_metrics(out), "alarms": alarms}


def _tolerating_stop(command: Callable[[Any], Any]) -> Callable[[Any], None]:
    """`command`, with the health monitor's stop (past max_rollbacks: SystemExit) as a finished run."""

    def run(recipe: Any) -> None:
        try:
            command(recipe)
        except SystemExit as stopped:
            if stopped.code != STOP_STATUS:
                raise

    return run


def em_fall_step(rows: list[dict[str, Any]]) -> int | None:
    """The first step whose validation EM is under half of the best validation before it (that best at least
    `MIN_BEST`); None without a fall."""
    best = 0.0
    for row in rows:
        em = row.get("val/em")
        if em is None:
            continue
        if best >= MIN_BEST and em < 0.5 * best:
            return int(row["step"])
        best = max(best, em)
    return None


def first_alarms(rows: list[dict[str, Any]], cfg: HealthConfig) -> dict[str, int]:
    """Rule -> the step of its first alarm, the rules of `cfg` replayed over a run's metrics rows."""
    monitor = Monitor(cfg)
    out: dict[str, int] = {}
    for row in rows:
        for alarm in monitor.observe(int(row["step"]), row):
            out.setdefault(alarm.rule, alarm.step)
    return out


def _judge(run: dict[str, Any], cfg: HealthConfig) -> dict[str, Any]:
    """A run's figures: its fall, its first alarms under `cfg`, the monitor's share of its time, its rollback's
    outcome (None without one)."""
    rows = run["rows"]
    fall = em_fall_step(rows)
    ems = [row["val/em"] for row in rows if row.get("val/em") is not None]
    judged = {"world": run["world"], "arm": run["arm"], "fall": fall, "alarms": first_alarms(rows, cfg),
              "share": sum(r.get("time/health_s", 0.0) for r in rows) / sum(r["time/step_s"] for r in rows),
              "best_em": max(ems, default=None), "last_em": ems[-1] if ems else None, "recovered": None}  # fmt: skip
    back = run.get("rollback")
    if back is not None and fall is not None:
        rolled = any(row.get("action") == "rolled_back" for row in back["alarms"])
        before = [row["val/em"] for row in rows if row.get("val/em") is not None and row["step"] < fall]
        last = [row["val/em"] for row in back["rows"] if row.get("val/em") is not None][-1:]
        budget = max(row["step"] for row in back["rows"]) >= max(row["step"] for row in rows)
        judged["recovered"] = bool(budget and last and last[0] >= 0.5 * max(before)) if rolled else None
    return judged


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The benchmark's figures from each run's `fall`, `alarms` (rule -> first step), `share` and `recovered`."""
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


def _summary(worlds: dict[int, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The figures: the rules replayed under `args.health` over every world's runs, summed up."""
    cfg = health_config(args.health)
    runs = [_judge(run, cfg) for seed in args.seeds for run in worlds[seed]["runs"]]
    return {**summarize(runs), "health": args.health, "world_set": _world_set(args.seeds), "runs": runs}


def _world_set(seeds: Sequence[int]) -> str:
    return "reporting" if tuple(sorted(seeds)) in REPORTING else "development"


def run_table(runs: list[dict[str, Any]]) -> list[str]:
    lines = ["| world | arm | best / last val EM | EM fall step | first alarms (rule step) | rollback recovered |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in runs:
        alarms = ", ".join(f"{rule} {step}" for rule, step in sorted(r["alarms"].items(), key=lambda kv: kv[1]))
        ems = "-" if r["best_em"] is None else f"{r['best_em']:.3f} / {r['last_em']:.3f}"
        lines.append(f"| {r['world']} | {r['arm']} | {ems} | {r['fall'] or 'none'} | {alarms or 'none'} | "
                     f"{'-' if r['recovered'] is None else r['recovered']} |")  # fmt: skip
    return lines


def page(figures: dict[str, Any], args: argparse.Namespace) -> dict[str, str]:
    """The worlds' block (`REPORTING`'s, or `health-development`): the figures, the per-run table and each
    world's plot."""
    del args
    keys = ("collapsed_runs", "detected_runs", "median_lead_steps", "false_alarm_runs", "rollback_recovered_runs",
            "rollback_runs")  # fmt: skip
    share = figures["monitor_share"]
    lines = [
        f"Worlds {', '.join(map(str, figures['seeds']))} ({figures['world_set']}), health settings replayed: "
        f"{' '.join(figures['health']) or 'the defaults'}. {study.measured(figures['provenance'])}",
        "",
        ", ".join(f"`{key}` {figures[key]}" for key in keys)
        + f", monitor {'-' if share is None else f'{100 * share:.2f}%'} of step time.",
        "",
        *run_table(figures["runs"]),
        "",
        *(f"![world_{seed}](health/world_{seed}.png)" for seed in figures["seeds"]),
    ]
    return {REPORTING.get(tuple(sorted(figures["seeds"])), "health-development"): "\n".join(lines)}


PLOTTED = ("val/em", "reward/mean", "sampling/flat_share", "health/entropy", "rollout/answer_rate")


def charts(figures: dict[str, Any], out: Path, worlds: dict[int, dict[str, Any]] | None) -> None:
    """Each world's plot, health/world_SEED.png beside the page `out`, from its runs' metrics rows; none with
    --render (the figures hold no rows: the plots are kept)."""
    if worlds is None:
        print("health: --render reads no metrics rows: the plots are kept as they are", flush=True)
        return
    for seed in figures["seeds"]:
        plot_world(worlds[seed], figures["runs"], out.parent / "health" / f"world_{seed}.png")


def plot_world(world: dict[str, Any], judged: list[dict[str, Any]], path: Path) -> None:
    """One panel per arm of a world: the validation EM and the signals over steps, the EM's fall (red) and each
    rule's first alarm (dashed, labelled) marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = world["runs"]
    figure, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 4), dpi=100, squeeze=False)
    for ax, run in zip(axes[0], runs, strict=True):
        mine = next(j for j in judged if j["world"] == run["world"] and j["arm"] == run["arm"])
        for key in PLOTTED:
            points = [(row["step"], row[key]) for row in run["rows"] if row.get(key) is not None]
            if points:
                ax.plot(*zip(*points), marker="o" if key == "val/em" else None, markersize=3, label=key)
        if mine["fall"] is not None:
            ax.axvline(mine["fall"], color="red", label="EM fall")
        for rule, step in mine["alarms"].items():
            ax.axvline(step, color="black", linestyle="--", linewidth=0.8)
            ax.annotate(rule, (step, 1.02), rotation=90, fontsize="x-small", va="bottom")
        ax.set_title(f"world {run['world']}: {run['arm']}", pad=40)
        ax.set_xlabel("step")
        ax.set_ylim(0, 1.05)
    axes[0][0].legend(fontsize="x-small", loc="lower left")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)


STUDY = study.Study(
    name="health",
    description=__doc__ or "",
    title="Health benchmark",
    seeds=REPORTING_WORLDS,
    world=run_world,
    summary=_summary,
    page=page,
    options=_options,
    check=_check,
    done=lambda world: f"{len(world['runs'])} runs",
    charts=charts,
)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return study.main(STUDY, argv)


if __name__ == "__main__":
    main()
