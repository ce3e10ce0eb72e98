"""Native tool calling against Search-R1's tags, on the same tiny worlds: the quickstart run both ways.

    python -m benchmarks.toolcall --seeds 0 1 2 --jobs 2 --threads 1     # the reporting worlds
    python -m benchmarks.toolcall --tags-dir 'runs/controls/world_{seed}/quickstart' --tags-commit abc1234
    python -m benchmarks.toolcall --smoke                                 # a pipeline check
    python -m benchmarks.toolcall --seeds 0 1 2 --aggregate               # worlds run in parts, summarized

Per world, `simsearch quickstart` twice in RUN_DIR/world_SEED, `tags/` and `tool-call/` (`protocol=tool-call`;
how the two differ: docs/toolcall.md); `--tags-dir` reuses tag runs made at `--tags-commit`. Prints the page's
`results` block (each protocol's held-out EM per world and as mean ± sd, their paired difference, the tool-call
policy's unreadable calls) and as its last line one JSON object: `tags_em_bm25`, `toolcall_em_bm25`,
`toolcall_minus_tags_bm25` (mean, ci_low, ci_high), `interval_method`, `toolcall_invalid_call_share`,
`within_5_points`, `wall_s`, `provenance` and the detail per world.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks import study
from benchmarks.benchlib import INTERVAL_METHOD, difference_cell, mean_sd, paired, provenance
from simsearch.experiments import probes, quickstart
from simsearch.experiments.stages import examples_file

PROTOCOLS = ("tags", "tool-call")
POLICIES = ("base", "rl_search")
ENGINES = ("bm25", "dense", "simulator")


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tags-dir", default="", help="finished tag quickstart runs, '{seed}' filled in")
    parser.add_argument("--tags-commit", default="", help="the commit the --tags-dir runs were made at")


def _check(args: argparse.Namespace) -> str:
    if bool(args.tags_dir) != bool(args.tags_commit):
        return "--tags-dir and --tags-commit go together: the reused runs' figures are of their commit"
    return ""


def _rl_line(result: dict[str, Any]) -> str:
    rl = {protocol: result["em"][protocol]["rl_search"]["bm25"] for protocol in PROTOCOLS}
    return f"RL policy's BM25 EM: tags {rl['tags']:.1f}, tool-call {rl['tool-call']:.1f}"


# --------------------------------------------------------------------------- one world (a worker)


def run_world(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """The quickstart with each protocol; the world's record."""
    root = args.run_dir / f"world_{seed}"
    # Tool calls first: a reused tag run may still be finishing elsewhere.
    dirs = {"tool-call": root / "tool-call",
            "tags": Path(args.tags_dir.format(seed=seed)) if args.tags_dir else root / "tags"}  # fmt: skip
    # A reused tag run's wall_s is the time its reuse took, not the run's.
    result: dict[str, Any] = {"seed": seed, "commit": {}, "em": {}, "wall_s": {}, "machine": {},
                              "tags_reused": bool(args.tags_dir)}  # fmt: skip
    here = provenance()["commit"]  # the code this world runs, before anything can change it
    for protocol, run in dirs.items():
        report = quickstart.main(study.quickstart_recipe(run, seed, args, f"protocol={protocol}"))
        # Reused tag runs are stage by stage what they measured, at the commit they ran at.
        result["commit"][protocol] = args.tags_commit if protocol == "tags" and args.tags_dir else here
        result["em"][protocol] = {policy: report["em"][policy] for policy in POLICIES}
        result["wall_s"][protocol] = report["wall_s"]
        result["machine"][protocol] = report["machine"]
    rows = examples_file(dirs["tool-call"] / "eval" / "rl_search", "bm25", "heldout")  # the RL policy's, held out
    result["tool_calls"] = probes.tool_call_counts(rows)
    return result


# --------------------------------------------------------------------------- over worlds


