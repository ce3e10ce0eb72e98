"""Evaluation reports from plain data: per-example rows, summaries, tables (Markdown, CSV, JSON), plots.

A per-example row (a line of `examples/{method}/{dataset}.jsonl`) holds `id`, `question`,
`golden_answers`, pass@n `scores`, `samples` (each with its answer, response, counts and
`scores`), `wall_s` and `fingerprint`. `summary.json` holds `datasets`, `n`, `header`,
`normalization`, `rows` ({row: {kind, search, top_k, results: {dataset: metrics}, average}}),
`fidelity` and optionally `cost`, with `metrics` as `summarize` returns.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from simsearch.errors import DataError
from simsearch.eval.metrics import NORMALIZATIONS, exact_match, f1_score, substring_exact_match
from simsearch.types import Document, QAExample, Trajectory, Turn

SCORE_METRICS: tuple[str, ...] = ("substring_em", "em", "f1")
"""Per-question answer scores, in the order the report shows them."""
BEHAVIOUR_METRICS: tuple[str, ...] = (
    "answer_rate",
    "searches_per_question",
    "invalid_actions",
    "tokens_per_question",
)
"""Per-trajectory behaviour, averaged over every sample."""
SUMMED_METRICS: tuple[str, ...] = ("questions", "samples", "wall_s")
"""Counts and times: summed over datasets in the average, not averaged."""
METRICS: tuple[str, ...] = SCORE_METRICS + BEHAVIOUR_METRICS + SUMMED_METRICS

SCORE_TITLES = {
    "substring_em": 'Substring EM (what ZeroSearch reports as "EM")',
    "em": 'Exact match (EM; what Search-R1 and SSRL report as "EM")',
    "f1": "Token F1",
}
SCORE_DEFINITIONS = {
    "substring_em": "a normalized gold answer occurs in the normalized answer",
    "em": "the normalized answer equals a normalized gold answer",
    "f1": "token-overlap F1 with the best normalized gold answer",
}
"""What each score measures, for the protocol line under its title."""
FIDELITY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("fidelity/useful_contains_answer", "useful ∋ answer"),
    ("fidelity/noisy_contains_answer", "noisy ∋ answer"),
    ("fidelity/gap", "gap"),
    ("fidelity/query_sensitivity", "query sensitivity"),
    ("fidelity/reference_contains_answer", "reference ∋ answer"),
    ("fidelity/reference_query_sensitivity", "reference query sensitivity"),
    ("fidelity/agreement", "agreement"),
    ("fidelity/format_valid", "format valid"),
)
AVERAGE = "average"
MISSING = "–"


# --------------------------------------------------------------------------- per-example rows


def score_answer(answer: str | None, golds: Sequence[str], *, normalization: str) -> dict[str, float]:
    """EM, substring EM and F1 of one answer (None: no answer), as the training rewards compute them."""
    return {
        "substring_em": substring_exact_match(answer, golds, normalization=normalization),
        "em": exact_match(answer, golds, normalization=normalization),
        "f1": f1_score(answer, golds, normalization=normalization),
    }


def document_record(document: Document) -> dict[str, Any]:
    return asdict(document)


def turn_record(turn: Turn) -> dict[str, Any]:
    """A rollout turn as a JSON object; the tool-call fields only on a tool-call turn (when not empty)."""
    record = asdict(turn)
    record["documents"] = [document_record(d) for d in turn.documents]
    for name in ("call_queries", "call_documents", "call_reasons"):
        if not record[name]:
            del record[name]
    return record


def trajectory_sample(trajectory: Trajectory) -> dict[str, Any]:
    """One sample of a per-example row from a trajectory; `policy_tokens` counts the trained tokens."""
    return {
        "answer": trajectory.answer,
        "response": trajectory.response_text,
        "finish": trajectory.finish,
        "num_searches": trajectory.num_searches,
        "num_invalid": trajectory.num_invalid,
        "policy_tokens": sum(trajectory.loss_mask),
        "turns": [turn_record(turn) for turn in trajectory.turns],
    }


def example_row(
    example: QAExample, samples: list[dict[str, Any]], *, normalization: str, **extra: Any
) -> dict[str, Any]:
    """The per-example row of one question: each sample scored, and the question's pass@n scores.

    `normalization` is a name of `NORMALIZATIONS`; `extra` adds keys (the RAG baseline's `retrieval`).
    """
    golds = list(example.golden_answers)
    for sample in samples:
        sample["scores"] = score_answer(sample["answer"], golds, normalization=normalization)
    best = {metric: max(s["scores"][metric] for s in samples) for metric in SCORE_METRICS}
    return {
        "id": example.id,
        "question": example.question,
        "golden_answers": golds,
        "scores": best,
        "samples": samples,
        **extra,
    }


def append_rows(path: str | os.PathLike, rows: list[dict[str, Any]], *, wall_s: float, fingerprint: str) -> None:
    """Appends rows to a per-example JSONL file in one write, each with `wall_s / len(rows)` and `fingerprint`."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({**row, "wall_s": wall_s / len(rows), "fingerprint": fingerprint}, ensure_ascii=False)
        for row in rows
    ]
    with out.open("a", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in lines))


