"""What several benchmarks share: their common options, worlds run in worker processes, timing,
mean ± sd, paired differences' t-intervals and the doc's rewritten blocks. The fingerprinted stages
they run are `simsearch.experiments.stages`.

A benchmark imports it as `benchmarks.benchlib`: the benchmarks run as modules of the `benchmarks`
package from the repository root (`python -m benchmarks.NAME`), and tests import them the same way.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "quickstart"

# Overrides of the quickstart's train.yaml for an engine other than the simulator: no noise to
# schedule, and no cache (it would hold the simulator's).
NO_NOISE = ("curriculum.kind=constant", "curriculum.p_start=0.0", "search.cache=''")


def arm_arguments(
    argv: Sequence[str] | None,
    parser: argparse.ArgumentParser,
    name: str,
    *,
    steps: int,
    smoke_steps: int,
    seeds_help: str,
    smoke_help: str,
) -> argparse.Namespace:
    """Parses `argv` with `parser` (holding a benchmark's own options) plus the options every arm
    benchmark takes: --seeds, --steps, --run-dir, --out, --smoke and --threads.

    Returns the options with their defaults resolved: `seeds` (0 and 1, 0 with --smoke), `steps`
    (`steps`, `smoke_steps` with --smoke), `run_dir` (runs/NAME, a temporary directory with
    --smoke) and `out` (docs/NAME.md, NAME.md in the run directory with --smoke), as Paths.
    """
    parser.add_argument("--seeds", type=int, nargs="+", help=seeds_help)
    parser.add_argument("--steps", type=int, default=0, help=f"RL steps per arm (default {steps}; smoke {smoke_steps})")
    parser.add_argument("--run-dir", default="", help=f"runs/{name}, or a temporary directory with --smoke")
    parser.add_argument("--out", default="", help=f"the doc (docs/{name}.md; with --smoke, in the run directory)")
    parser.add_argument("--smoke", action="store_true", help=smoke_help)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = every core), as the quickstart's")
    args = parser.parse_args(argv)
    args.seeds = args.seeds if args.seeds is not None else ([0] if args.smoke else [0, 1])
    args.steps = args.steps or (smoke_steps if args.smoke else steps)
    smoke_dir = tempfile.mkdtemp(prefix=f"{name.replace('_', '-')}-smoke-") if args.smoke and not args.run_dir else ""
    args.run_dir = Path(args.run_dir or smoke_dir or f"runs/{name}")
    args.out = Path(args.out or (args.run_dir / f"{name}.md" if args.smoke else f"docs/{name}.md"))
    return args


def run_worlds(
    script: str, args: argparse.Namespace, worker: Callable[[int], list[str]], done: Callable[[dict[str, Any]], str]
) -> dict[int, dict[str, Any]]:
    """Each of `args.seeds`' RUN_DIR/world_SEED/NAME.json (NAME: `script`'s stem), by seed.

    With `args.aggregate` the finished worlds are read; else `script`'s module (`python -m
    benchmarks.NAME`) runs once per world with `worker(seed)` as its arguments, `args.jobs` processes
    at once, each logging to RUN_DIR/world_SEED.log, and `done(result)` is printed as each world ends.
    A worker inherits this process's working directory and environment: it finds the package as the
    benchmark did (run from the repository root), and reads relative paths in its arguments as here.
    """
    name = Path(script).stem
    module = f"benchmarks.{name}"
    if args.aggregate:
        return {seed: finished_world(name, args.run_dir, seed) for seed in args.seeds}

    def one(seed: int) -> dict[str, Any]:
        log = args.run_dir / f"world_{seed}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        print(f"world {seed}: running (log: {log})", flush=True)
        with log.open("w") as out:
            subprocess.run(
                [sys.executable, "-m", module, *worker(seed)], check=True, stdout=out, stderr=subprocess.STDOUT
            )
        result = finished_world(name, args.run_dir, seed)
        print(f"world {seed}: done, {done(result)}", flush=True)
        return result

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        return dict(zip(args.seeds, pool.map(one, args.seeds)))


def finished_world(name: str, run_dir: Path, seed: int) -> dict[str, Any]:
    path = run_dir / f"world_{seed}" / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"{name}: world {seed} has no {path}; run it first (--seeds {seed})")
    return json.loads(path.read_text())


@contextmanager
def timed(clock: dict[str, float], key: str) -> Iterator[None]:
    """Adds the seconds the block took to clock[key]."""
    began = time.perf_counter()
    yield
    clock[key] = clock.get(key, 0.0) + time.perf_counter() - began


def synchronize(device: torch.device | None = None) -> None:
    """Waits for the CUDA work queued on `device` (the current CUDA device when None); nothing without CUDA."""
    if torch.cuda.is_available() and (device is None or device.type == "cuda"):
        torch.cuda.synchronize(device)


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def replace_block(text: str, name: str, content: str) -> str:
    """`text` with what stands between `<!-- name -->` and `<!-- /name -->` replaced by `content`."""
    begin, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    start, stop = text.index(begin) + len(begin), text.index(end)
    return text[:start] + content + text[stop:]


INTERVAL_METHOD = "95% t-interval of the paired mean over worlds (scipy.stats.t, n - 1 degrees of freedom)"
"""How every benchmark's paired difference gets its interval (`t_interval`), as its pages and JSON name it."""


def t_interval(diffs: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """The `level` t-interval of the mean of `diffs` (paired differences, one a world): mean ± t * sd / sqrt(n),
    t the (1 + level) / 2 quantile of Student's t with n - 1 degrees of freedom; None for fewer than 2 worlds."""
    from scipy import stats

    n = len(diffs)
    if n < 2:
        return None
    mean, sd = mean_sd(list(diffs))
    half = float(stats.t.ppf((1 + level) / 2, n - 1)) * sd / math.sqrt(n)
    return mean - half, mean + half


def paired(diffs: Sequence[float]) -> dict[str, float | None]:
    """A paired difference for the JSON: its mean and t-interval (`t_interval`; None for one world), rounded."""
    interval = t_interval(diffs)
    low, high = interval if interval else (None, None)
    return {"mean": round(mean_sd(list(diffs))[0], 2), "ci_low": _round(low), "ci_high": _round(high)}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def difference_cell(diffs: Sequence[float], digits: int = 1) -> str:
    """A paired difference as a table cell: `diffs` holds one arm's value minus the reference arm's, one per
    world (the same world for both).

    The mean with its 95% t-interval over worlds (`t_interval`), as "+4.0 (+2.0 to +6.0)"; an interval that
    holds 0 reads "no measurable difference (+1.0; -1.0 to +3.0)"; one world gives the mean alone ("+5.0
    (1 world: no interval)"), none at all "-".
    """
    if not diffs:
        return "-"
    mean = _signed(statistics.fmean(diffs), digits)
    interval = t_interval(diffs)
    if interval is None:
        return f"{mean} (1 world: no interval)"
    low, high = interval
    span = f"{_signed(low, digits)} to {_signed(high, digits)}"
    if low <= 0.0 <= high:
        return f"no measurable difference ({mean}; {span})"
    return f"{mean} ({span})"


def _signed(value: float, digits: int) -> str:
    """`value` with its sign, 0 without one ("-0.0" would read as a direction)."""
    return f"{value:+.{digits}f}" if round(value, digits) else f"{0.0:.{digits}f}"


def provenance(repo: Path = RECIPES.parents[1]) -> dict[str, Any]:
    """Where a benchmark ran: `commit` (`git rev-parse --short HEAD` of `repo`, "unknown" outside git; "+
    uncommitted changes" when tracked files differ from it), `cpu` (the CPU model), `cpu_capability`
    (the vector instructions torch's kernels use: a model name like "AMD EPYC" can hide several, and
    they change training floats), `cores` and `torch_threads` (as the process runs now: call it after
    the run set them)."""
    import torch

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        commit += " + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    cpuinfo = Path("/proc/cpuinfo")  # Linux; elsewhere what `platform` knows
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    models = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    cpu = models[0] if models else platform.processor() or "unknown"
    return {"commit": commit, "cpu": cpu, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cores": os.cpu_count() or 0, "torch_threads": torch.get_num_threads()}  # fmt: skip


def measured_at(info: dict[str, Any]) -> str:
    """One sentence for a generated page: the commit and machine of `provenance`."""
    kernels = f", {info['cpu_capability']} kernels" if info.get("cpu_capability") else ""
    return (
        f"Measured at commit {info['commit']} on {info['cpu']}{kernels} ({info['cores']} cores, "
        f"{info['torch_threads']} torch thread(s))."
    )