def summarize(worlds: dict[int, dict[str, Any]], args: argparse.Namespace | None = None) -> dict[str, Any]:
    """The JSON figures: per-protocol means, the paired difference with its interval, the invalid calls, and
    the commits each protocol's quickstart runs were made at."""
    records = list(worlds.values())
    means = {protocol: {policy: {e: round(mean_sd([w["em"][protocol][policy][e] for w in records])[0], 2)
                                 for e in ENGINES} for policy in POLICIES} for protocol in PROTOCOLS}  # fmt: skip
    diffs = {e: study.paired_values(records, "tool-call", "tags", e, _rl_em) for e in ENGINES}
    counts = [w["tool_calls"] for w in records]
    unreadable, invalid, turns, calls = (sum(c[key] for c in counts) for key in ("unreadable_calls", "invalid_turns",
                                                                                   "turns", "calls"))  # fmt: skip
    written, gap = calls + unreadable, paired(diffs["bm25"])
    return {
        "tags_em_bm25": means["tags"]["rl_search"]["bm25"],
        "toolcall_em_bm25": means["tool-call"]["rl_search"]["bm25"],
        "toolcall_minus_tags_bm25": gap,
        "interval_method": INTERVAL_METHOD,
        "toolcall_invalid_call_share": round(unreadable / written, 4) if written else None,
        "toolcall_invalid_turn_share": round(invalid / turns, 4) if turns else None,
        "within_5_points": abs(gap["mean"]) <= 5.0,
        "commits": {protocol: sorted({w["commit"][protocol] for w in records}) for protocol in PROTOCOLS},
        "em_mean": means,
        "toolcall_minus_tags": {e: paired(diffs[e]) for e in ENGINES},
        "by_world": {str(s): w for s, w in worlds.items()},
    }


def _rl_em(world: dict[str, Any], protocol: str, engine: str) -> float:
    """The RL policy's held-out EM with `protocol` on `engine` (a `study.Value`)."""
    return world["em"][protocol]["rl_search"][engine]


def page(figures: dict[str, Any], args: argparse.Namespace) -> dict[str, str]:
    """The page's results block."""
    return {"results": "\n".join(doc_lines(figures, args))}


def doc_lines(figures: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """The results as Markdown: provenance, per world, means ± sd, the paired differences, invalid calls."""
    worlds = figures["by_world"]
    commits = "; ".join(f"{protocol} runs at {', '.join(c)}" for protocol, c in figures["commits"].items())
    smoke = " (smoke: a pipeline check, not a result)" if figures["smoke"] else ""
    reused = f" --tags-dir TAG_RUNS --tags-commit {args.tags_commit}" if args.tags_dir else ""
    lines = [
        f"Command: `python -m benchmarks.toolcall --seeds {' '.join(worlds)} --jobs {args.jobs} "
        f"--threads {args.threads}{reused}`{smoke}. {study.measured(figures['provenance'])} "
        f"The quickstart runs: {commits}.",
        "",
        "Held-out EM (%), greedy; RL policy (base in brackets), BM25 / dense / simulator:",
        "",
    ]
    gaps = [study.paired_values(worlds.values(), "tool-call", "tags", e, _rl_em) for e in ENGINES]
    lines += study.table(["world", *PROTOCOLS, "tool-call minus tags (BM25)"],
                         ([seed, *(_em_cell(w["em"][p]) for p in PROTOCOLS), f"{gap:+.1f}"]
                          for (seed, w), gap in zip(worlds.items(), gaps[0], strict=True)))  # fmt: skip
    means = [[f"{protocol} {policy}", *(study.spread([w["em"][protocol][policy][e] for w in worlds.values()])
                                         for e in ENGINES)]
             for protocol in PROTOCOLS for policy in POLICIES]  # fmt: skip
    lines += ["", *study.table(["", *ENGINES], [*means, ["tool-call minus tags (RL)", *map(difference_cell, gaps)]])]
    lines += ["", f"Tool-call minus tags: the mean over worlds, and {INTERVAL_METHOD}."]
    share = figures["toolcall_invalid_call_share"]
    lines += [
        "",
        f"Tool calls the tool-call policy wrote on held-out BM25 questions that could not be read: "
        f"{_percent(share)}; turns that were invalid actions (no readable call "
        f"and no answer): {_percent(figures['toolcall_invalid_turn_share'])}.",
    ]
    return lines


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def _em_cell(em: dict[str, dict[str, float]]) -> str:
    return " / ".join(f"{em['rl_search'][e]:.1f} ({em['base'][e]:.1f})" for e in ENGINES)


STUDY = study.Study(
    name="toolcall",
    description=__doc__ or "",
    title="Tool calling",
    seeds=(0, 1, 2),
    world=run_world,
    summary=summarize,
    page=page,
    options=_options,
    check=_check,
    done=_rl_line,
)
main = STUDY.main


if __name__ == "__main__":
    main()
