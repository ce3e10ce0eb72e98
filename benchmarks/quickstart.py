"""The quickstart's targets: wall time, peak memory and held-out EM of the whole pipeline.

    python benchmarks/quickstart.py                      # a fresh run in runs/bench_quickstart
    python benchmarks/quickstart.py --run-dir DIR -- pretrain_steps=400   # recipe overrides

Runs `simsearch quickstart` in a fresh run directory (a subprocess, so its peak memory is its
own), then prints the held-out EM table (policies x engines), the targets of the quickstart
issue with whether each is met, and, as the last line, `report.json` itself: `wall_s`,
`peak_rss_gb`, `em[policy][engine]` (percent) and the rest of what the run wrote.

Targets: whole run <= 15 min (aim 10), peak memory <= 4 GB, and on held-out questions with real
BM25 the RL policy (trained against the simulator only) >= 30 EM points above the untrained base
and above the policy trained by RL without search.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

POLICIES = ("base", "rl_search", "rl_nosearch")
ENGINES = ("simulator", "bm25", "dense")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", default="runs/bench_quickstart", help="wiped before the run")
    parser.add_argument("overrides", nargs="*", help="quickstart recipe overrides, after --")
    args = parser.parse_args()
    run = Path(args.run_dir)
    shutil.rmtree(run, ignore_errors=True)
    command = [sys.executable, "-m", "simsearch.cli", "quickstart", f"run_dir={run}", *args.overrides]
    print("running:", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    report = json.loads((run / "report.json").read_text())

    em = report["em"]
    print("\nHeld-out EM (%), greedy; the RL policy only searched the simulator in training.\n")
    print("| policy | " + " | ".join(ENGINES) + " |\n|---|" + "---|" * len(ENGINES))
    for policy in POLICIES:
        print(f"| {policy} | " + " | ".join(f"{em[policy][e]:.1f}" for e in ENGINES) + " |")
    gain = em["rl_search"]["bm25"] - em["base"]["bm25"]
    targets = [
        ("wall time (min)", f"{report['wall_s'] / 60:.1f}", "<= 15 (aim 10)", report["wall_s"] <= 15 * 60),
        ("peak memory (GB)", f"{report['peak_rss_gb']:.2f}", "<= 4", report["peak_rss_gb"] <= 4),
        ("BM25 EM: rl_search - base", f"{gain:+.1f}", ">= +30", gain >= 30),
        (
            "BM25 EM: rl_search vs rl_nosearch",
            f"{em['rl_search']['bm25']:.1f} vs {em['rl_nosearch']['bm25']:.1f}",
            "above",
            em["rl_search"]["bm25"] > em["rl_nosearch"]["bm25"],
        ),
    ]
    print("\n| target | measured | wanted | met |\n|---|---|---|---|")
    for name, measured, wanted, met in targets:
        print(f"| {name} | {measured} | {wanted} | {'yes' if met else 'NO'} |")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
