"""What several benchmarks share: timing, mean ± sd, paired differences' t-intervals, a doc's rewritten
blocks and where a benchmark ran. The studies' runner is `benchmarks.study`; the fingerprinted stages
they run are `simsearch.experiments.stages`.

A benchmark imports it as `benchmarks.benchlib`: the benchmarks run as modules of the `benchmarks`
package from the repository root (`python -m benchmarks.NAME`), and tests import them the same way.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "quickstart"

# Overrides of the quickstart's train.yaml for an engine other than the simulator: no noise to
# schedule, and no cache (it would hold the simulator's).
NO_NOISE = {"curriculum.kind": "constant", "curriculum.p_start": "0.0", "search.cache": "''"}


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


def rounded_mean(values: Sequence[float], digits: int = 2) -> float | None:
    """The mean of `values` rounded to `digits` (a figure for the JSON), None for none."""
    return round(statistics.fmean(values), digits) if values else None


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
