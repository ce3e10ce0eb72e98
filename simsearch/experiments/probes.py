"""Probes of finished runs that the studies share: what an RL run's engine showed, how its queries name
the asked person, what its log says, how a simulator leaks answers, and every checkpoint kept.

Each reads a run directory (or asks an engine) and returns plain figures for a study's record.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import statistics
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from simsearch.config import TrainRecipe, load_recipe
from simsearch.eval.metrics import substring_exact_match
from simsearch.experiments.quickstart import evaluation_query_naming, first_query
from simsearch.retrieval.base import SearchEngine
from simsearch.simulator.engine import REDACTED
from simsearch.simulator.sft_data import contains_answer
from simsearch.tinyworld.diagnostics import query_naming
from simsearch.tinyworld.world import World
from simsearch.training.checkpoint import CHECKPOINTS, STATE_FILE
from simsearch.training.runlog import read_metrics
from simsearch.types import SearchRequest

KEPT_STAMP = ".checkpoint_mtime_ns"  # in a kept checkpoint copy: its checkpoint's trainer-state time
HALVES = ("first_half", "second_half")


@contextlib.contextmanager
def keeping_checkpoints(train_run: Path, keep: Path, every_s: float = 0.5) -> Iterator[None]:
    """While the block runs, copies each finished checkpoint's model of `train_run` into `keep`/step_N.

    A training run keeps its last two checkpoints only; this keeps every one. A checkpoint lives for a
    whole save interval (a minute or more on a tiny world) before it is pruned, and a watcher looking
    every `every_s` seconds copies it long before; the last ones are copied on leaving.
    """
    stop = threading.Event()

    def copy_new() -> None:
        for checkpoint in sorted((train_run / CHECKPOINTS).glob("step_*")):
            target, state = keep / checkpoint.name, checkpoint / STATE_FILE
            try:  # a copy stamped with its checkpoint's time is that checkpoint (a rebuilt run's is not)
                stamp = str(state.stat().st_mtime_ns)
                if (target / KEPT_STAMP).is_file() and (target / KEPT_STAMP).read_text() == stamp:
                    continue
                partial = keep / f".{checkpoint.name}"
                shutil.rmtree(partial, ignore_errors=True)
                shutil.copytree(checkpoint / "model", partial)
            except (FileNotFoundError, shutil.Error):  # unfinished, or pruned while being copied
                continue
            (partial / KEPT_STAMP).write_text(stamp)
            shutil.rmtree(target, ignore_errors=True)
            partial.rename(target)

    def watch() -> None:
        while not stop.wait(every_s):
            copy_new()

    keep.mkdir(parents=True, exist_ok=True)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
        copy_new()


def answer_in_results(train_run: Path) -> dict[str, float | int]:
    """How often an RL run's engine showed the answer: of the searches in its saved trajectories (a
    sample of its steps), the share whose results hold a gold answer of the question (normalized
    containment, as the rule reward matches), and their number; of the noisy documents among their
    results, their number and the share in which the simulator's `REDACTED` stands for an answer."""
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


def searches_by_kind(train_run: Path) -> dict[str, int]:
    """An RL run's searches per engine kind, from its cost.json."""
    engines = json.loads((train_run / "cost.json").read_text())["engines"]
    return {usage["kind"]: usage["searches"] for usage in engines.values()}


def rl_metrics(run: Path) -> dict[str, float]:
    """A training run's mean over steps of `sampling/flat_share`, `time/step_s`, searches per trajectory and
    prompts rolled out per step (`sampling/prompts` under dynamic sampling, else `prompts_per_step`)."""
    rows = read_metrics(run)
    recipe = load_recipe(TrainRecipe, run / "recipe.yaml")

    def mean(key: str, default: float = float("nan")) -> float:
        values = [float(r[key]) for r in rows if key in r]
        return statistics.fmean(values) if values else default

    return {
        "flat_share": mean("sampling/flat_share"),
        "step_s": mean("time/step_s"),
        "searches": mean("search/calls_per_traj"),
        "prompts_per_step": mean("sampling/prompts", float(recipe.prompts_per_step)),
        "steps": float(len(rows)),
    }


