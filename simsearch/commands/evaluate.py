"""`simsearch eval RECIPE`: one policy x several search engines x several QA sets, plus baselines.

Methods (the tables' rows): one per entry of `engines` (the agent loop on that engine), `direct`
(no search) and `rag` (one retrieval with the question, then one generation). Writes
`examples/{method}/{dataset}.jsonl`, `summary.json`, `summary.csv`, `table.md`, plots,
`fidelity.json`, `metrics.jsonl`, `cost.json` and `view.html` into the run directory. Rows are
appended per chunk of questions, each chunk seeded from (seed, method, dataset, chunk), so a
rerun skips written ids; a rerun with a different recipe stops with an error.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import shlex
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from simsearch.commands import preflight
from simsearch.config import EvalDataset, EvalRecipe, SearchConfig, save_recipe
from simsearch.curriculum.schedules import num_noisy
from simsearch.data.qa import load_qa
from simsearch.errors import DataError, RecipeError
from simsearch.eval import report
from simsearch.eval.view import write_page
from simsearch.factory.build import (
    build_generation_engine,
    build_search_engine,
    meter_search_engine,
    search_fingerprint,
    unmetered,
)
from simsearch.fingerprints import digest
from simsearch.generation.base import GenerationEngine
from simsearch.policy.protocols import make_protocol
from simsearch.policy.rag import rag_rows
from simsearch.policy.rollout import RolloutSettings, generate_trajectories
from simsearch.retrieval import accounting
from simsearch.retrieval.accounting import Ledger
from simsearch.retrieval.base import SearchEngine
from simsearch.simulator.policy_fidelity import FIDELITY_FILE, kept_fidelity
from simsearch.training import preempt
from simsearch.training.runlog import METRICS_FILE, RunLogger, read_metrics
from simsearch.types import QAExample, SamplingParams

REAL_KINDS = ("bm25", "dense", "http", "serper", "serpapi")
"""Engine kinds that are real retrievers: references for the simulator-fidelity section."""
EXAMPLES_DIR = "examples"


@dataclass
class Method:
    """One row of the tables: an engine, or a baseline."""

    name: str
    kind: str  # "direct", "rag", or the engine's kind (bm25, dense, simulator, ...)
    engine: str  # the engine it searches with ("" for direct)
    top_k: int  # documents per search (0 for direct)
    search: str  # what the tables' "Search" column says
    fingerprint: str  # what shaped its results; rows written under another one are not reused


@dataclass
class _Evaluation:
    """Everything the loop works with, built by `_set_up`."""

    recipe: EvalRecipe
    run_dir: Path
    methods: list[Method]
    datasets: dict[str, list[QAExample]]
    done: dict[tuple[str, str], set[str]]  # (method, dataset) -> ids finished by earlier invocations
    training_metrics: list[dict[str, Any]] | None
    policy: GenerationEngine
    tokenizer: Any
    engines: dict[str, SearchEngine | None]
    ledger: Ledger
    previous_cost: Any
    logger: RunLogger
    chunk_step: int  # metrics rows written so far, one per chunk


def main(recipe: EvalRecipe) -> dict[str, Any]:
    """Evaluates the recipe's policy; returns the summary also written to `summary.json`.

    On SIGTERM or SIGINT it finishes the chunk in flight, keeps its rows and exits with status 143.
    """
    e = _set_up(recipe)
    kept = f"finished rows are kept in {e.run_dir / EXAMPLES_DIR}"
    with preempt.stop_on_signals(recipe.stop_grace_s, lambda: kept, "simsearch eval") as stop:
        for method in e.methods:
            for dataset, examples in e.datasets.items():
                _evaluate(e, method, dataset, examples, stop)
    return _clean_up(e, _fidelity(e))


def _set_up(recipe: EvalRecipe) -> _Evaluation:
    """Checks paths, rows, datasets and finished work, then loads the policy and engines."""
    run_dir = Path(recipe.run_dir)
    preflight.set_threads(recipe.threads)
    preflight.check_paths(recipe)
    methods = plan_methods(recipe)
    datasets = {spec.name: load_dataset(spec) for spec in recipe.datasets}
    training_metrics = _training_metrics(recipe.training_run) if recipe.training_run else None
    # Finished work, checked against this recipe before anything is loaded.
    done = {
        (method.name, dataset): finished_ids(examples_file(run_dir, method.name, dataset), method.fingerprint)
        for method in methods
        for dataset in datasets
    }
    policy, tokenizer, _ = build_generation_engine(recipe.policy)
    make_protocol(recipe.rollout).check(tokenizer)  # before any row: a template without tools is named
    ledger, previous_cost = Ledger(), accounting.read_cost(run_dir)
    engines = {
        name: meter_search_engine(build_search_engine(cfg, seed=recipe.seed), cfg, ledger, name)
        for name, cfg in recipe.engines.items()
    }
    save_recipe(recipe, run_dir)
    _record_command(run_dir)
    # One metrics row per chunk, numbered on from the rows earlier invocations wrote.
    logged = read_metrics(run_dir)
    chunk_step = int(logged[-1]["step"]) if logged else 0
    logger = RunLogger(run_dir, resume_step=chunk_step, tensorboard=False)
    return _Evaluation(recipe, run_dir, methods, datasets, done, training_metrics, policy, tokenizer, engines,
                       ledger, previous_cost, logger, chunk_step)  # fmt: skip


def _evaluate(e: _Evaluation, method: Method, dataset: str, examples: list[QAExample], stop: preempt.Stop) -> None:
    """One row of the tables on one dataset, chunk by chunk; after a signal, the chunk in flight ends the run."""
    recipe = e.recipe
    sampling = SamplingParams(
        temperature=recipe.sampling.temperature,
        top_p=recipe.sampling.top_p,
        max_new_tokens=recipe.sampling.max_new_tokens,
    )
    path = examples_file(e.run_dir, method.name, dataset)
    finished = e.done[method.name, dataset]
    resumed = sum(ex.id in finished for ex in examples)
    began = time.perf_counter()
    for index, chunk in enumerate(_chunks(examples, recipe.chunk_size)):
        todo = [ex for ex in chunk if ex.id not in finished]
        if not todo:
            continue
        seed = chunk_seed(recipe.seed, method.name, dataset, index)
        started = time.perf_counter()
        rows = _run_chunk(method, todo, recipe, e.policy, e.tokenizer, e.engines, sampling, seed)
        report.append_rows(path, rows, wall_s=time.perf_counter() - started, fingerprint=method.fingerprint)
        e.chunk_step += 1
        e.logger.log(e.chunk_step, e.ledger.step_metrics())
        accounting.write_cost(e.run_dir, e.previous_cost, e.ledger.total)
        if stop.requested:
            e.logger.close()
            resume = preempt.resume_command("eval", e.run_dir, resume_false=False, world=1)
            preempt.exit_stopped(stop, f"after a chunk of {method.name} / {dataset}: rows kept in {path}", resume)
    print(
        f"simsearch eval: {method.name} / {dataset}: {len(examples)} questions "
        f"({resumed} resumed) in {time.perf_counter() - began:.1f} s",
        flush=True,
    )


def _clean_up(e: _Evaluation, fidelity: list[dict[str, Any]]) -> dict[str, Any]:
    """Tables, plots and the trajectory page, from the per-example files; the last line says where."""
    run_dir = e.run_dir
    e.logger.close()
    cost = accounting.write_cost(run_dir, e.previous_cost, e.ledger.total)
    summary = build_summary(e.recipe, e.methods, e.datasets, run_dir, fidelity)
    summary["cost"] = accounting.cost_record(cost)["engines"]
    report.write_json(summary, run_dir / "summary.json")
    report.write_csv(summary, run_dir / "summary.csv")
    report.write_markdown(summary, run_dir / "table.md")
    report.plot_bars(summary, run_dir / "bars.png")
    if e.training_metrics is not None:
        report.plot_training_curves(e.training_metrics, run_dir / "curves.png")
    page = write_page(run_dir)
    print(f"simsearch eval: results in {run_dir / 'table.md'} (summary.json, bars.png; trajectories: {page})",
          flush=True)  # fmt: skip
    return summary


# --------------------------------------------------------------------------- setup


def plan_methods(recipe: EvalRecipe) -> list[Method]:
    """The rows to evaluate, baselines first; warns about paid engines without a cache."""
    for name, cfg in recipe.engines.items():
        if cfg.kind in ("serper", "serpapi") and not cfg.cache:
            warnings.warn(
                f"engines.{name}: kind={cfg.kind} without a cache pays again for every query on a "
                f"rerun or resume; set engines.{name}.cache (e.g. runs/cache/google.sqlite)",
                stacklevel=2,
            )

    shared = {
        "policy": {
            "kind": recipe.policy.kind,
            "path": recipe.policy.model.path,
            "adapter": recipe.policy.model.adapter,
            "dtype": recipe.policy.model.dtype,
            "served": recipe.policy.served_model_name,
        },
        "sampling": asdict(recipe.sampling),
        "n": recipe.n,
        "seed": recipe.seed,
        "max_context_tokens": recipe.rollout.max_context_tokens,
        "normalization": recipe.normalization,
    }
    rollout = {k: v for k, v in asdict(recipe.rollout).items() if k != "group_size"}
    if recipe.rollout.protocol == "tags":  # fingerprints of tag runs stay those written before the protocols
        del rollout["protocol"], rollout["tool_format"]
    methods = []
    if "direct" in recipe.baselines:
        methods.append(Method("direct", "direct", "", 0, "none", digest({**shared, "method": "direct"})))
    if "rag" in recipe.baselines:
        name = recipe.rag_engine or next(iter(recipe.engines))
        cfg = recipe.engines[name]
        parts = {**shared, "method": "rag", "engine": _engine_identity(cfg, recipe.noisy_share)}
        methods.append(Method("rag", "rag", name, cfg.top_k, f"{name} top-{cfg.top_k}, one retrieval", digest(parts)))
    for name, cfg in recipe.engines.items():
        # Fingerprint the share the rollout really uses, so rows in which a self-search policy
        # answered itself are never resumed as rows of a real engine.
        real_share = real_search_share(recipe.rollout.template, cfg.kind)
        parts = {
            **shared,
            "rollout": {**rollout, "self_search_real_share": real_share},
            "engine": _engine_identity(cfg, recipe.noisy_share),
        }
        search = f"{cfg.kind} top-{cfg.top_k}"
        if cfg.kind == "simulator":
            search += f", p_noise {recipe.noisy_share:g}"
        methods.append(Method(name, cfg.kind, name, cfg.top_k, search, digest(parts)))
    return methods


def real_search_share(template: str, engine_kind: str) -> float:
    """`self_search_real_share` for a row: 0 for a self-search policy on a `self` engine, else 1."""
    return 1.0 if template == "self-search" and engine_kind != "self" else 0.0


def _engine_identity(cfg: SearchConfig, noisy_share: float) -> dict[str, Any]:
    if cfg.kind == "self":
        return {"kind": "self"}
    identity: dict[str, Any] = {"engine": search_fingerprint(cfg)}
    if cfg.kind == "simulator":
        identity["noisy_share"] = noisy_share
    return identity


def load_dataset(spec: EvalDataset) -> list[QAExample]:
    """The dataset's questions (its first `limit`), with unique ids (`DataError` on a repeated id)."""
    examples = load_qa(spec.path, split=spec.split)
    if spec.limit:
        examples = examples[: spec.limit]
    seen: set[str] = set()
    for example in examples:
        if example.id in seen:
            raise DataError(
                f"{spec.path}: id {example.id!r} occurs twice; evaluation keys results on ids, so "
                "give every row a unique 'id'"
            )
        seen.add(example.id)
    return examples


