"""What several benchmarks share: fingerprinted stages, timing, mean ± sd and the doc's rewritten blocks.

A benchmark imports it as a sibling module (`sys.path` gets this folder first, as `python
benchmarks/x.py` already gives it), so a benchmark loaded by path from a test finds it too.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from simsearch.config import load_recipe
from simsearch.fingerprints import claim_stage, digest, finish_stage

RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "quickstart"

# Overrides of the quickstart's train.yaml for an engine other than the simulator: no noise to
# schedule, and no cache (it would hold the simulator's).
NO_NOISE = ("curriculum.kind=constant", "curriculum.p_start=0.0", "search.cache=''")


def run_stage(
    schema: type, recipe_file: Path, overrides: list[str], command: Callable[[Any], Any], inputs: list[str]
) -> str:
    """One command on a recipe plus overrides, skipped when it finished under the same fingerprint.

    Returns the fingerprint (resolved recipe and inputs' fingerprints). A directory built from
    anything else is deleted first, as the quickstart's stages are.
    """
    stage = load_recipe(schema, recipe_file, overrides)
    fingerprint = digest({"recipe": asdict(stage), "inputs": inputs})
    directory = Path(stage.run_dir)
    if not claim_stage(directory, fingerprint):
        command(stage)
        finish_stage(directory, fingerprint)
    return fingerprint


@contextmanager
def timed(clock: dict[str, float], key: str) -> Iterator[None]:
    """Adds the seconds the block took to clock[key]."""
    began = time.perf_counter()
    yield
    clock[key] = clock.get(key, 0.0) + time.perf_counter() - began


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def replace_block(text: str, name: str, content: str) -> str:
    """`text` with what stands between `<!-- name -->` and `<!-- /name -->` replaced by `content`."""
    begin, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    start, stop = text.index(begin) + len(begin), text.index(end)
    return text[:start] + content + text[stop:]