def read_rows(path: str | os.PathLike, *, repair: bool = False) -> list[dict[str, Any]]:
    """The rows of a per-example file ([] when it does not exist).

    With `repair`, an unfinished last line is cut from the file instead of raising `DataError`.
    """
    file = Path(path)
    if not file.is_file():
        return []
    text = file.read_text(encoding="utf-8")
    rows = []
    offset = 0
    for lineno, line in enumerate(text.split("\n"), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                unfinished = offset + len(line) == len(text)
                if not (repair and unfinished):
                    raise DataError(
                        f"{file}: line {lineno} is not valid JSON; delete that line (or the file) "
                        "to recompute those examples"
                    ) from None
                file.write_text(text[:offset], encoding="utf-8")
                break
        offset += len(line) + 1
    return rows


def rows_in_order(path: str | os.PathLike, examples: Sequence[QAExample]) -> list[dict[str, Any]]:
    """The rows of `path` for `examples`, in their order; raises `DataError` when one has no row."""
    by_id = {row["id"]: row for row in read_rows(path)}
    missing = [ex.id for ex in examples if ex.id not in by_id]
    if missing:
        raise DataError(f"{path}: no result for {len(missing)} question(s), e.g. id {missing[0]!r}")
    return [by_id[ex.id] for ex in examples]


# --------------------------------------------------------------------------- summaries


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Metrics of one (method, dataset) cell: means over questions of the scores, over samples of the behaviour.

    Raises:
        ValueError: No rows, or a row without samples.
    """
    if not rows:
        raise ValueError("summarize needs at least one per-example row")
    samples = []
    for row in rows:
        if not row["samples"]:
            raise ValueError(f"example {row.get('id')!r} has no samples")
        samples.extend(row["samples"])
    summary = {"questions": float(len(rows)), "samples": float(len(samples))}
    for metric in SCORE_METRICS:
        summary[metric] = _mean([row["scores"][metric] for row in rows])
    summary["answer_rate"] = _mean([float(s["answer"] is not None) for s in samples])
    summary["searches_per_question"] = _mean([s["num_searches"] for s in samples])
    summary["invalid_actions"] = _mean([s["num_invalid"] for s in samples])
    summary["tokens_per_question"] = _mean([s["policy_tokens"] for s in samples])
    summary["wall_s"] = float(sum(row["wall_s"] for row in rows))
    return summary


def average(results: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The unweighted mean over datasets of `results` (dataset -> metrics); `SUMMED_METRICS` are summed."""
    if not results:
        return {}
    cells = list(results.values())
    out = {}
    for metric in METRICS:
        values = [cell[metric] for cell in cells if metric in cell]
        if len(values) != len(cells):
            continue
        out[metric] = float(sum(values)) if metric in SUMMED_METRICS else _mean(values)
    return out


def _mean(values: Sequence[float]) -> float:
    return float(sum(values)) / len(values) if values else 0.0


# --------------------------------------------------------------------------- tables


def _percent(value: float | None) -> str:
    return MISSING if value is None else f"{100.0 * value:.2f}"


def score_table(summary: Mapping[str, Any], metric: str) -> str:
    """One Markdown table of `metric` in percent: methods as rows, datasets then "Avg." as columns."""
    if metric not in SCORE_METRICS:
        raise ValueError(f"metric={metric!r} is not one of {', '.join(SCORE_METRICS)}")
    datasets = list(summary["datasets"])
    lines = [
        "| Method | Search | " + " | ".join(datasets) + " | Avg. |",
        "|---|---|" + "---:|" * (len(datasets) + 1),
    ]
    for name, row in summary["rows"].items():
        results = row["results"]
        cells = [_percent(results[d][metric]) if d in results else MISSING for d in datasets]
        complete = all(d in results for d in datasets)
        avg = _percent(row["average"][metric]) if complete and row["average"] else MISSING
        lines.append(f"| {name} | {row['search']} | " + " | ".join(cells) + f" | {avg} |")
    return "\n".join(lines) + "\n"


def metric_line(metric: str) -> str:
    return f"Metric: {metric}, {SCORE_DEFINITIONS[metric]}.\n"


def protocol_line(summary: Mapping[str, Any]) -> str:
    """One Markdown line: engine and top-k per row, and the normalization (`ValueError` if unknown)."""
    normalization = summary.get("normalization")
    if normalization not in NORMALIZATIONS:
        raise ValueError(
            f"the summary's normalization={normalization!r} is not one of {', '.join(NORMALIZATIONS)}; "
            "say how its scores were normalized"
        )
    engines = "; ".join(f"{row['search'] or 'none'} ({name})" for name, row in summary["rows"].items())
    return (
        f"Protocol of the score tables. Engine, top-k: {engines}. "
        f"Normalization: {normalization} ({NORMALIZATIONS[normalization].summary}).\n"
    )


def behaviour_table(summary: Mapping[str, Any]) -> str:
    """Markdown table of behaviour and cost per method: rates averaged over datasets, totals summed."""
    lines = [
        "| Method | Search | questions | answer rate % | searches / q | invalid / q | tokens / q | wall s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in summary["rows"].items():
        avg = row["average"]
        if not avg:
            lines.append(f"| {name} | {row['search']} |" + f" {MISSING} |" * 6)
            continue
        lines.append(
            f"| {name} | {row['search']} | {int(avg['questions'])} | {_percent(avg['answer_rate'])} | "
            f"{avg['searches_per_question']:.2f} | {avg['invalid_actions']:.2f} | "
            f"{avg['tokens_per_question']:.1f} | {avg['wall_s']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def fidelity_table(entries: Sequence[Mapping[str, Any]]) -> str:
    """Markdown table of simulator fidelity, one line per (simulator, reference, dataset)."""
    head = "| Simulator | Reference | Dataset | queries (policy / question) | "
    head += " | ".join(title for _, title in FIDELITY_COLUMNS) + " |"
    lines = [head, "|---|---|---|---:|" + "---:|" * len(FIDELITY_COLUMNS)]
    for entry in entries:
        cells = [_percent(entry.get(key)) for key, _ in FIDELITY_COLUMNS]
        queries = f"{entry['policy_queries']} / {entry['question_queries']}"
        lines.append(
            f"| {entry['simulator']} | {entry['reference']} | {entry['dataset']} | {queries} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines) + "\n"


def _count(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "unknown" if value is None else fmt.format(value)


def _dollars(value: float | None) -> str:
    # A price never set is unknown, not free.
    if value is None:
        return "unknown"
    return f"${value:,.2f}" if value >= 0.01 or value == 0 else f"${value:.4f}"


def cost_table(cost: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown table of search cost and latency (ms per `search` call), one line per engine."""
    lines = [
        "| Engine | kind | searches | cache hits | queries sent | p50 ms | p95 ms | p99 ms | simulator calls | "
        "prompt tokens | completion tokens | simulator s | $ / 1k queries | query cost | simulator cost |",
        "|---|---|" + "---:|" * 13,
    ]
    for name, usage in cost.items():
        latencies = [
            _count(None if usage.get(f"latency_p{q}_s") is None else 1000.0 * usage[f"latency_p{q}_s"], "{:.1f}")
            for q in (50, 95, 99)
        ]
        simulated = usage["kind"] == "simulator"
        prompt = usage["prompt_tokens"] if usage.get("prompt_tokens_complete", True) else None
        sim_cells = (
            [
                _count(usage["simulator_calls"]),
                _count(prompt),
                _count(usage["completion_tokens"]),
                f"{usage['simulator_s']:.1f}",
            ]
            if simulated
            else [MISSING] * 4
        )
        counts = [f"{usage[key]:,}" for key in ("searches", "cache_hits", "queries_sent")]
        lines.append(
            f"| {name} | {usage['kind']} | "
            + " | ".join(counts + latencies + sim_cells)
            + f" | {_dollars(usage.get('price_per_1k_queries'))} | {_dollars(usage.get('query_cost_usd'))} | "
            + f"{_dollars(usage.get('simulator_cost_usd')) if simulated else MISSING} |"
        )
    return "\n".join(lines) + "\n"


def markdown_report(summary: Mapping[str, Any]) -> str:
    """The whole `table.md`: header, score tables, behaviour, cost (when present), fidelity."""
    n = int(summary.get("n", 1))
    at = f", pass@{n}" if n > 1 else ""
    parts = ["# Evaluation\n"]
    for label, value in summary.get("header", {}).items():
        parts.append(f"- {label}: {value}")
    parts.append("")
    parts.append(protocol_line(summary))
    for metric in SCORE_METRICS:
        parts.append(f"## {SCORE_TITLES[metric]}, %{at}\n")
        parts.append(metric_line(metric))
        parts.append(score_table(summary, metric))
    parts.append("## Behaviour and cost (all datasets)\n")
    parts.append(behaviour_table(summary))
    if summary.get("cost"):
        parts.append("## Search cost and latency (all invocations of this run)\n")
        parts.append(
            "Counted, not estimated: searches asked, cache hits, queries that reached the engine "
            "(what a web API bills), latency per search call, the simulator's generation. Costs "
            "are queries sent x the price per 1,000 queries, and the simulator's generation time x "
            "its GPU-hour price; a price never set is unknown (`price_per_1k_queries`, "
            "`gpu_hour_price` of each engine).\n"
        )
        parts.append(cost_table(summary["cost"]))
    if summary.get("fidelity"):
        parts.append("## Simulator fidelity\n")
        parts.append(
            "Documents containing a gold answer (%), for the simulator asked for useful and for "
            "noisy documents, with the queries the policy sent to the reference engine (or the "
            "question when it sent none); query sensitivity = useful minus the same with another "
            "example's query (see `simsearch.simulator.fidelity`).\n"
        )
        parts.append(fidelity_table(summary["fidelity"]))
    return "\n".join(parts)


def write_markdown(summary: Mapping[str, Any], path: str | os.PathLike) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown_report(summary), encoding="utf-8")
    return out


def write_json(summary: Mapping[str, Any], path: str | os.PathLike) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


CSV_COLUMNS: tuple[str, ...] = ("method", "kind", "search", "top_k", "dataset", *METRICS)


def write_csv(summary: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Writes one CSV line per (method, dataset) and per method's average; values are fractions."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(CSV_COLUMNS))
        writer.writeheader()
        for name, row in summary["rows"].items():
            cells = [(d, row["results"][d]) for d in summary["datasets"] if d in row["results"]]
            if row["average"]:
                cells.append((AVERAGE, row["average"]))
            for dataset, metrics in cells:
                writer.writerow(
                    {
                        "method": name,
                        "kind": row["kind"],
                        "search": row["search"],
                        "top_k": row["top_k"],
                        "dataset": dataset,
                        **{metric: metrics.get(metric, "") for metric in METRICS},
                    }
                )
    return out


# --------------------------------------------------------------------------- plots


def _figure(size_px: tuple[int, int], dpi: int, rows: int = 1, cols: int = 1):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # A bare Figure on the Agg canvas, not pyplot: no window, no global backend switch, no
    # figures kept alive between calls.
    figure = Figure(figsize=(size_px[0] / dpi, size_px[1] / dpi), dpi=dpi)
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, cols, squeeze=False)
    return figure, axes


def _save(figure: Any, path: str | os.PathLike, dpi: int) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    # No bbox_inches="tight": the image keeps exactly the requested pixel size.
    figure.savefig(out, dpi=dpi, format="png")
    return out


def bar_layout(summary: Mapping[str, Any], metric: str) -> tuple[list[str], list[tuple[str, list[float], bool]]]:
    """What `plot_bars` draws: groups, and per method its label, values (NaN when missing) and hatching."""
    datasets = list(summary["datasets"])
    rows = summary["rows"]
    with_average = len(datasets) > 1 and any(row["average"] for row in rows.values())
    groups = datasets + (["Avg."] if with_average else [])
    methods = []
    for name, row in rows.items():
        values = [100.0 * row["results"][d][metric] if d in row["results"] else math.nan for d in datasets]
        if with_average:
            complete = all(d in row["results"] for d in datasets)
            values.append(100.0 * row["average"][metric] if complete and row["average"] else math.nan)
        label = f"{name} ({row['search']})" if row["search"] else name
        methods.append((label, values, row["kind"] == "simulator"))
    return groups, methods


def plot_bars(
    summary: Mapping[str, Any],
    path: str | os.PathLike,
    *,
    metric: str = "substring_em",
    size_px: tuple[int, int] = (1200, 600),
    dpi: int = 100,
    title: str = "",
) -> Path:
    """Grouped bars in percent, one group per dataset (and "Avg."), one bar per method; returns `path`."""
    groups, bars_by_method = bar_layout(summary, metric)
    figure, axes = _figure(size_px, dpi)
    ax = axes[0][0]
    width = 0.8 / max(1, len(bars_by_method))
    highest = 0.0
    for i, (label, values, simulated) in enumerate(bars_by_method):
        highest = max([highest, *(v for v in values if not math.isnan(v))])
        offsets = [g - 0.4 + width * (i + 0.5) for g in range(len(groups))]
        bars = ax.bar(
            offsets, values, width, label=label, hatch="//" if simulated else None, edgecolor="black", linewidth=0.5
        )
        ax.bar_label(bars, labels=["" if math.isnan(v) else f"{v:.1f}" for v in values], fontsize="x-small", padding=1)
    # Room above the bars for their labels and the legend; an all-zero table still gets an axis.
    ax.set_ylim(0.0, max(10.0, 1.25 * highest))
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(f"{metric} (%)")
    ax.set_title(title or f"{SCORE_TITLES.get(metric, metric)} per dataset")
    ax.legend(fontsize="small", loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    return _save(figure, path, dpi)


def _last(key: str) -> str:
    return key.rsplit("/", 1)[-1]


CURVE_PANELS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("Reward", lambda key: key == "reward/mean" or _last(key) == "reward"),
    ("EM / F1", lambda key: _last(key) in SCORE_METRICS),
    ("Searches per trajectory", lambda key: _last(key) == "calls_per_traj"),
    ("Response length (tokens)", lambda key: _last(key) == "response_len"),
    ("Curriculum: p_noise", lambda key: key == "curriculum/p_noise" or _last(key) == "noisy_share"),
)
"""Panels of the training curves and which metric keys go in each (matched on the key)."""


def curve_panels(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, tuple[list[int], list[float]]]]]:
    """(title, {key: (steps, values)}) for every panel of `CURVE_PANELS` with data, in order."""
    series: dict[str, tuple[list[int], list[float]]] = {}
    for row in rows:
        step = row.get("step")
        if step is None:
            continue
        for key, value in row.items():
            if key == "step" or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            if not math.isfinite(value):
                continue
            steps, values = series.setdefault(key, ([], []))
            steps.append(int(step))
            values.append(float(value))
    panels = []
    for title, match in CURVE_PANELS:
        chosen = {key: series[key] for key in sorted(series) if match(key)}
        if chosen:
            panels.append((title, chosen))
    return panels


def plot_training_curves(
    rows: Sequence[Mapping[str, Any]],
    path: str | os.PathLike,
    *,
    size_px: tuple[int, int] = (1500, 800),
    dpi: int = 100,
) -> Path:
    """Training curves of a run as a PNG; returns `path`, raises `ValueError` when nothing is plottable."""
    panels = curve_panels(rows)
    if not panels:
        raise ValueError(
            "the training run's metrics hold none of the plotted keys (reward/mean, .../em, .../f1, "
            ".../calls_per_traj, .../response_len, curriculum/p_noise); nothing to plot"
        )
    figure, axes = _figure(size_px, dpi, rows=2, cols=3)
    flat = [ax for line in axes for ax in line]
    for ax, (title, series) in zip(flat, panels):
        for key, (steps, values) in series.items():
            ax.plot(steps, values, label=key, linewidth=1.2)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    for ax in flat[len(panels) :]:
        ax.axis("off")
    figure.tight_layout()
    return _save(figure, path, dpi)
