"""A run's trajectories as one self-contained HTML page (`simsearch view RUN_DIR`).

Reads what runs already write, and nothing else:

- an eval run: `examples/{method}/{dataset}.jsonl` (`simsearch.eval.report`'s per-example rows):
  one item per (dataset, question), one column per method (engines and baselines);
- a train run: `trajectories.jsonl` (`simsearch.training.runlog`): one item per (step, question group),
  one column per sampled rollout of the group, so queries can be compared across steps; above them a
  run panel, from `metrics.jsonl` and `health.jsonl` (`simsearch.training.health`): one small chart per
  training-health signal (`RUN_SIGNALS`) with the monitor's alarms marked, and a table of the alarms.

The page holds its data as JSON inside a `<script type="application/json">` element and its own
script and style: no network, no external scripts or fonts. The script builds the DOM with
`textContent` only, so nothing from a trajectory is ever parsed as HTML. Filters (dataset or
step, engine, correct / wrong, number of searches, text) and the open question live in the
URL's fragment (`#dataset=nq&engine=bm25&correct=wrong&searches=1&item=3`), so a view can be
linked to. "Correct" is substring EM (ZeroSearch's "EM") of the row's pass@n score, or of the
sample's score for a training rollout. Documents the simulator was asked to make noisy carry
`noisy` (`types.Document`) and are marked.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from simsearch.errors import DataError
from simsearch.eval.report import read_rows

EXAMPLES_DIR = "examples"
TRAJECTORIES_FILE = "trajectories.jsonl"
METRICS_FILE = "metrics.jsonl"  # simsearch.training.runlog's per-step metrics
HEALTH_FILE = "health.jsonl"  # simsearch.training.health's alarms (and rollbacks), written by `simsearch train`
PAGE_FILE = "view.html"
CORRECT_METRIC = "substring_em"
RUN_SIGNALS = (
    "reward/mean",
    "health/entropy",
    "health/search_share",
    "rollout/answer_rate",
    "health/repeat_ngram_share",
    "health/group_reward_std",
    "health/ratio_mean",
    "losses/kl",
    "optim/grad_norm",
)
"""The metrics the run panel of a train run's page charts, in its order (docs/health.md)."""


def _documents(documents: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "title": doc.get("title", ""),
            "text": doc.get("text", ""),
            "source": doc.get("source", ""),
            "noisy": bool(doc.get("noisy", False)),
            "score": doc.get("score"),
        }
        for doc in documents
    ]


def _turn(turn: Mapping[str, Any]) -> dict[str, Any]:
    """A turn's fields the page shows; a tool-call turn's `calls` pair each query with its results."""
    results = turn.get("call_documents", [])
    return {
        "text": turn.get("text", ""),
        "action": turn.get("action", ""),
        "query": turn.get("query", ""),
        "executed": bool(turn.get("executed", False)),
        "num_noisy": int(turn.get("num_noisy", 0)),
        "documents": _documents(turn.get("documents", [])),
        "calls": [
            {"query": query, "documents": _documents(results[i] if i < len(results) else [])}
            for i, query in enumerate(turn.get("call_queries", []))
        ],
        "reasons": list(turn.get("call_reasons", [])),
    }