def _training_metrics(training_run: str) -> list[dict[str, Any]]:
    rows = read_metrics(training_run)
    if not rows:
        raise RecipeError(
            f"training_run={training_run!r}: no {METRICS_FILE} with rows there; point it at a "
            "`simsearch train` run directory, or leave it empty"
        )
    if not report.curve_panels(rows):
        raise RecipeError(
            f"training_run={training_run!r}: its {METRICS_FILE} has none of the keys the curves "
            "plot (reward/mean, .../em, .../f1, .../calls_per_traj, .../response_len, curriculum/p_noise)"
        )
    return rows


def _record_command(run_dir: Path) -> None:
    program = "simsearch" if Path(sys.argv[0]).stem == "simsearch" else sys.argv[0]
    line = shlex.join([program, *sys.argv[1:]])
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    with (run_dir / "command.txt").open("a", encoding="utf-8") as handle:
        handle.write(f"# {stamp}\n{line}\n")


# --------------------------------------------------------------------------- per-example files


def examples_file(run_dir: Path, method: str, dataset: str) -> Path:
    return run_dir / EXAMPLES_DIR / method / f"{dataset}.jsonl"


def finished_ids(path: Path, fingerprint: str) -> set[str]:
    """Ids already written to `path` under `fingerprint`; `RecipeError` when its rows come from another recipe."""
    rows = report.read_rows(path, repair=True)
    for row in rows:
        if row.get("fingerprint") != fingerprint:
            raise RecipeError(
                f"{path} holds results of a different recipe (policy, sampling, rollout or engine "
                "changed since they were written); use a new run_dir, or delete that file to "
                "recompute it"
            )
    return {row["id"] for row in rows}


