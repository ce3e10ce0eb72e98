"""Does the simulator teach search, or only show answers? RL arms that differ only in the engine in the loop.

    python -m benchmarks.controls --seeds 200 201 202 203 204 205 --jobs 2 --threads 1  # the reporting worlds
    python -m benchmarks.controls --seeds 100 101 102 --jobs 2 --threads 1   # development worlds
    python -m benchmarks.controls --smoke                                    # a pipeline check
    python -m benchmarks.controls --seeds 100 101 --aggregate                # worlds run in parts, summarized
    python -m benchmarks.controls --seeds 0 1 --arms noisy --borrow docs/controls/avx512  # some arms again
    python -m benchmarks.controls --seeds 0 1 --aggregate --compare docs/controls/avx512  # against earlier runs

Per world: `simsearch quickstart` in RUN_DIR/world_SEED (its RL run is the simulator arm), the knowing
simulator and its fidelity to BM25 (`simsearch.experiments.knowing`), then one RL run per arm of `ARMS` on the
same base and recipe, only the engine in the loop changed (each arm's purpose: docs/controls.md); every policy
evaluated greedily on the held-out questions against BM25 and dense, `STEP_ARMS` at every checkpoint too.
`--arms` takes the arms not run from an earlier record of the same world and base (RUN_DIR's, or `--borrow`'s);
`--compare DIR` pairs each arm whose EM moved with DIR's records; `--gate` measures the knowing simulator only.

Prints mean ± sd per arm and paired differences with 95% t-intervals over worlds, and as its last line one
JSON object: `knowing_em_bm25_mean` / `_min`, `oracle_em_bm25_mean`, `knowing_over_oracle_mean` / `_ci_low` /
`_ci_high`, `knowing_share_of_bm25_loop_gain`, `sim_em_bm25_mean` / `_min`, `sim_over_best_control_mean` /
`_ci_low` / `_ci_high` (per world the best of `CONTROLS` on BM25), `sim_share_of_bm25_loop_gain` ((arm - base) /
(bm25 arm - base)), `interval_method`, `wall_s_max`, `peak_rss_gb_max`, `world_set` and the detail per world.
The reporting worlds (`REPORTING_WORLDS`, all six) write docs/controls.md's `results` block and the README's
headline, any other set its `development` block, a partial set nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import study
from benchmarks.benchlib import INTERVAL_METHOD, RECIPES, mean_sd, paired, provenance, replace_block, t_interval
from benchmarks.benchlib import difference_cell as t_cell
from simsearch.experiments import pipeline, probes, quickstart
from simsearch.experiments.knowing import KNOWING_DESIGN, KNOWING_DESIGNS, knowing_simulator, measure_fidelity
from simsearch.fingerprints import digest

ARMS: dict[str, study.Arm] = {
    "knowing": study.Arm(simulator="knowing"),
    "oracle": study.Arm(study.engine("oracle")),
    "bm25": study.Arm(study.engine("bm25")),
    "empty": study.Arm(study.engine("empty", ())),
    "random": study.Arm(study.engine("random", ("corpus",))),
    "noisy": study.Arm({"curriculum.kind": "constant", "curriculum.p_start": "1.0"}),
    "answerless": study.Arm(study.engine("answerless")),
}
"""Arm -> its edits of the quickstart's train.yaml (the simulator arm is the quickstart's RL run), in running order."""
SIMULATOR_ARMS = ("noisy",)  # arms whose engine is the quickstart's simulator
CONTROLS = ("empty", "random", "noisy", "answerless")  # engines not meant to give the answer
STEP_ARMS = ("simulator", "knowing", "oracle", "bm25")  # evaluated at every checkpoint: EM against steps
ROWS = ("base", "simulator", *ARMS)
ENGINES = ("bm25", "dense")
REPORTING_WORLDS = (200, 201, 202, 203, 204, 205)
"""The worlds pre-registered in docs/controls.md before any ran: no design choice has seen them."""

SMOKE_TRAIN = ["steps=2", "save_every=1"]  # on top of the runner's
SMOKE_LIMIT = 8  # held-out questions per evaluation (and RL questions per fidelity) in smoke mode
GATE_SHARE = 0.5  # the gate: the knowing simulator shows the answer at least half as often as today's


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The study (`STUDY`) on `argv`, or the gate with `--gate`; the reporting worlds' figures also write the
    README's headline."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = study.parse(STUDY, argv)
    if args.gate:
        return gate(args)
    figures = study.main(STUDY, argv, args)
    if figures:  # not in a worker
        write_headline(figures)
    return figures


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--knowing",
        choices=tuple(KNOWING_DESIGNS),
        default=KNOWING_DESIGN,
        help=f"the knowing simulator's design (default: {KNOWING_DESIGN}, the gate's choice)",
    )
    parser.add_argument(
        "--gate", action="store_true", help="build and measure the knowing simulator only (the gate), no RL"
    )
    parser.add_argument("--borrow", default="", help="take the arms not run from this directory's world records")
    parser.add_argument("--compare", default="", help="each arm's paired difference from this directory's records")
    parser.add_argument("overrides", nargs="*", help="quickstart recipe overrides, after --")


def _check(args: argparse.Namespace) -> str:
    for option, other in (("--borrow", args.borrow), ("--compare", args.compare)):
        for seed in args.seeds if other else []:
            if not (Path(other) / f"world_{seed}" / "controls.json").is_file():
                return f"{option} {other}: no world_{seed}/controls.json there"
    return ""


def world_commits(worlds: dict[int, dict[str, Any]]) -> str:
    """The commit each world ran at, as one phrase: "abc1234", or "abc1234 (worlds 0, 1), def5678 (world 2)";
    an arm run at another commit than its world's quickstart is named: "abc1234 + the answerless arm at def5678"."""

    def commits(world: dict[str, Any]) -> str:
        commit = world.get("commit", "not recorded")
        others = [f"the {arm} arm at {run['commit']}" for arm, run in world.get("arm_runs", {}).items()
                  if run["commit"] != commit]  # fmt: skip
        return " + ".join([commit, *others])

    return study.by_world(worlds, commits)


