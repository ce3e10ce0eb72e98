"""What the simulator adds: RL arms that differ only in the engine in the loop, on several worlds.

    python benchmarks/controls.py --seeds 0 1 2 3 4 --jobs 2 --threads 1     # the reporting worlds
    python benchmarks/controls.py --seeds 100 101 102 --jobs 2 --threads 1   # development worlds
    python benchmarks/controls.py --smoke                                    # a pipeline check
    python benchmarks/controls.py --seeds 0 1 2 3 4 --aggregate              # worlds run in parts, summarized
    python benchmarks/controls.py --seeds 0 1 --arms noisy --borrow docs/controls/avx512  # some arms again
    python benchmarks/controls.py --seeds 0 1 --aggregate --compare docs/controls/avx512  # against earlier runs

Per world (seed): `simsearch quickstart` in RUN_DIR/world_SEED (its base, its simulator and its
RL policy, which is the simulator arm), then one RL run per control on the same base with
`recipes/quickstart/train.yaml`, the same seed, steps, prompts and group size; only the engine in
the loop changes:

- `simulator`: the fine-tuned simulator under the quickstart's noise curriculum (the quickstart's
  own RL run);
- `empty`: every search finds nothing;
- `random`: `top_k` corpus passages drawn at random, whatever the query;
- `noisy`: the same simulator asked for noisy documents on every search (p_noise = 1);
- `answerless`: real BM25 less every passage that holds the question's answer (the next ones up
  take their places): on-topic results without the answer;
- `bm25`: real BM25 in the loop (the reference a simulator stands in for).

Every policy (and the base) is evaluated greedily on the held-out questions against BM25 and
dense retrieval. Worlds run in `--jobs` worker processes at `--threads` torch threads each.
`--arms` runs some of the controls; the others are taken from an earlier record of the same world
(RUN_DIR's own, or `--borrow DIR`'s) when its world and base are this run's (same fingerprints,
same base EM), and its simulator too for the arms that use it; the record names their commits.
`--compare DIR` adds, for each arm whose EM moved, its paired difference from DIR's records of the
same worlds and bases (what a change of the code or recipe did to it).

Prints per-arm mean ± sd, the paired difference of the simulator arm over each control with a
95% bootstrap interval over worlds, and as its last line one JSON object: `sim_em_bm25_mean`,
`sim_em_bm25_min`, `sim_over_best_control_mean`, `sim_over_best_control_ci_low` /
`_ci_high` (the best control is, in each world, the highest of the controls on BM25: empty, random,
noisy and answerless, those every world ran),
`sim_share_of_bm25_loop_gain` ((simulator - base) / (bm25 arm - base), means over worlds),
`wall_s_max` and `peak_rss_gb_max` (the quickstart part of each world), `world_set`
(`reporting`: seeds below 100, which no design choice was tuned on; `development`: 100 and up),
and the detail per world. The tables also go into the results block of docs/controls.md (`--out`;
with `--smoke`, a page in the run directory), with the commit each world ran at and the machine; `--render OUTPUT`
writes that block again from a finished run's printed output.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib, also when loaded by path
from benchlib import (
    NO_NOISE,
    RECIPES,
    bootstrap_interval,
    difference_cell,
    finished_world,
    mean_sd,
    measured_at,
    provenance,
    replace_block,
    run_stage,
    run_worlds,
)

ARMS: dict[str, tuple[str, ...]] = {
    "empty": ("search.kind=empty", *NO_NOISE),
    "random": ("search.kind=random", "search.corpus={corpus}", *NO_NOISE),
    "noisy": ("curriculum.kind=constant", "curriculum.p_start=1.0"),
    "answerless": ("search.kind=answerless", "search.corpus={corpus}", "search.index_dir={bm25}", *NO_NOISE),
    "bm25": ("search.kind=bm25", "search.corpus={corpus}", "search.index_dir={bm25}", *NO_NOISE),
}
"""Control arm -> overrides of the quickstart's train.yaml (the simulator arm is the quickstart's RL run)."""
SIMULATOR_ARMS = ("noisy",)  # controls whose engine is the quickstart's simulator
CONTROLS = ("empty", "random", "noisy", "answerless")  # engines not meant to give the answer; bm25 is the reference
ROWS = ("base", "simulator", *ARMS)
ENGINES = ("bm25", "dense")
DEVELOPMENT_SEEDS = 100  # seeds from here on are development worlds; below, reporting worlds

SMOKE_TRAIN = ["steps=2", "prompts_per_step=2", "rollout.group_size=2", "save_every=1", "eval_every=0"]
SMOKE_EVAL = ["chunk_size=8"]
SMOKE_LIMIT = 8  # held-out questions per evaluation in smoke mode


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = _parse(argv)
    if args.one_world is not None:
        run_world(args.one_world, args)
        return {}
    if args.render:  # a finished run's JSON (its last line) written into the doc again
        figures = json.loads(Path(args.render).read_text().strip().splitlines()[-1])
        write_doc(args.out, figures)
        return figures
    began = time.perf_counter()
    worlds = run_worlds(__file__, args, lambda seed: _worker_arguments(seed, args), _bm25_line)
    figures = summarize(worlds, args, wall_s=time.perf_counter() - began)
    here = {**provenance(), "torch_threads": args.threads, "jobs": args.jobs}
    here.pop("cpu_capability")  # each world's, in its cpu phrase
    where = {"commit": world_commits(worlds), "cpu": world_cpus(worlds), "aggregated": args.aggregate}
    figures["provenance"] = {**here, **where}
    if args.compare:
        figures["versus"] = versus(worlds, args.compare)
    print_tables(worlds, figures)
    write_doc(args.out, figures)
    print(f"controls: {args.out}", flush=True)
    print(json.dumps(figures))
    return figures


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", help="one world per seed (default 0 1 2 3 4; smoke 0)")
    parser.add_argument("--jobs", type=int, default=1, help="worlds run at once, each in its own process")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per world (0 = every core)")
    parser.add_argument("--run-dir", default="", help="parent of the worlds' runs (runs/controls; smoke: a temp dir)")
    parser.add_argument("--smoke", action="store_true", help="every stage for a step or two")
    parser.add_argument("--out", default="", help="the doc whose results block is rewritten (docs/controls.md)")
    parser.add_argument("--render", default="", help="write the doc from a finished run's output (its last line)")
    parser.add_argument("--aggregate", action="store_true", help="run nothing: summarize RUN_DIR's finished worlds")
    parser.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=list(ARMS), help="control arms to run")
    parser.add_argument("--borrow", default="", help="take the arms not run from this directory's world records")
    parser.add_argument("--compare", default="", help="each arm's paired difference from this directory's records")
    parser.add_argument("--one-world", type=int, default=None, help=argparse.SUPPRESS)  # a worker's seed
    parser.add_argument("overrides", nargs="*", help="quickstart recipe overrides, after --")
    args = parser.parse_args(argv)
    args.seeds = args.seeds or ([0] if args.smoke else [0, 1, 2, 3, 4])
    for option, other in (("--borrow", args.borrow), ("--compare", args.compare)):
        for seed in args.seeds if other else []:
            if not (Path(other) / f"world_{seed}" / "controls.json").is_file():
                parser.error(f"{option} {other}: no world_{seed}/controls.json there")
    smoke_dir = tempfile.mkdtemp(prefix="controls-smoke-") if args.smoke and not args.run_dir else ""
    args.run_dir = Path(args.run_dir or smoke_dir or "runs/controls")
    args.out = Path(args.out or (args.run_dir / "controls.md" if args.smoke else "docs/controls.md"))
    return args


def _worker_arguments(seed: int, args: argparse.Namespace) -> list[str]:
    """One world in a worker process (its own threads and peak memory), which writes its controls.json."""
    return ["--one-world", str(seed), "--run-dir", str(args.run_dir), "--threads", str(args.threads),
            "--arms", *args.arms, *(["--borrow", args.borrow] if args.borrow else []),
            *(["--smoke"] if args.smoke else []), "--", *args.overrides]  # fmt: skip


def _bm25_line(result: dict[str, Any]) -> str:
    return "BM25 EM " + ", ".join(f"{r} {result['em'][r]['bm25']:.1f}" for r in ROWS if r in result["em"])


def world_commits(worlds: dict[int, dict[str, Any]]) -> str:
    """The commit each world ran at, as one phrase: "abc1234", or "abc1234 (worlds 0, 1), def5678 (world 2)";
    an arm run at another commit than its world's quickstart is named: "abc1234 + the answerless arm at def5678"."""

    def commits(world: dict[str, Any]) -> str:
        commit = world.get("commit", "not recorded")
        others = [f"the {arm} arm at {run['commit']}" for arm, run in world.get("arm_runs", {}).items()
                  if run["commit"] != commit]  # fmt: skip
        return " + ".join([commit, *others])

    return _by_world(worlds, commits)