def _chunks(examples: list[QAExample], size: int) -> list[list[QAExample]]:
    # Fixed boundaries over the whole dataset, so a resumed run meets the same chunks (and seeds).
    return [examples[start : start + size] for start in range(0, len(examples), size)]


def chunk_seed(seed: int, method: str, dataset: str, chunk: int) -> int:
    """A seed per chunk, stable across runs and resumes."""
    hashed = hashlib.sha256(f"{seed}/{method}/{dataset}/{chunk}".encode()).digest()
    return int.from_bytes(hashed[:4], "big") >> 1  # < 2**31: every backend accepts it


# --------------------------------------------------------------------------- one chunk


def _run_chunk(
    method: Method,
    examples: list[QAExample],
    recipe: EvalRecipe,
    policy: GenerationEngine,
    tokenizer: Any,
    engines: dict[str, SearchEngine | None],
    sampling: SamplingParams,
    seed: int,
) -> list[dict[str, Any]]:
    """One chunk's per-example rows: the RAG baseline's, or rollouts with the row's settings."""
    sampling = replace(sampling, seed=seed)
    noise = None
    if method.engine and recipe.engines[method.engine].kind == "simulator":
        noise = _noise(recipe.noisy_share, random.Random(seed))
    if method.kind == "rag":
        engine = engines[method.engine]
        assert engine is not None  # plan_methods: the RAG engine is never kind=self
        return rag_rows(
            examples,
            policy=policy,
            tokenizer=tokenizer,
            engine=engine,
            top_k=method.top_k,
            noise=noise,
            sampling=sampling,
            n=recipe.n,
            max_context_tokens=recipe.rollout.max_context_tokens,
            normalization=recipe.normalization,
        )
    result = generate_trajectories(
        examples,
        policy=policy,
        tokenizer=tokenizer,
        search=None if method.kind == "direct" else engines[method.engine],
        settings=_rollout_settings(method, recipe),
        sampling=sampling,
        group_size=recipe.n,
        noise=noise,
        rng=random.Random(seed + 1),
    )
    n = recipe.n
    trajectories = result.trajectories
    return [
        report.example_row(
            example,
            [report.trajectory_sample(t) for t in trajectories[i * n : (i + 1) * n]],
            normalization=recipe.normalization,
        )
        for i, example in enumerate(examples)
    ]