def tool_call_counts(examples: Path) -> dict[str, int]:
    """Of an evaluation's trajectories' turns (its examples file): calls read and run, calls that could not
    be read, turns, and turns that were invalid actions."""
    counts = {"calls": 0, "unreadable_calls": 0, "turns": 0, "invalid_turns": 0}
    for line in examples.read_text().splitlines():
        for turn in json.loads(line)["samples"][0]["turns"]:
            counts["turns"] += 1
            counts["calls"] += len(turn.get("call_queries", []))
            counts["unreadable_calls"] += len(turn.get("call_reasons", []))
            counts["invalid_turns"] += turn["action"] == "invalid"
    return counts


def naming_cells(eval_dir: Path, world: World, engine: str, dataset: str) -> dict[str, float]:
    """An evaluation's EM (percent) on `engine` and `dataset`, the share of first queries naming the asked
    person exactly, and the EM (0-1) of those and of the rest."""
    kinds = evaluation_query_naming(eval_dir, world, engine=engine, dataset=dataset)
    named, rest = kinds["exact"], [kinds[kind] for kind in kinds if kind != "exact"]
    rest_share = sum(cell["share"] for cell in rest)
    return {
        "em": 100.0 * sum(cell["share"] * cell["em"] for cell in kinds.values()),
        "named_share": named["share"],
        "em_named": named["em"],
        "em_unnamed": sum(cell["share"] * cell["em"] for cell in rest) / rest_share if rest_share else 0.0,
    }


def training_naming(train_run: Path, world: World) -> dict[str, dict[str, float | int]]:
    """From an RL run's saved trajectories, per half of its steps (`HALVES`): samples, the share whose first
    query names the person exactly, and the mean reward of those and of the rest (0 where there are none)."""
    rows = [json.loads(line) for line in (train_run / "trajectories.jsonl").read_text().splitlines() if line.strip()]
    last = max((row["step"] for row in rows), default=0)
    halves: dict[str, dict[str, float | int]] = {}
    for half in HALVES:
        mine = [row for row in rows if (row["step"] > last / 2) == (half == "second_half")]
        naming = [query_naming(first_query(row), world.facts[row["id"]].entity) == "exact" for row in mine]
        named = [row["reward"] for row, names in zip(mine, naming, strict=True) if names]
        rest = [row["reward"] for row, names in zip(mine, naming, strict=True) if not names]
        halves[half] = {
            "samples": len(mine),
            "named_share": len(named) / len(mine) if mine else 0.0,
            "reward_named": sum(named) / len(named) if named else 0.0,
            "reward_unnamed": sum(rest) / len(rest) if rest else 0.0,
        }
    return halves


def question_without_name(question: str, name: str) -> str:
    """The question's words without the entity's name: a query that names no one."""
    return " ".join(w for w in re.findall(r"[A-Za-z0-9]+", question) if w != name)


def answer_leakage(engine: SearchEngine, world: World, *, n: int, top_k: int) -> dict[str, float]:
    """Shares of result sets holding a gold answer (`contains_answer`) on the first `n` training questions.

    - `no_name`: useful results (num_noisy 0) for the question's words without the entity's
      name; a real engine finds the answer with such a query only by chance;
    - `noisy`: noisy results (num_noisy = top_k) for the question itself, which names the entity;
      the curriculum counts on them not holding the answer.

    One `search` call with every request; the requests carry the question and gold answers, which
    a simulator shows only when told to. Returns fractions in [0, 1].
    """
    examples = world.train[:n]

    def request(query: str, example: Any, num_noisy: int) -> SearchRequest:
        return SearchRequest(
            query=query, top_k=top_k, question=example.question, golden_answers=list(example.golden_answers),
            num_noisy=num_noisy,
        )  # fmt: skip

    requests = [request(question_without_name(e.question, world.facts[e.id].entity), e, 0) for e in examples]
    requests += [request(e.question, e, top_k) for e in examples]
    results = engine.search(requests)
    hits = [contains_answer(docs, r.golden_answers) for docs, r in zip(results, requests)]
    return {"no_name": statistics.fmean(hits[:n]), "noisy": statistics.fmean(hits[n:])}