def world_cpus(worlds: dict[int, dict[str, Any]]) -> str:
    """The CPU each world ran on, with its kernels' vector instructions where recorded, as one phrase."""

    def cpu(world: dict[str, Any]) -> str:
        machine = world.get("machine", {})
        kernels = f", {machine['cpu_capability']} kernels" if machine.get("cpu_capability") else ""
        return f"{machine.get('cpu', 'a CPU not recorded')}{kernels}"

    return _by_world(worlds, cpu)


def _by_world(worlds: dict[int, dict[str, Any]], label: Callable[[dict[str, Any]], str]) -> str:
    by_label: dict[str, list[int]] = {}
    for seed, world in worlds.items():
        by_label.setdefault(label(world), []).append(seed)
    if len(by_label) == 1:
        return next(iter(by_label))
    return ", ".join(
        f"{text} ({'worlds' if len(seeds) > 1 else 'world'} {', '.join(map(str, seeds))})"
        for text, seeds in by_label.items()
    )


# --------------------------------------------------------------------------- one world (a worker)


def run_world(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """The quickstart, then every control arm and its evaluation; writes and returns controls.json.

    A world run again in the same directory reuses every stage built from the same inputs, and its
    controls.json keeps what the earlier run recorded of them (commit, times, machine): only what
    ran now is recorded as now.
    """
    from simsearch.commands import quickstart
    from simsearch.config import QuickstartRecipe, load_recipe
    from simsearch.fingerprints import stage_fingerprint

    where = provenance()  # the code this world runs, before anything can change it
    root = args.run_dir / f"world_{seed}"
    qs = load_recipe(
        QuickstartRecipe, None,
        [f"run_dir={root / 'quickstart'}", f"seed={seed}", f"smoke={args.smoke}", f"threads={args.threads}",
         *args.overrides],
    )  # fmt: skip
    report = quickstart.main(qs)  # sets this process's torch threads
    run = Path(qs.run_dir)
    paths = {
        "corpus": str(run / "world" / "corpus.jsonl"),
        "train": str(run / "world" / "train.jsonl"),
        "test": str(run / "world" / "test.jsonl"),
        "bm25": str(run / "index" / "bm25"),
        "dense": str(run / "index" / "dense"),
        "base": str(run / "base"),
        "simulator": str(quickstart.final_model(run / "simulator")),
    }
    fingerprints = {stage: stage_fingerprint(run / stage) for stage in ("world", "base", "simulator", "train")}
    previous = json.loads((root / "controls.json").read_text()) if (root / "controls.json").is_file() else {}
    commit = where["commit"]
    machine = {**report["machine"], "cpu_capability": where["cpu_capability"]}
    here = {"commit": commit, "quickstart_wall_s": report["wall_s"], "quickstart_peak_rss_gb": report["peak_rss_gb"],
            "machine": machine}  # fmt: skip
    if previous.get("fingerprints") == fingerprints:  # the quickstart part was reused: as recorded then
        here = {key: previous[key] for key in here}
    em = {"base": _real(report["em"]["base"]), "simulator": _real(report["em"]["rl_search"])}
    arm_runs: dict[str, dict[str, Any]] = {}
    for arm in args.arms:
        began = time.perf_counter()
        policy_fp = train_arm(root, arm, seed, paths, fingerprints, args.smoke)
        em[arm] = evaluate_arm(root, arm, seed, paths, [policy_fp, fingerprints["world"]], args.smoke)
        arm_runs[arm] = {"fingerprint": policy_fp, "commit": commit, "s": round(time.perf_counter() - began, 1)}
        kept = previous.get("arm_runs", {}).get(arm)
        if kept and kept["fingerprint"] == policy_fp:  # reused
            arm_runs[arm] = kept
    result = {
        "seed": seed,
        "commit": here["commit"],
        "em": em,
        "quickstart_wall_s": here["quickstart_wall_s"],
        "quickstart_peak_rss_gb": here["quickstart_peak_rss_gb"],
        "arm_s": {arm: run_["s"] for arm, run_ in arm_runs.items()},
        "arm_runs": arm_runs,
        "fingerprints": fingerprints,
        # how each policy's first held-out BM25 query names the asked person
        "query_naming": {**report["query_naming"], **_arms_query_naming(qs, root, args.arms)},
        "sim_rl_searches_by_kind": _searches_by_kind(run / "train"),  # the simulator arm: no other engine
        "answer_in_results": {
            arm: answer_in_results(root / "train" / arm if arm in ARMS else run / "train")
            for arm in ("simulator", *args.arms)
        },
        "machine": here["machine"],
    }
    borrowed = Path(args.borrow) / f"world_{seed}" / "controls.json"
    earlier = json.loads(borrowed.read_text()) if args.borrow else previous
    (root / "controls.json").write_text(json.dumps(result, indent=2) + "\n")  # kept if nothing can be carried
    carry_arms(result, earlier, args.borrow)
    (root / "controls.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


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
        result["em"][arm] = earlier["em"][arm]
        result["arm_runs"][arm] = {**earlier["arm_runs"][arm], **({"borrowed_from": source} if source else {})}
        result["arm_s"][arm] = earlier["arm_runs"][arm]["s"]
        for key in ("answer_in_results", "query_naming"):
            if arm in earlier.get(key, {}):
                result[key][arm] = earlier[key][arm]


def answer_in_results(train_run: Path) -> dict[str, float | int]:
    """How often an RL run's engine showed the answer: of the searches in its saved trajectories (a
    sample of its steps), the share whose results hold a gold answer of the question (normalized
    containment, as the rule reward matches), and their number; of the noisy documents among their
    results, their number and the share in which the simulator's `REDACTED` stands for an answer."""
    from simsearch.eval.metrics import substring_exact_match
    from simsearch.simulator.engine import REDACTED

    searches = shown = noisy = redacted = 0
    for line in (train_run / "trajectories.jsonl").read_text().splitlines():
        row = json.loads(line)
        for turn in row["turns"]:
            if turn["action"] != "search" or not turn["executed"]:
                continue
            searches += 1
            shown += any(substring_exact_match(doc["text"], row["golden_answers"]) for doc in turn["documents"])
            noise = [doc for doc in turn["documents"] if doc.get("noisy")]
            noisy += len(noise)
            redacted += sum(REDACTED in doc["text"] for doc in noise)
    return {
        "share": round(shown / searches, 3) if searches else 0.0,
        "searches": searches,
        "noisy_docs": noisy,
        "noisy_redacted": round(redacted / noisy, 3) if noisy else 0.0,
    }


def _arms_query_naming(qs: Any, root: Path, arms: Sequence[str]) -> dict[str, Any]:
    """The quickstart report's `query_naming` for each control arm's evaluation."""
    from simsearch.commands import quickstart

    world = quickstart.recipe_world(qs)  # the quickstart's, in memory
    return {arm: quickstart.evaluation_query_naming(root / "eval" / arm, world) for arm in arms}


def _searches_by_kind(train_run: Path) -> dict[str, int]:
    """An RL run's searches per engine kind, from its cost.json."""
    engines = json.loads((train_run / "cost.json").read_text())["engines"]
    return {usage["kind"]: usage["searches"] for usage in engines.values()}


def _real(em: dict[str, float]) -> dict[str, float]:
    return {engine: em[engine] for engine in ENGINES}


def train_arm(root: Path, arm: str, seed: int, paths: dict[str, str], fingerprints: dict[str, str], smoke: bool) -> str:
    """One control's RL run: the quickstart's train.yaml on its base, the engine swapped; its fingerprint."""
    from simsearch.commands import train
    from simsearch.config import TrainRecipe

    overrides = [
        f"seed={seed}", f"run_dir={root / 'train' / arm}", f"policy.model.path={paths['base']}",
        f"data.train=[{paths['train']}]",
        f"search.simulator.generation.model.path={paths['simulator']}",
        f"search.cache={root / 'cache' / arm}.sqlite",
        *(SMOKE_TRAIN if smoke else []),
        *(o.format(**paths) for o in ARMS[arm]),
    ]  # fmt: skip
    inputs = [fingerprints["base"], fingerprints["simulator"]]
    return run_stage(TrainRecipe, RECIPES / "train.yaml", overrides, train.main, inputs)


def evaluate_arm(root: Path, arm: str, seed: int, paths: dict[str, str], inputs: list[str], smoke: bool) -> dict:
    """eval.yaml for one control's policy, BM25 and dense only; EM (percent) per engine."""
    from simsearch.commands import evaluate, quickstart
    from simsearch.config import EvalRecipe

    out = root / "eval" / arm
    overrides = [
        f"run_dir={out}", f"seed={seed}", f"policy.model.path={quickstart.final_model(root / 'train' / arm)}",
        f"datasets=[{{name: heldout, path: {paths['test']}, limit: {SMOKE_LIMIT if smoke else 0}}}]",
        f"engines.bm25.corpus={paths['corpus']}", f"engines.bm25.index_dir={paths['bm25']}",
        f"engines.dense.corpus={paths['corpus']}", f"engines.dense.index_dir={paths['dense']}",
        "training_run=''", "baselines=[]", "fidelity_size=0", *(SMOKE_EVAL if smoke else []),
    ]  # fmt: skip

    def real_engines_only(recipe: Any) -> None:
        recipe.engines = {name: recipe.engines[name] for name in ENGINES}

    run_stage(EvalRecipe, RECIPES / "eval.yaml", overrides, evaluate.main, inputs, edit=real_engines_only)
    summary = json.loads((out / "summary.json").read_text())
    return {engine: 100.0 * summary["rows"][engine]["average"]["em"] for engine in ENGINES}


# --------------------------------------------------------------------------- over worlds


def summarize(worlds: dict[int, dict[str, Any]], args: argparse.Namespace, *, wall_s: float) -> dict[str, Any]:
    """The JSON figures: per-arm means, paired differences with their intervals, the targets' keys."""
    seeds = list(worlds)
    rows, controls = _run_in_every_world(worlds, ROWS), _run_in_every_world(worlds, CONTROLS)
    em = {row: {e: [worlds[s]["em"][row][e] for s in seeds] for e in ENGINES} for row in rows}
    best_control = [max(worlds[s]["em"][c]["bm25"] for c in controls) for s in seeds]
    over_best = [sim - best for sim, best in zip(em["simulator"]["bm25"], best_control)]
    paired = {}
    for arm in (*controls, *(["bm25"] if "bm25" in rows else []), "base"):
        diffs = [a - b for a, b in zip(em["simulator"]["bm25"], em[arm]["bm25"])]
        low, high = bootstrap_interval(diffs)
        paired[arm] = {"mean": round(mean_sd(diffs)[0], 2), "ci_low": round(low, 2), "ci_high": round(high, 2)}
    low, high = bootstrap_interval(over_best)
    base, sim = (mean_sd(em[row]["bm25"])[0] for row in ("base", "simulator"))
    loop = mean_sd(em["bm25"]["bm25"])[0] if "bm25" in rows else None
    share = round((sim - base) / (loop - base), 3) if loop is not None and loop != base else None
    return {
        "seeds": seeds,
        "world_set": world_set(seeds),
        "threads": args.threads,
        "smoke": args.smoke,
        "sim_em_bm25_mean": round(sim, 2),
        "sim_em_bm25_min": round(min(em["simulator"]["bm25"]), 2),
        "sim_over_best_control_mean": round(mean_sd(over_best)[0], 2),
        "sim_over_best_control_ci_low": round(low, 2),
        "sim_over_best_control_ci_high": round(high, 2),
        "sim_share_of_bm25_loop_gain": share,
        "wall_s_max": max(w["quickstart_wall_s"] for w in worlds.values()),
        "peak_rss_gb_max": max(w["quickstart_peak_rss_gb"] for w in worlds.values()),
        "wall_s": round(wall_s, 1),
        "rows": list(rows),
        "controls": list(controls),
        "em_mean": {row: {e: round(mean_sd(em[row][e])[0], 2) for e in ENGINES} for row in rows},
        "em_sd": {row: {e: round(mean_sd(em[row][e])[1], 2) for e in ENGINES} for row in rows},
        "sim_minus": paired,
        "by_world": {str(s): worlds[s] for s in seeds},
    }


def versus(worlds: dict[int, dict[str, Any]], other: str) -> dict[str, Any]:
    """Each row's EM here minus in `other`'s records of the same worlds, per engine and world, for the
    rows both ran whose EM differs in some world; `SystemExit` when a world's base differs there."""
    theirs = {seed: finished_world("controls", Path(other), seed) for seed in worlds}
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
    """`reporting` (every seed below 100), `development` (every seed 100 or more) or `mixed`."""
    development = [seed >= DEVELOPMENT_SEEDS for seed in seeds]
    return "development" if all(development) else "mixed" if any(development) else "reporting"


def write_doc(out: Path, figures: dict[str, Any]) -> None:
    """Rewrites the `results` block of `out` (created from a bare page when missing) with the run's tables."""
    text = out.read_text() if out.is_file() else "# Controls\n\n<!-- results -->\n<!-- /results -->\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(replace_block(text, "results", "\n" + "\n".join(doc_lines(figures)) + "\n"))


def doc_lines(figures: dict[str, Any]) -> list[str]:
    """The results as Markdown: provenance, per world, mean ± sd per arm, and the paired differences."""
    worlds = figures["by_world"]
    seeds = list(worlds)
    rows, controls = figures.get("rows", ROWS), figures.get("controls", CONTROLS)
    where = figures.get("provenance")
    jobs = where.get("jobs", 1) if where else 1
    command = f"python benchmarks/controls.py --seeds {' '.join(seeds)} --jobs {jobs} --threads {figures['threads']}"
    if where and where.get("aggregated"):
        command += "`, the worlds run in parts, then the same with `--aggregate"
    smoke = ", smoke: a pipeline check, not a result" if figures["smoke"] else ""
    lines = [
        f"Command: `{command}` ({figures['world_set']} worlds{smoke}). "
        + (measured_at(where) if where else "Commit and machine: not recorded by this run."),
        "",
        "Held-out EM (%), greedy, 300 questions per world:",
        "",
        "| world | " + " | ".join(f"{row} bm25 / dense" for row in rows) + " |",
        "|---|" + "---|" * len(rows),
    ]
    for seed in seeds:
        em = worlds[seed]["em"]
        lines.append(f"| {seed} | " + " | ".join(f"{em[r]['bm25']:.1f} / {em[r]['dense']:.1f}" for r in rows) + " |")
    lines += ["", "| arm | bm25 | dense |", "|---|---|---|"]
    for row in rows:
        cells = [f"{figures['em_mean'][row][e]:.1f} ± {figures['em_sd'][row][e]:.1f}" for e in ENGINES]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "The simulator arm minus each arm, paired by world: mean, and 95% bootstrap interval over worlds",
        '(an interval that holds 0 reads "no measurable difference"):',
        "",
        "| simulator arm minus | bm25 | dense |",
        "|---|---|---|",
    ]
    for arm in (*controls, "best control", *(["bm25"] if "bm25" in rows else []), "base"):
        cells = [difference_cell(_differences(worlds, arm, engine, controls)) for engine in ENGINES]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
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
            "| arm | bm25 | dense |",
            "|---|---|---|",
        ]
        for row, d in other["diffs"].items():
            lines.append(f"| {row} | " + " | ".join(difference_cell(d[e]) for e in ENGINES) + " |")
    share = figures["sim_share_of_bm25_loop_gain"]
    lines += [
        "",
        f"Share of the real-BM25 loop's gain over the base that the simulator arm reaches (BM25, means over worlds): "
        f"{share if share is not None else '-'}. Quickstart part of a world: at most "
        f"{figures['wall_s_max'] / 60:.1f} min and {figures['peak_rss_gb_max']:.2f} GB.",
    ]
    return lines


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
    lines = ["", *intro, "", "| world | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
    for seed, entry in zip(worlds, entries, strict=True):
        lines.append(f"| {seed} | " + " | ".join(cell(entry[names[arm]]) for arm in arms) + " |")
    return lines


def _differences(worlds: dict[str, Any], arm: str, engine: str, controls: Sequence[str]) -> list[float]:
    """Per world: the simulator arm's EM minus `arm`'s ("best control": the best of `controls` on that engine)."""
    out = []
    for world in worlds.values():
        em = world["em"]
        other = max(em[c][engine] for c in controls) if arm == "best control" else em[arm][engine]
        out.append(em["simulator"][engine] - other)
    return out


def print_tables(worlds: dict[int, dict[str, Any]], figures: dict[str, Any]) -> None:
    """The per-world and per-arm tables, the paired differences and the targets."""
    print(
        f"\nHeld-out EM (%), greedy, {figures['world_set']} worlds {figures['seeds']}, {figures['threads']} thread(s)."
    )
    rows = figures["rows"]
    print("\n| world | " + " | ".join(rows) + " |\n|---|" + "---|" * len(rows))
    for seed, world in worlds.items():
        print(f"| {seed} | " + " | ".join(f"{world['em'][r]['bm25']:.1f}" for r in rows) + " |")
    print("\n(BM25 above.) Mean ± sd over worlds:\n\n| arm | bm25 | dense |\n|---|---|---|")
    for row in rows:
        cells = [f"{figures['em_mean'][row][e]:.1f} ± {figures['em_sd'][row][e]:.1f}" for e in ENGINES]
        print(f"| {row} | " + " | ".join(cells) + " |")
    print("\nSimulator arm minus each arm, BM25, paired by world (95% bootstrap interval over worlds):\n")
    print("| minus | mean | 95% interval |\n|---|---|---|")
    for arm, d in figures["sim_minus"].items():
        print(f"| {arm} | {d['mean']:+.1f} | [{d['ci_low']:+.1f}, {d['ci_high']:+.1f}] |")
    targets = [
        ("sim_em_bm25_mean", ">= 50", figures["sim_em_bm25_mean"] >= 50),
        ("sim_em_bm25_min", ">= 35", figures["sim_em_bm25_min"] >= 35),
        ("sim_over_best_control_mean", ">= 15", figures["sim_over_best_control_mean"] >= 15),
        ("sim_over_best_control_ci_low", "> 0", figures["sim_over_best_control_ci_low"] > 0),
        ("sim_share_of_bm25_loop_gain", ">= 0.7", (figures["sim_share_of_bm25_loop_gain"] or 0) >= 0.7),
        ("wall_s_max", "<= 600", figures["wall_s_max"] <= 600),
        ("peak_rss_gb_max", "<= 2", figures["peak_rss_gb_max"] <= 2),
    ]
    print("\n| target | measured | wanted | met |\n|---|---|---|---|")
    for key, wanted, met in targets:
        print(f"| {key} | {figures[key]} | {wanted} | {'yes' if met else 'NO'} |")


if __name__ == "__main__":
    main()