def _rollout_settings(method: Method, recipe: EvalRecipe) -> RolloutSettings:
    """The rollout of a row: the `direct` template without search, or the recipe's on the row's engine."""
    rollout = recipe.rollout
    if method.kind == "direct":  # no turn searches, so the search section's defaults go unread
        search = SearchConfig()
        direct = replace(rollout, template="direct", max_turns=0, protocol="tags")
        return RolloutSettings(direct, search.top_k, search.rendering)
    cfg = recipe.engines[method.engine]
    share = real_search_share(rollout.template, cfg.kind)
    return RolloutSettings(replace(rollout, self_search_real_share=share), cfg.top_k, cfg.rendering)


def _noise(share: float, rng: random.Random) -> Callable[[int], int]:
    return lambda top_k: num_noisy(share, top_k, "call", rng)


# --------------------------------------------------------------------------- fidelity


def _fidelity(e: _Evaluation) -> list[dict[str, Any]]:
    """Simulator fidelity against each real retriever, per dataset ([] without both sides or `fidelity_size`)."""
    recipe = e.recipe
    sims = [name for name, cfg in recipe.engines.items() if cfg.kind == "simulator"]
    refs = [name for name, cfg in recipe.engines.items() if cfg.kind in REAL_KINDS]
    if not (sims and refs and recipe.fidelity_size):
        return []
    # Fidelity inspects the simulator's type for its parse statistics; the inner counters still
    # count its queries and tokens.
    engines = {name: unmetered(engine) for name, engine in e.engines.items()}
    entries = []
    for sim, ref, dataset in itertools.product(sims, refs, e.datasets):
        simulator, reference = engines[sim], engines[ref]
        assert simulator is not None and reference is not None  # neither is kind=self
        rows = report.rows_in_order(examples_file(e.run_dir, ref, dataset), e.datasets[dataset])
        identities = {
            "simulator": _engine_identity(recipe.engines[sim], 0.0),
            "reference": _engine_identity(recipe.engines[ref], 0.0),
        }
        entry = kept_fidelity(
            e.run_dir / FIDELITY_FILE,
            rows[: recipe.fidelity_size],
            simulator=simulator,
            reference=reference,
            top_k=recipe.engines[sim].top_k,
            identities=identities,
            labels={"simulator": sim, "reference": ref, "dataset": dataset},
        )
        entries.append(entry)
    return entries