# --------------------------------------------------------------------------- one world (a worker)


def run_world(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """The quickstart, then every arm, its evaluation (at each checkpoint for `STEP_ARMS`); writes controls.json.

    A world run again in the same directory reuses every stage built from the same inputs, and its
    controls.json keeps what the earlier run recorded of them (commit, times, machine): only what
    ran now is recorded as now.
    """
    where = provenance()  # the code this world runs, before anything can change it
    run = study.Run(seed, args)
    record = run.root / "controls.json"
    previous = json.loads(record.read_text()) if record.is_file() else {}
    qs, report = run_quickstart(run)
    here = {"commit": where["commit"], "quickstart_wall_s": report["wall_s"],
            "quickstart_peak_rss_gb": report["peak_rss_gb"],
            "machine": {**report["machine"], "cpu_capability": where["cpu_capability"]}}  # fmt: skip
    recorded = previous.get("fingerprints", {})
    if all(recorded.get(stage) == fp for stage, fp in run.fingerprints.items()):  # the quickstart part was reused
        here = {key: previous[key] for key in here}
    world = pipeline.recipe_world(qs)  # the quickstart's, in memory
    fidelity = knowing_arm(run, world) if "knowing" in args.arms else {}
    em = {"base": _real(report["em"]["base"]), "simulator": _real(report["em"]["rl_search"])}
    arm_runs = run_arms(run, em, previous.get("arm_runs", {}), where["commit"])
    runs = {
        "simulator": run.fingerprints["train"],
        **{arm: arm_run["fingerprint"] for arm, arm_run in arm_runs.items()},
    }
    naming = {arm: quickstart.evaluation_query_naming(run.root / "eval" / arm, world) for arm in args.arms}
    result = {
        "seed": seed,
        **here,  # commit, quickstart_wall_s, quickstart_peak_rss_gb, machine: as first recorded when reused
        "em": em,
        "em_steps": em_at_checkpoints(run, {arm: fp for arm, fp in runs.items() if arm in STEP_ARMS}),
        "fidelity": fidelity or previous.get("fidelity", {}),
        "arm_s": {arm: arm_run["s"] for arm, arm_run in arm_runs.items()},
        "arm_runs": arm_runs,
        "fingerprints": run.fingerprints,
        "query_naming": {**report["query_naming"], **naming},  # how each policy's first held-out query names the person
        "sim_rl_searches_by_kind": probes.searches_by_kind(run.root / "quickstart" / "train"),  # the simulator arm's
        "answer_in_results": {arm: probes.answer_in_results(run.root / "train" / arm if arm in ARMS else
                                                            run.root / "quickstart" / "train")
                              for arm in ("simulator", *args.arms)},
    }  # fmt: skip
    earlier = (
        json.loads((Path(args.borrow) / f"world_{seed}" / "controls.json").read_text()) if args.borrow else previous
    )
    record.write_text(json.dumps(result, indent=2) + "\n")  # kept if nothing can be carried
    carry_arms(result, earlier, args.borrow)
    return result


def run_quickstart(run: study.Run) -> tuple[Any, dict[str, Any]]:
    """The world's quickstart in ROOT/quickstart, its RL run's checkpoints kept; its recipe and report. Sets the
    paths the arms read and the fingerprints of its stages in `run`."""
    qs = study.quickstart_recipe(run.root / "quickstart", run.seed, run.args, *run.args.overrides)
    with probes.keeping_checkpoints(Path(qs.run_dir) / "train", run.root / "kept" / "simulator"):
        report = quickstart.main(qs)  # sets this process's torch threads
    run.paths, run.fingerprints = pipeline.finished_run(Path(qs.run_dir))
    return qs, report


def knowing_arm(run: study.Run, world: Any) -> dict[str, Any]:
    """The knowing simulator in `run.args.knowing`'s design, its fingerprint and model set in `run`; its fidelity
    to BM25 before RL (`measure_fidelity`, on `SMOKE_LIMIT` questions with --smoke)."""
    args = run.args
    run.fingerprints["knowing"], run.paths["knowing"] = knowing_simulator(
        run.root, run.seed, run.paths, run.fingerprints, world, design=args.knowing, recipes=RECIPES,
        threads=args.threads, smoke=args.smoke,
    )  # fmt: skip
    limit = SMOKE_LIMIT if args.smoke else 0
    return {"design": args.knowing, **measure_fidelity(run.root, world, run.paths, design=args.knowing,
                                                       recipes=RECIPES, limit=limit)}  # fmt: skip


def run_arms(
    run: study.Run, em: dict[str, dict[str, float]], recorded: dict[str, dict[str, Any]], commit: str
) -> dict[str, dict[str, Any]]:
    """Each arm of --arms trained and evaluated, its EM into `em`; per arm its run's fingerprint, commit and
    seconds (as `recorded` holds them when the run was reused)."""
    arm_runs: dict[str, dict[str, Any]] = {}
    for arm in run.args.arms:
        began = time.perf_counter()
        policy_fp = train_arm(run, arm)
        policy = pipeline.final_model(run.root / "train" / arm)
        em[arm] = evaluate_policy(run, run.root / "eval" / arm, policy, [policy_fp, run.fingerprints["world"]])
        arm_runs[arm] = {"fingerprint": policy_fp, "commit": commit, "s": round(time.perf_counter() - began, 1)}
        if recorded.get(arm, {}).get("fingerprint") == policy_fp:  # reused
            arm_runs[arm] = recorded[arm]
    return arm_runs


def gate(args: argparse.Namespace) -> dict[str, Any]:
    """docs/controls.md's gate: per world, the quickstart's stages 1-4, the knowing simulator in `args.knowing`'s
    design and both simulators' fidelity (no RL); passes when, in mean over the worlds, the knowing simulator shows
    the answer for at least `GATE_SHARE` of what today's simulator does. Prints a table, then one JSON line."""
    where = provenance()  # the code the gate runs, before anything can change it
    rows = {}
    for seed in args.seeds:
        run = study.Run(seed, args)
        world, run.paths, run.fingerprints = pipeline.through_simulator(
            study.quickstart_recipe(run.root / "quickstart", seed, args, *args.overrides)
        )
        rows[seed] = knowing_arm(run, world)
    names = ("knowing", "simulator", "bm25")
    means = {name: sum(row[name]["answer_shown"] for row in rows.values()) / len(rows) for name in names}
    print(f"gate: the knowing simulator ({args.knowing}) before RL, a good query for each of RL's questions")
    cells = ([seed, *(f"{row[n]['answer_shown']:.2f} / {row[n]['on_topic']:.2f}" for n in names)]
             for seed, row in rows.items())  # fmt: skip
    print("\n".join(study.table(["world", "knowing: answer shown / on topic", "today's simulator", "BM25"], cells)))
    ratio = means["knowing"] / means["simulator"] if means["simulator"] else None
    figures = {
        "design": args.knowing, "worlds": list(rows),
        **{f"{name}_answer_shown_mean": round(means[name], 4) for name in names},
        "knowing_over_simulator": None if ratio is None else round(ratio, 3),
        "passes": ratio is not None and ratio >= GATE_SHARE, **where, "torch_threads": args.threads,
    }  # fmt: skip
    print(json.dumps(figures))
    return figures


def carry_arms(result: dict[str, Any], earlier: dict[str, Any], source: str) -> None:
    """Adds to `result` the arms `earlier` (a record of the same world) ran and `result` did not.

    Raises `SystemExit` when `earlier` is of another world or base (fingerprints or base EM differ);
    an arm on the simulator is carried only when the simulators' fingerprints agree too.
    """
    missing = [arm for arm in ARMS if arm not in result["em"] and arm in earlier.get("em", {})]
    if not missing:
        return
    mine, theirs = result["fingerprints"], earlier["fingerprints"]
    where = f"{source}'s record" if source else "the record in the run directory"
    same = mine["world"] == theirs["world"] and mine["base"] == theirs["base"]
    if not same or result["em"]["base"] != earlier["em"]["base"]:
        raise SystemExit(
            f"controls: world {result['seed']}: {where} is of another world or base (fingerprints {theirs['world']}/"
            f"{theirs['base']}, base EM {earlier['em']['base']}; here {mine['world']}/{mine['base']}, "
            f"{result['em']['base']}); run every arm (drop --arms) or borrow from a record of this base"
        )
    for arm in missing:
        if arm in SIMULATOR_ARMS and mine["simulator"] != theirs["simulator"]:
            continue  # its engine is not this world's simulator
        if arm == "knowing" and "knowing" in mine and mine["knowing"] != theirs.get("knowing"):
            continue  # nor this world's knowing simulator
        if arm == "knowing" and not result.get("fidelity"):
            result["fidelity"] = earlier.get("fidelity", {})
        result["em"][arm] = earlier["em"][arm]
        result["arm_runs"][arm] = {**earlier["arm_runs"][arm], **({"borrowed_from": source} if source else {})}
        result["arm_s"][arm] = earlier["arm_runs"][arm]["s"]
        for key in ("answer_in_results", "query_naming", "em_steps"):
            if arm in earlier.get(key, {}):
                result.setdefault(key, {})[arm] = earlier[key][arm]


def _real(em: dict[str, float]) -> dict[str, float]:
    return {engine: em[engine] for engine in ENGINES}


def train_arm(run: study.Run, arm: str) -> str:
    """One arm's RL run: the quickstart's train.yaml on its base, the engine swapped; its fingerprint.

    Its checkpoints are kept (`probes.keeping_checkpoints`) when the arm is one of `STEP_ARMS`.
    """
    spec, smoke = ARMS[arm], SMOKE_TRAIN if run.args.smoke else []
    overrides = [f"threads={run.args.threads}", f"search.simulator.generation.model.path={run.paths[spec.simulator]}",
                 f"search.cache={run.root / 'cache' / arm}.sqlite", *smoke, *spec.overrides(run.paths)]  # fmt: skip
    keep = run.root / "kept" / arm if arm in STEP_ARMS else None
    with probes.keeping_checkpoints(run.root / "train" / arm, keep) if keep else contextlib.nullcontext():
        return run.train(arm, [run.fingerprints[spec.base], run.fingerprints[spec.simulator]], overrides)


def evaluate_policy(run: study.Run, out: Path, policy: Path, inputs: list[str]) -> dict[str, float]:
    """eval.yaml for the policy at `policy` into `out`, BM25 and dense only; EM (percent) per engine."""
    return run.heldout_em(out, policy, inputs, ENGINES, [f"threads={run.args.threads}"], smoke_limit=SMOKE_LIMIT)


def em_at_checkpoints(run: study.Run, policies: dict[str, str]) -> dict[str, dict[str, dict[str, float]]]:
    """Each arm of `policies` (arm -> its RL run's fingerprint): held-out EM at every checkpoint kept of its run
    (`probes.keeping_checkpoints`), as {arm: {step: {engine: EM}}}; its last checkpoint is its final policy."""
    curves: dict[str, dict[str, dict[str, float]]] = {}
    for arm, run_fp in policies.items():
        curves[arm] = {}
        for checkpoint in sorted((run.root / "kept" / arm).glob("step_*")):
            step = int(checkpoint.name.split("_")[1])
            inputs = [digest({"policy": run_fp, "step": step}), run.fingerprints["world"]]
            out = run.root / "eval_steps" / arm / checkpoint.name
            curves[arm][str(step)] = evaluate_policy(run, out, checkpoint, inputs)
    return curves


# --------------------------------------------------------------------------- over worlds


def summarize(worlds: dict[int, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The JSON figures: per-arm means, paired differences with their t-intervals, the issue's keys, and the
    commit and CPU of each world and arm (`provenance`; with `args.compare`, `versus` that directory)."""
    seeds = list(worlds)
    rows, controls = _run_in_every_world(worlds, ROWS), _run_in_every_world(worlds, CONTROLS)
    em = {row: {e: [worlds[s]["em"][row][e] for s in seeds] for e in ENGINES} for row in rows}
    mean = {row: mean_sd(em[row]["bm25"])[0] for row in rows}
    minus = {
        arm: {o: paired(_differences(worlds, arm, o, "bm25", controls)) for o in _others(arm, rows, controls)}
        for arm in ("simulator", "knowing") if arm in rows
    }  # fmt: skip
    cpus = study.by_world(worlds, lambda world: study.cpu_phrase(world.get("machine", {})))  # each world's machine
    figures: dict[str, Any] = {
        "seeds": seeds,
        "world_set": world_set(seeds),
        "threads": args.threads,
        "smoke": args.smoke,
        "interval_method": INTERVAL_METHOD,
        "sim_em_bm25_mean": round(mean["simulator"], 2),
        "sim_em_bm25_min": round(min(em["simulator"]["bm25"]), 2),
        "sim_share_of_bm25_loop_gain": _share_of_loop_gain(mean, "simulator"),
    }
    if controls:
        figures.update({f"sim_over_best_control_{k}": v for k, v in minus["simulator"]["best control"].items()})
    if "knowing" in rows:
        figures["knowing_em_bm25_mean"] = round(mean["knowing"], 2)
        figures["knowing_em_bm25_min"] = round(min(em["knowing"]["bm25"]), 2)
        figures["knowing_share_of_bm25_loop_gain"] = _share_of_loop_gain(mean, "knowing")
        if "oracle" in rows:
            figures.update({f"knowing_over_oracle_{k}": v for k, v in minus["knowing"]["oracle"].items()})
    if "oracle" in rows:
        figures["oracle_em_bm25_mean"] = round(mean["oracle"], 2)
    return {
        **figures,
        "wall_s_max": max(w["quickstart_wall_s"] for w in worlds.values()),
        "peak_rss_gb_max": max(w["quickstart_peak_rss_gb"] for w in worlds.values()),
        "rows": list(rows),
        "controls": list(controls),
        "em_mean": {row: {e: round(mean_sd(em[row][e])[0], 2) for e in ENGINES} for row in rows},
        "em_sd": {row: {e: round(mean_sd(em[row][e])[1], 2) for e in ENGINES} for row in rows},
        "minus": minus,
        "sim_minus": minus["simulator"],
        "by_world": {str(s): worlds[s] for s in seeds},
        "provenance": {"commit": world_commits(worlds), "cpu": cpus, "aggregated": args.aggregate},
        **({"versus": versus(worlds, args.compare)} if args.compare else {}),
    }


def _others(arm: str, rows: Sequence[str], controls: Sequence[str]) -> list[str]:
    """What `arm` is paired against: each control, the best control (when any), the other step arms, the base."""
    best = ["best control"] if controls else []
    return [*controls, *best, *(o for o in (*STEP_ARMS, "base") if o != arm and o in rows)]


def _share_of_loop_gain(mean: dict[str, float], arm: str) -> float | None:
    """(arm - base) / (bm25 arm - base), means over worlds on BM25; None without the bm25 arm or its gain."""
    if "bm25" not in mean or mean["bm25"] == mean["base"]:
        return None
    return round((mean[arm] - mean["base"]) / (mean["bm25"] - mean["base"]), 3)


def versus(worlds: dict[int, dict[str, Any]], other: str) -> dict[str, Any]:
    """Each row's EM here minus in `other`'s records of the same worlds, per engine and world, for the
    rows both ran whose EM differs in some world; `SystemExit` when a world's base differs there."""
    theirs = {seed: study.finished_world("controls", Path(other), seed) for seed in worlds}
    for seed, world in worlds.items():
        if theirs[seed]["em"]["base"] != world["em"]["base"]:
            raise SystemExit(f"controls: --compare {other}: world {seed}'s base is not this run's; nothing to pair")
    rows = [row for row in ROWS if all(row in w["em"] and row in theirs[s]["em"] for s, w in worlds.items())]
    diffs = {
        row: {e: [worlds[s]["em"][row][e] - theirs[s]["em"][row][e] for s in worlds] for e in ENGINES} for row in rows
    }
    moved = {row: d for row, d in diffs.items() if any(v != 0 for values in d.values() for v in values)}
    return {"dir": other, "commit": world_commits(theirs), "diffs": moved}


def _run_in_every_world(worlds: dict[int, dict[str, Any]], names: Sequence[str]) -> tuple[str, ...]:
    """Those of `names` that every world ran (an arm added later is missing from worlds run before)."""
    return tuple(name for name in names if all(name in world["em"] for world in worlds.values()))


def world_set(seeds: Sequence[int]) -> str:
    """`reporting` (exactly `REPORTING_WORLDS`), `partial` (some of them only), `development` (none of
    them) or `mixed` (both kinds)."""
    reporting = [seed in REPORTING_WORLDS for seed in seeds]
    if all(reporting):
        return "reporting" if set(seeds) == set(REPORTING_WORLDS) else "partial"
    return "mixed" if any(reporting) else "development"


def page(figures: dict[str, Any], args: argparse.Namespace) -> dict[str, str]:
    """docs/controls.md's block for the figures' world set: the reporting worlds' `results`, any other's
    `development`; none for a partial set of the reporting worlds (all six are reported at once)."""
    if figures["world_set"] == "partial" and not figures["smoke"]:
        print(f"controls: the pre-registration reports all of {list(REPORTING_WORLDS)} at once, and this run "
              f"has {figures['seeds']}: no page written; each world's controls.json is kept for that run")  # fmt: skip
        return {}
    return {"results" if figures["world_set"] == "reporting" else "development": "\n".join(doc_lines(figures))}


def charts(figures: dict[str, Any], out: Path, worlds: Any = None) -> None:
    """The plot of EM against RL steps beside the page (PAGE/em_steps_WORLDSET.png), from the figures."""
    del worlds
    arms = [arm for arm in STEP_ARMS if arm in figures["rows"]]
    plot_em_steps(figures["by_world"], arms, out.parent / out.stem / f"em_steps_{figures['world_set']}.png")


HEADLINE_ROWS = {
    "base": "base, no RL",
    "simulator": "RL against a simulator fit on RL's own questions (the quickstart's when these ran)",
    "knowing": "RL against a simulator that knows the world (never fit on RL's people)",
    "oracle": "RL against an oracle that shows the answer whatever the query",
    "bm25": "RL against real BM25 (the reference)",
}
"""The README headline's rows: the arms the pre-registration names, and how a newcomer reads them."""
README = RECIPES.parents[1] / "README.md"


def write_headline(figures: dict[str, Any]) -> None:
    """The README's `headline` block from all the reporting worlds' figures (`headline`); nothing for others."""
    if figures["world_set"] == "reporting" and not figures["smoke"] and README.is_file():
        README.write_text(replace_block(README.read_text(), "headline", "\n" + "\n".join(headline(figures)) + "\n"))


def headline(figures: dict[str, Any]) -> list[str]:
    """The README's headline from the reporting worlds' figures: the arms' EM and the pre-registered sentences."""
    worlds, mean, sd = figures["by_world"], figures["em_mean"], figures["em_sd"]
    controls = figures["controls"]
    lines = [
        f"Held-out exact match (%) on real retrievers, mean ± sd over the {len(worlds)} pre-registered worlds "
        f"({', '.join(worlds)}), each policy trained from the same base with the same recipe and budget, "
        "differing only in the engine in the RL loop:",
        "",
        *study.table(["policy (engine in the RL loop)", "BM25", "dense"],
                     ([label, *(f"{mean[row][e]:.1f} ± {sd[row][e]:.1f}" for e in ENGINES)]
                      for row, label in HEADLINE_ROWS.items() if row in mean)),
        "",
    ]  # fmt: skip
    if "knowing" not in mean or "oracle" not in mean:
        return lines
    versus_oracle = _differences(worlds, "knowing", "oracle", "bm25", controls)
    interval = t_interval(versus_oracle)
    verdict = (
        "the knowing simulator teaches no more than an answer dispenser (no measurable difference)"
        if interval is None or interval[0] <= 0 <= interval[1]
        else "a simulator that knows the world teaches more than showing the answer does"
        if interval[0] > 0
        else "showing the answer teaches more than the knowing simulator"
    )
    bm25 = t_cell(_differences(worlds, "knowing", "bm25", "bm25", controls)) if "bm25" in mean else "-"
    lines.append(
        f"On BM25, knowing simulator minus oracle: {t_cell(versus_oracle)}; minus real BM25 in the loop: {bm25} "
        f"(paired by world, {INTERVAL_METHOD}): {verdict}. The pre-registration, every arm and control: "
        "[docs/controls.md](docs/controls.md)."
    )
    return lines


def doc_lines(figures: dict[str, Any]) -> list[str]:
    """The results as Markdown: provenance, per world, mean ± sd per arm, and the paired differences."""
    worlds = figures["by_world"]
    seeds = list(worlds)
    rows, controls, where = figures["rows"], figures["controls"], figures["provenance"]
    jobs = where.get("jobs", 1)
    command = f"python -m benchmarks.controls --seeds {' '.join(seeds)} --jobs {jobs} --threads {figures['threads']}"
    if where.get("aggregated"):
        command += "`, the worlds run in parts, then the same with `--aggregate"
    smoke = ", smoke: a pipeline check, not a result" if figures["smoke"] else ""
    lines = [
        f"Command: `{command}` ({figures['world_set']} worlds{smoke}). {study.measured(where)}",
        "",
        "Held-out EM (%), greedy, 300 questions per world:",
        "",
        *study.table(["world", *(f"{row} bm25 / dense" for row in rows)],
                     ([seed, *(f"{worlds[seed]['em'][r]['bm25']:.1f} / {worlds[seed]['em'][r]['dense']:.1f}"
                               for r in rows)] for seed in seeds)),
        "",
        *study.table(["arm", *ENGINES], ([row, *(f"{figures['em_mean'][row][e]:.1f} ± {figures['em_sd'][row][e]:.1f}"
                                               for e in ENGINES)] for row in rows)),
    ]  # fmt: skip
    for arm in ("simulator", "knowing") if "knowing" in rows else ("simulator",):
        lines += _difference_lines(worlds, arm, rows, controls)
    lines += _fidelity_lines(worlds)
    lines += _steps_lines(worlds, [arm for arm in STEP_ARMS if arm in rows])
    lines += _per_world_table(
        worlds, "answer_in_results", [row for row in rows if row != "base"], lambda shown: f"{shown['share']:.2f}",
        ["How often the engine in the loop showed the answer: the share of searches in each RL run's saved",
         "trajectories (a sample of its steps) whose results hold a gold answer:"],
    )  # fmt: skip
    lines += _per_world_table(
        worlds, "query_naming", rows, lambda named: f"{named['exact']['share']:.2f} / {named['exact']['em']:.2f}",
        ["How each policy's first query for a held-out question names the asked person: the share that",
         "names them exactly, and the EM of those questions (BM25):"],
        key={"simulator": "rl_search"},  # the quickstart report's name of the simulator arm's policy
    )  # fmt: skip
    if figures.get("versus"):
        other = figures["versus"]
        lines += [
            "",
            f"Against the records in `{other['dir']}` (commit {other['commit']}), each arm whose EM moved, here",
            "minus there, paired by world (the other arms' EM did not move):",
            "",
            *study.table(
                ["arm", *ENGINES], ([row, *(t_cell(d[e]) for e in ENGINES)] for row, d in other["diffs"].items())
            ),
        ]
    keys = {"simulator": "sim", "knowing": "knowing"}
    gains = {arm: figures.get(f"{key}_share_of_bm25_loop_gain") for arm, key in keys.items()}
    shares = [f"the {arm} arm {share}" for arm, share in gains.items() if share is not None]
    lines += [
        "",
        "Share of the real-BM25 loop's gain over the base that an arm reaches (BM25, means over worlds): "
        f"{', '.join(shares) or '-'}. Quickstart part of a world: at most "
        f"{figures['wall_s_max'] / 60:.1f} min and {figures['peak_rss_gb_max']:.2f} GB.",
    ]
    return lines


def _difference_lines(worlds: dict[str, Any], arm: str, rows: Sequence[str], controls: Sequence[str]) -> list[str]:
    """`arm` minus each arm it is paired against (`_others`), per engine, with their t-intervals."""
    return [
        "",
        f"The {arm} arm minus each arm, paired by world: mean, and {INTERVAL_METHOD}",
        '(an interval that holds 0 reads "no measurable difference"):',
        "",
        *study.table([f"{arm} arm minus", *ENGINES],
                     ([other, *(t_cell(_differences(worlds, arm, other, e, controls)) for e in ENGINES)]
                      for other in _others(arm, rows, controls))),
    ]  # fmt: skip


def _fidelity_lines(worlds: dict[str, Any]) -> list[str]:
    """Each world's fidelity table (`measure_fidelity`): answer shown and on-topic share per engine."""
    measured = {seed: w["fidelity"] for seed, w in worlds.items() if w.get("fidelity")}
    if not measured:
        return []
    names = ("knowing", "simulator", "bm25")
    rows = ([seed, str(f["questions"]), *(f"{f[n]['answer_shown']:.2f} / {f[n]['on_topic']:.2f}" for n in names)]
            for seed, f in measured.items())  # fmt: skip
    return ["", "Before RL, each engine asked a good query (the question as written) for each of RL's questions: the",
            "share of searches whose results show a gold answer / the share of documents naming the asked person:",
            "", *study.table(["world", "questions", *names], rows)]  # fmt: skip


def _steps_lines(worlds: dict[str, Any], arms: Sequence[str]) -> list[str]:
    """Held-out EM on BM25 against RL steps, mean over the worlds that kept each checkpoint (`em_steps`)."""
    curves = {arm: em_steps_mean(worlds, arm, "bm25") for arm in arms}
    steps = sorted({step for curve in curves.values() for step in curve})
    if not steps:
        return []
    rows = ([arm, *(f"{curve[s]:.1f}" if s in curve else "-" for s in steps)] for arm, curve in curves.items())
    return ["", "Held-out EM on BM25 against RL steps (step 0: the base), mean over worlds (`em_steps.png`):", "",
            *study.table(["arm", *map(str, steps)], rows)]  # fmt: skip


def em_steps_mean(worlds: dict[Any, Any], arm: str, engine: str) -> dict[int, float]:
    """Step -> mean held-out EM of `arm` over the worlds that evaluated that step (step 0: the base)."""
    by_step: dict[int, list[float]] = {}
    for world in worlds.values():
        curve = {0: world["em"]["base"][engine], **{int(s): em[engine] for s, em in world.get("em_steps", {})
                                                     .get(arm, {}).items()}}  # fmt: skip
        for step, value in curve.items():
            by_step.setdefault(step, []).append(value)
    if len(by_step) == 1:  # the base alone: no checkpoint of this arm was kept
        return {}
    return {step: mean_sd(values)[0] for step, values in sorted(by_step.items())}


def plot_em_steps(worlds: dict[Any, Any], arms: Sequence[str], path: Path) -> Path:
    """`path`: held-out EM against RL steps, one panel per world and one for the mean, BM25 solid, dense dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(f"world {seed}", {str(seed): world}) for seed, world in worlds.items()] + [("mean", worlds)]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.0), sharey=True, squeeze=False)
    for ax, (title, group) in zip(axes[0], panels, strict=True):
        for i, arm in enumerate(arms):
            for engine, style in (("bm25", "-"), ("dense", "--")):
                curve = em_steps_mean(group, arm, engine)
                if curve:
                    ax.plot(list(curve), list(curve.values()), style, color=f"C{i}", marker="o", markersize=3,
                            label=arm if engine == "bm25" else None)  # fmt: skip
        ax.set_title(title)
        ax.set_xlabel("RL step")
    axes[0][0].set_ylabel("held-out EM (%) — bm25 solid, dense dashed")
    if axes[0][-1].get_legend_handles_labels()[0]:
        axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _per_world_table(
    worlds: dict[str, Any],
    record: str,
    arms: Sequence[str],
    cell: Callable[[Any], str],
    intro: list[str],
    key: dict[str, str] | None = None,
) -> list[str]:
    """A table of each world's `record` entry per arm (`key` renames an arm's entry there), for the arms
    every world has one of; no lines when none has."""
    entries = [worlds[seed].get(record, {}) for seed in worlds]
    names = {arm: (key or {}).get(arm, arm) for arm in arms}
    arms = [arm for arm in arms if all(names[arm] in entry for entry in entries)]
    if not arms:
        return []
    rows = ([seed, *(cell(entry[names[arm]]) for arm in arms)] for seed, entry in zip(worlds, entries, strict=True))
    return ["", *intro, "", *study.table(["world", *arms], rows)]


def _differences(worlds: dict[Any, Any], arm: str, other: str, engine: str, controls: Sequence[str]) -> list[float]:
    """Per world: `arm`'s EM minus `other`'s ("best control": the best of `controls` on that engine)."""
    out = []
    for world in worlds.values():
        em = world["em"]
        value = max(em[c][engine] for c in controls) if other == "best control" else em[other][engine]
        out.append(em[arm][engine] - value)
    return out


STUDY = study.Study(
    name="controls",
    description=__doc__ or "",
    title="Controls",
    seeds=REPORTING_WORLDS,
    world=run_world,
    summary=summarize,
    page=page,
    options=_options,
    check=_check,
    done=study.bm25_line,
    charts=charts,
    arms=ARMS,
)


if __name__ == "__main__":
    main()