def _sample(sample: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a sample the page shows."""
    return {
        "answer": sample.get("answer"),
        "finish": sample.get("finish", ""),
        "num_searches": int(sample.get("num_searches", 0)),
        "scores": dict(sample.get("scores", {})),
        "reward": sample.get("reward"),
        "turns": [_turn(turn) for turn in sample.get("turns", [])],
    }


def eval_page_data(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The page data of an eval run: one item per (dataset, question), one column per method.

    Methods keep the order of the recipe's engines when `summary.json` is there (baselines
    first), else alphabetical; questions keep their file order.

    Raises:
        DataError: no per-example rows under `examples/`.
    """
    root = Path(run_dir) / EXAMPLES_DIR
    methods = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    summary_path = Path(run_dir) / "summary.json"
    if summary_path.is_file():
        ordered = list(json.loads(summary_path.read_text(encoding="utf-8")).get("rows", {}))
        methods = [m for m in ordered if m in methods] + [m for m in methods if m not in ordered]
    items: dict[tuple[str, str], dict[str, Any]] = {}
    for method in methods:
        for path in sorted((root / method).glob("*.jsonl")):
            dataset = path.stem
            for row in read_rows(path):
                item = items.setdefault(
                    (dataset, str(row["id"])),
                    {
                        "dataset": dataset,
                        "id": str(row["id"]),
                        "question": row["question"],
                        "golds": list(row["golden_answers"]),
                        "runs": {},
                    },
                )
                samples = [_sample(s) for s in row["samples"]]
                if "retrieval" in row and samples:  # RAG: its one retrieval, shown as a search turn
                    retrieval = _sample({"turns": [{**row["retrieval"], "action": "search", "executed": True}]})
                    samples[0]["turns"] = retrieval["turns"] + samples[0]["turns"]
                item["runs"][method] = {"scores": dict(row["scores"]), "samples": samples}
    if not items:
        raise DataError(f"{root}: no per-example rows; run `simsearch eval` with this run_dir first")
    title = f"Evaluation: {Path(run_dir).name}"
    return {"kind": "eval", "title": title, "columns": methods, "items": list(items.values())}


def train_page_data(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The page data of a train run: one item per (step, question group), one column per rollout.

    Raises:
        DataError: no `trajectories.jsonl` rows.
    """
    rows = read_rows(Path(run_dir) / TRAJECTORIES_FILE)
    if not rows:
        raise DataError(
            f"{Path(run_dir) / TRAJECTORIES_FILE}: no sampled trajectories; train with trajectory_samples > 0"
        )
    items: dict[tuple[int, int, str], dict[str, Any]] = {}
    columns: list[str] = []
    for row in rows:
        step = int(row["step"])
        key = (step, int(row.get("group", 0)), str(row["id"]))
        item = items.setdefault(
            key,
            {
                "dataset": f"step {step}",
                "id": str(row["id"]),
                "question": row["question"],
                "golds": list(row["golden_answers"]),
                "note": f"p_noise {row['p_noise']:.3f}" if "p_noise" in row else "",
                "runs": {},
            },
        )
        column = f"rollout {int(row.get('sample', len(item['runs']))) + 1}"
        if column not in columns:
            columns.append(column)
        sample = _sample(row)
        item["runs"][column] = {"scores": sample["scores"], "samples": [sample]}
    columns.sort(key=lambda c: int(c.split()[-1]))
    ordered = [items[k] for k in sorted(items)]
    data: dict[str, Any] = {
        "kind": "train",
        "title": f"Training: {Path(run_dir).name}",
        "columns": columns,
        "items": ordered,
    }
    run = run_panel_data(run_dir)
    if run is not None:
        data["run"] = run
    return data


def _json_objects(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, one a line ([] when the file does not exist).

    A last line without its newline that does not parse (a run still writing it) is left out.

    Raises:
        DataError: any other line that is not a JSON object, naming the file and the line.
    """
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    rows = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if lineno == len(lines):  # no newline after it: still being written
                break
            row = None
        if not isinstance(row, dict):
            raise DataError(f"{path}: line {lineno} is not a JSON object; fix or delete that line")
        rows.append(row)
    return rows


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def run_panel_data(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The run panel of a train run's page; None when it has no `metrics.jsonl` rows (no panel).

    Returns:
        `signals`: each key of `RUN_SIGNALS` that some row holds a number for -> `[[step, value], ...]`
        in file order (rows with null, a non-finite value, leave a gap); `alarms`: the objects of
        `health.jsonl` in file order (alarms with `rule`, `signal`, `value`, `threshold`, `action`, and
        rollbacks with `action` "rolled_back"), [] without the file.

    Raises:
        DataError: a line of either file that is not a JSON object.
    """
    rows = [row for row in _json_objects(Path(run_dir) / METRICS_FILE) if _number(row.get("step"))]
    if not rows:
        return None
    signals = {}
    for key in RUN_SIGNALS:
        points = [[row["step"], row[key]] for row in rows if _number(row.get(key))]
        if points:
            signals[key] = points
    return {"signals": signals, "alarms": _json_objects(Path(run_dir) / HEALTH_FILE)}


def page_data(run_dir: str | os.PathLike) -> dict[str, Any]:
    """`eval_page_data` when the run has `examples/`, else `train_page_data`."""
    if (Path(run_dir) / EXAMPLES_DIR).is_dir():
        return eval_page_data(run_dir)
    return train_page_data(run_dir)


def _json_for_script(data: Any) -> str:
    # Inside <script>, "</" could close the element and "<!--" open a comment: escape "<".
    return json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")


def render_page(data: Mapping[str, Any]) -> str:
    """The whole HTML page for `page_data`'s result."""
    title = str(data["title"]).replace("&", "&amp;").replace("<", "&lt;")
    return (
        PAGE_TEMPLATE.replace("__TITLE__", title)
        .replace("__STYLE__", STYLE)
        .replace("__DATA__", _json_for_script(data))
        .replace("__SCRIPT__", SCRIPT)
    )


def write_page(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Writes the run's page (default `RUN_DIR/view.html`) and returns its path."""
    path = Path(out) if out else Path(run_dir) / PAGE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_page(page_data(run_dir)), encoding="utf-8")
    return path


PAGE_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>__STYLE__</style>
</head>
<body>
<header>
  <h1 id="title">__TITLE__</h1>
  <div id="filters">
    <label><span id="dataset-label">Dataset</span> <select id="f-dataset"></select></label>
    <label>Engine <select id="f-engine"></select></label>
    <label>Answer <select id="f-correct">
      <option value="any">any</option>
      <option value="correct">correct</option>
      <option value="wrong">wrong</option>
      <option value="differ">engines differ</option>
    </select></label>
    <label>Searches <select id="f-searches">
      <option value="any">any</option><option value="0">0</option><option value="1">1</option>
      <option value="2">2</option><option value="3">3 or more</option>
    </select></label>
    <label>Find <input id="f-text" type="search" placeholder="words of the question"></label>
    <span id="count"></span>
  </div>
</header>
<section id="run" hidden aria-label="training health"></section>
<main>
  <nav id="list" aria-label="questions"></nav>
  <section id="detail"></section>
</main>
<script type="application/json" id="data">__DATA__</script>
<script>__SCRIPT__</script>
</body>
</html>
"""

STYLE = """
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2329;
  background: #f4f6f8; }
header { position: sticky; top: 0; z-index: 2; background: #fff; border-bottom: 1px solid #d5dbe1;
  padding: 8px 16px; }
h1 { font-size: 17px; margin: 0 0 6px; }
#filters { display: flex; flex-wrap: wrap; gap: 14px; align-items: center; }
#filters label { color: #4a5561; }
select, input { font: inherit; padding: 2px 4px; }
#count { color: #4a5561; margin-left: auto; }
main { display: grid; grid-template-columns: 330px 1fr; height: calc(100vh - 78px); }
#list { overflow-y: auto; border-right: 1px solid #d5dbe1; background: #fff; }
.item { padding: 7px 12px; border-bottom: 1px solid #eef1f4; cursor: pointer; }
.item:hover { background: #f0f5fb; }
.item.active { background: #dcEAF8; }
.item .q { display: block; }
.item .meta { font-size: 12px; color: #5d6873; }
.badge { display: inline-block; padding: 0 5px; margin: 2px 3px 0 0; border-radius: 3px; font-size: 11px; }
.ok { background: #d9f2df; color: #175c2a; }
.bad { background: #f8dcdc; color: #8a1f1f; }
#detail { overflow-y: auto; padding: 14px 18px; }
.question { font-size: 16px; font-weight: 600; margin: 0 0 4px; }
.golds { margin: 0 0 12px; color: #33404c; }
.columns { display: grid; gap: 12px; align-items: start; }
.column { background: #fff; border: 1px solid #d5dbe1; border-radius: 6px; padding: 10px; min-width: 0; }
.column h2 { font-size: 15px; margin: 0 0 6px; }
.answer { margin: 4px 0 8px; padding: 6px 8px; border-radius: 4px; }
.scores { font-size: 12px; color: #4a5561; }
.turn { border-top: 1px dashed #d5dbe1; padding: 6px 0; }
.turn .label { font-size: 11px; text-transform: uppercase; letter-spacing: .04em; color: #6b7682; }
.reasoning { white-space: pre-wrap; color: #33404c; }
.query { font-family: ui-monospace, Menlo, Consolas, monospace; background: #eef3f8; padding: 1px 4px;
  border-radius: 3px; }
.docs { margin: 4px 0 0; padding-left: 20px; }
.doc { margin: 3px 0; }
.doc .title { font-weight: 600; }
.doc.noisy { background: #fff3d6; }
.noisy-tag { font-size: 11px; background: #f0b429; color: #3d2a00; border-radius: 3px; padding: 0 4px;
  margin-left: 4px; }
.sample + .sample { margin-top: 10px; border-top: 2px solid #d5dbe1; padding-top: 8px; }
.empty { color: #6b7682; padding: 16px; }
#run { background: #fff; border-bottom: 1px solid #d5dbe1; padding: 6px 16px 10px; }
#run summary { font-weight: 600; cursor: pointer; }
.charts { display: flex; flex-wrap: wrap; gap: 8px; margin: 6px 0; }
.chart { margin: 0; border: 1px solid #e3e8ed; border-radius: 4px; padding: 2px 4px; }
.chart figcaption { font-size: 12px; color: #33404c; }
.chart svg { display: block; }
.chart text { font-size: 10px; fill: #5d6873; }
.chart .axis { fill: none; stroke: #c5ccd3; }
.chart .series { fill: none; stroke: #2b6cb0; stroke-width: 1.5; }
.chart .dot { fill: #2b6cb0; }
.chart .alarm-line { stroke: #c53030; stroke-dasharray: 3 2; }
.chart text.alarm-label { fill: #c53030; }
table.alarms { border-collapse: collapse; font-size: 12px; margin-top: 4px; }
table.alarms th, table.alarms td { padding: 2px 10px 2px 0; border-bottom: 1px solid #eef1f4; text-align: left; }
.run-note { color: #6b7682; font-size: 12px; margin: 4px 0; }
"""

SCRIPT = r"""
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const COLUMNS = DATA.columns;
const $ = (id) => document.getElementById(id);
const CORRECT = "substring_em";

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}
function option(select, value, label) {
  const o = el("option", null, label); o.value = value; select.appendChild(o);
}
function correct(run) { return run && run.scores && run.scores[CORRECT] >= 1; }
function searches(run) { return run ? run.samples[0].num_searches : 0; }

function readHash() {
  const state = {dataset: "all", engine: "all", correct: "any", searches: "any", text: "", item: ""};
  for (const part of location.hash.replace(/^#/, "").split("&")) {
    const [k, v] = part.split("=");
    if (k in state && v !== undefined) state[k] = decodeURIComponent(v);
  }
  return state;
}
function writeHash(state) {
  const parts = Object.entries(state).filter(([k, v]) => v !== "" && v !== "any" && v !== "all")
    .map(([k, v]) => k + "=" + encodeURIComponent(v));
  history.replaceState(null, "", "#" + parts.join("&"));
}

let state = readHash();

function setup() {
  $("dataset-label").textContent = DATA.kind === "train" ? "Step" : "Dataset";
  const datasets = [...new Set(DATA.items.map((i) => i.dataset))];
  option($("f-dataset"), "all", DATA.kind === "train" ? "all steps" : "all datasets");
  datasets.forEach((d) => option($("f-dataset"), d, d));
  option($("f-engine"), "all", DATA.kind === "train" ? "all rollouts" : "all engines");
  COLUMNS.forEach((c) => option($("f-engine"), c, c));
  for (const key of ["dataset", "engine", "correct", "searches"]) {
    $("f-" + key).addEventListener("change", (e) => { state[key] = e.target.value; state.item = ""; update(); });
  }
  $("f-text").addEventListener("input", (e) => { state.text = e.target.value; update(); });
  syncControls();
}
function syncControls() {
  for (const key of ["dataset", "engine", "correct", "searches"]) $("f-" + key).value = state[key];
  $("f-text").value = state.text;
}

function keep(item) {
  if (state.dataset !== "all" && item.dataset !== state.dataset) return false;
  if (state.text && !item.question.toLowerCase().includes(state.text.toLowerCase())) return false;
  const cols = state.engine === "all" ? COLUMNS.filter((c) => item.runs[c]) : [state.engine];
  const runs = cols.map((c) => item.runs[c]).filter((r) => r);
  if (!runs.length) return false;
  if (state.correct === "correct" && !runs.every(correct)) return false;
  if (state.correct === "wrong" && !runs.every((r) => !correct(r))) return false;
  if (state.correct === "differ" && new Set(runs.map(correct)).size < 2) return false;
  if (state.searches !== "any") {
    const want = Number(state.searches);
    const match = (r) => (want >= 3 ? searches(r) >= 3 : searches(r) === want);
    if (!runs.some(match)) return false;
  }
  return true;
}

function itemKey(item) { return item.dataset + "/" + item.id; }

function renderList(shown) {
  const list = $("list");
  list.replaceChildren();
  $("count").textContent = shown.length + " of " + DATA.items.length + " questions";
  if (!shown.length) { list.appendChild(el("div", "empty", "No question matches these filters.")); return; }
  for (const item of shown) {
    const row = el("div", "item");
    row.dataset.key = itemKey(item);
    if (itemKey(item) === state.item) row.classList.add("active");
    row.appendChild(el("span", "q", item.question));
    const meta = el("div", "meta", item.dataset + " · " + item.id + " ");
    for (const c of COLUMNS) {
      const run = item.runs[c];
      if (!run) continue;
      meta.appendChild(el("span", "badge " + (correct(run) ? "ok" : "bad"),
        c + " " + (correct(run) ? "✓" : "✗") + " " + searches(run) + "s"));
    }
    row.appendChild(meta);
    row.addEventListener("click", () => { state.item = itemKey(item); update(); });
    list.appendChild(row);
  }
}

function reasoning(text) {
  const thinks = [...text.matchAll(/<think>([\s\S]*?)(<\/think>|$)/g)].map((m) => m[1].trim());
  if (thinks.length) return thinks.join("\n");
  return text.replace(/<search>[\s\S]*?(<\/search>|$)|<answer>[\s\S]*?(<\/answer>|$)/g, "")
    .replace(/<tool_call>[\s\S]*?(<\/tool_call>|$)/g, "").trim();
}

function renderSearch(box, executed, query, documents, noisy) {
  const line = el("div", null);
  line.appendChild(el("span", "label", executed ? "search " : "search (not run) "));
  line.appendChild(el("span", "query", query));
  if (noisy) line.appendChild(el("span", "noisy-tag", noisy + " asked noisy"));
  box.appendChild(line);
  if (documents.length) {
    const docs = el("ol", "docs");
    for (const doc of documents) {
      const li = el("li", "doc" + (doc.noisy ? " noisy" : ""));
      if (doc.title) li.appendChild(el("span", "title", doc.title + " "));
      li.appendChild(el("span", "text", doc.text));
      if (doc.noisy) li.appendChild(el("span", "noisy-tag", "noisy"));
      docs.appendChild(li);
    }
    box.appendChild(docs);
  }
}

function renderTurn(turn) {
  const box = el("div", "turn");
  const thought = reasoning(turn.text || "");
  if (thought) {
    box.appendChild(el("div", "label", "reasoning"));
    box.appendChild(el("div", "reasoning", thought));
  }
  if (turn.calls.length) {  // the tool-call protocol: each call with the tool message it got back
    turn.calls.forEach((c, i) => renderSearch(box, turn.executed, "tool call " + (i + 1) + ": " + c.query,
      c.documents, i === 0 ? turn.num_noisy : 0));
  } else if (turn.action === "search" || turn.query) {
    renderSearch(box, turn.executed, turn.query, turn.documents, turn.num_noisy);
  } else if (turn.action === "invalid") {
    box.appendChild(el("div", "label", "invalid action"));
  }
  for (const reason of turn.reasons) box.appendChild(el("div", "label", "unreadable: " + reason));
  return box;
}

function renderSample(sample) {
  const box = el("div", "sample");
  const ok = sample.scores && sample.scores[CORRECT] >= 1;
  const answer = el("div", "answer " + (ok ? "ok" : "bad"));
  answer.appendChild(el("span", "label", "answer "));
  answer.appendChild(el("strong", "answer-text", sample.answer === null ? "(none)" : sample.answer));
  box.appendChild(answer);
  const s = sample.scores || {};
  const parts = ["substring_em", "em", "f1"].filter((k) => k in s).map((k) => k + " " + Number(s[k]).toFixed(2));
  if (sample.reward !== null && sample.reward !== undefined) parts.push("reward " + Number(sample.reward).toFixed(3));
  parts.push(sample.num_searches + (sample.num_searches === 1 ? " search" : " searches"), "finish: " + sample.finish);
  box.appendChild(el("div", "scores", parts.join(" · ")));
  sample.turns.forEach((t) => box.appendChild(renderTurn(t)));
  return box;
}

function renderDetail(item) {
  const detail = $("detail");
  detail.replaceChildren();
  if (!item) { detail.appendChild(el("div", "empty", "Pick a question on the left.")); return; }
  detail.appendChild(el("p", "question", item.question));
  detail.appendChild(el("p", "golds", "Gold answers: " + item.golds.join(" | ") +
    "  ·  " + item.dataset + (item.note ? " · " + item.note : "")));
  const cols = (state.engine === "all" ? COLUMNS : [state.engine]).filter((c) => item.runs[c]);
  const grid = el("div", "columns");
  grid.style.gridTemplateColumns = "repeat(" + Math.max(1, cols.length) + ", minmax(0, 1fr))";
  for (const c of cols) {
    const column = el("div", "column");
    column.dataset.column = c;
    column.appendChild(el("h2", null, c));
    item.runs[c].samples.forEach((s) => column.appendChild(renderSample(s)));
    grid.appendChild(column);
  }
  detail.appendChild(grid);
}

function update() {
  const shown = DATA.items.filter(keep);
  if (!shown.some((i) => itemKey(i) === state.item)) state.item = shown.length ? itemKey(shown[0]) : "";
  renderList(shown);
  renderDetail(shown.find((i) => itemKey(i) === state.item));
  writeHash(state);
}

// The run panel of a train run: one line chart per signal (inline SVG), alarms marked and tabled.
const SVG_NS = "http://www.w3.org/2000/svg";
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}
function fmt(v) {
  if (typeof v === "number") return String(Number(v.toPrecision(4)));
  return v === undefined || v === null ? "" : String(v);
}
function span(lo, hi) { return lo === hi ? [lo - (Math.abs(lo) || 1) / 2, hi + (Math.abs(hi) || 1) / 2] : [lo, hi]; }

function chart(key, points, alarms) {
  const W = 250, H = 104, L = 40, R = 8, T = 6, B = 16;
  const steps = points.map((p) => p[0]), values = points.map((p) => p[1]);
  const marked = alarms.map((a) => a.step);
  const [x0, x1] = span(Math.min(...steps, ...marked), Math.max(...steps, ...marked));
  const [y0, y1] = span(Math.min(...values), Math.max(...values));
  const x = (s) => L + (s - x0) / (x1 - x0) * (W - L - R);
  const y = (v) => T + (y1 - v) / (y1 - y0) * (H - T - B);
  const box = el("figure", "chart");
  box.dataset.signal = key;
  box.appendChild(el("figcaption", null, key + " · last " + fmt(values[values.length - 1])));
  const g = svg("svg", {width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": key});
  g.appendChild(svg("path", {class: "axis", d: `M${L} ${T}V${H - B}H${W - R}`}));
  g.appendChild(svg("text", {x: L - 3, y: T + 8, "text-anchor": "end"}, fmt(y1)));
  g.appendChild(svg("text", {x: L - 3, y: H - B, "text-anchor": "end"}, fmt(y0)));
  g.appendChild(svg("text", {x: L, y: H - 3}, "step " + fmt(steps[0])));
  g.appendChild(svg("text", {x: W - R, y: H - 3, "text-anchor": "end"}, fmt(steps[steps.length - 1])));
  if (points.length === 1) g.appendChild(svg("circle", {class: "dot", cx: x(steps[0]), cy: y(values[0]), r: 2.5}));
  else g.appendChild(svg("polyline", {class: "series", points: points.map((p) => x(p[0]) + "," + y(p[1])).join(" ")}));
  alarms.forEach((a, i) => {
    const ax = x(a.step), left = ax > (L + W) / 2;
    const mark = svg("g", {class: "alarm", "data-rule": a.rule});
    mark.appendChild(svg("title", null, a.line || ("step " + a.step + ": " + a.rule)));
    mark.appendChild(svg("line", {class: "alarm-line", x1: ax, x2: ax, y1: T, y2: H - B}));
    mark.appendChild(svg("text", {class: "alarm-label", x: ax + (left ? -3 : 3), y: T + 10 + 11 * (i % 5),
      "text-anchor": left ? "end" : "start"}, fmt(a.step) + " " + a.rule));
    g.appendChild(mark);
  });
  box.appendChild(g);
  return box;
}

function alarmTable(alarms) {
  const table = el("table", "alarms");
  const head = el("tr");
  ["step", "rule", "signal", "value", "threshold", "action"].forEach((h) => head.appendChild(el("th", null, h)));
  table.appendChild(head);
  for (const a of alarms) {
    const row = el("tr", "alarm-row");
    if (a.line) row.title = a.line;
    const action = a.action === "rolled_back"
      ? "rolled back to step " + fmt(a.to_step) + ", lr x" + fmt(a.lr_scale) : fmt(a.action);
    const threshold = (a.relation ? a.relation + " " : "") + fmt(a.threshold);
    [fmt(a.step), fmt(a.rule), fmt(a.signal), fmt(a.value), threshold, action]
      .forEach((c) => row.appendChild(el("td", null, c)));
    table.appendChild(row);
  }
  return table;
}

function renderRun() {
  const run = DATA.run;
  if (!run) return;
  const keys = Object.keys(run.signals), fired = run.alarms.filter((a) => a.rule);
  const panel = el("details");
  panel.open = true;
  panel.appendChild(el("summary", null, "Training health: " + keys.length + " signals, " + fired.length +
    (fired.length === 1 ? " alarm" : " alarms") + " (docs/health.md)"));
  const charts = el("div", "charts");
  keys.forEach((k) => charts.appendChild(chart(k, run.signals[k], fired.filter((a) => a.signal === k))));
  if (!keys.length) panel.appendChild(el("p", "run-note", "metrics.jsonl holds none of the health signals."));
  panel.appendChild(charts);
  if (run.alarms.length) panel.appendChild(alarmTable(run.alarms));
  else panel.appendChild(el("p", "run-note", "No alarms recorded (health.jsonl)."));
  $("run").appendChild(panel);
  $("run").hidden = false;
}

renderRun();
setup();
update();
window.addEventListener("hashchange", () => { state = readHash(); syncControls(); update(); });
"""