# --------------------------------------------------------------------------- summary


def build_summary(
    recipe: EvalRecipe,
    methods: list[Method],
    datasets: dict[str, list[QAExample]],
    run_dir: Path,
    fidelity: list[dict[str, Any]],
) -> dict[str, Any]:
    """The summary dict of `simsearch.eval.report` from the per-example files (the RAG row adds `rag/truncated`)."""
    rows = {}
    truncated = 0
    for method in methods:
        results = {}
        for dataset, examples in datasets.items():
            written = report.rows_in_order(examples_file(run_dir, method.name, dataset), examples)
            results[dataset] = report.summarize(written)
            if method.kind == "rag":
                # Rows written before truncation existed have no count: nothing was cut then.
                count = sum(row["retrieval"].get("truncated_chars", 0) > 0 for row in written)
                results[dataset]["rag/truncated"] = float(count)
                truncated += count
        rows[method.name] = {
            "kind": method.kind,
            "search": method.search,
            "top_k": method.top_k,
            "results": results,
            "average": report.average(results),
        }
    model = recipe.policy.model
    sampling = recipe.sampling
    header = {
        "policy": model.path + (f" + adapter {model.adapter}" if model.adapter else ""),
        "sampling": "greedy"
        if sampling.temperature == 0
        else f"temperature {sampling.temperature:g}, top-p {sampling.top_p:g}",
        "samples per question": recipe.n,
        "template": (
            f"{recipe.rollout.template}, max_turns {recipe.rollout.max_turns}"
            if recipe.rollout.protocol == "tags"
            else f"tool calls ({recipe.rollout.tool_format}), max_turns {recipe.rollout.max_turns}"
        ),
        "max new tokens per turn": sampling.max_new_tokens,
        "seed": recipe.seed,
    }
    if any(method.kind == "rag" for method in methods):
        questions = sum(len(examples) for examples in datasets.values())
        header["RAG prompts with documents cut to fit"] = f"{truncated} of {questions}"
    return {
        "datasets": list(datasets),
        "n": recipe.n,
        "header": header,
        "normalization": recipe.normalization,
        "rows": rows,
        "fidelity": [{k: v for k, v in entry.items() if k != "key"} for entry in fidelity],
    }
