"""`simsearch view`: the page of a small eval run, read in headless Chromium as a person would.

The eval run is real (`evaluate.main` with the scripted policy and simulator of test_evaluate,
a simulator and BM25 over the tiny world), so the page is checked on the rows eval writes. The
browser tests need the Debian `chromium` package and skip, saying so, where it is absent.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from simsearch import cli
from simsearch.commands import evaluate
from simsearch.errors import DataError
from simsearch.eval import view
from simsearch.simulator.engine import SimulatedSearchEngine
from simsearch.training.runlog import RunLogger
from tests.commands.test_evaluate import (  # noqa: F401  (fixtures)
    ScriptedPolicy,
    ScriptedSimulatorLM,
    _engines_via_build,
    _golds,
    _install_policy,
    _recipe,
    tokenizer,
    world,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and os.environ.get("SIMSEARCH_REQUIRE_CHROMIUM") == "1":  # CI: a failed install fails the run
    raise RuntimeError("SIMSEARCH_REQUIRE_CHROMIUM=1 but Chromium is not installed (Debian: apt-get install chromium)")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install -y chromium)"
)


@pytest.fixture
def eval_run(world, tokenizer, tmp_path, monkeypatch):  # noqa: F811
    """A finished eval run: 5 questions x {sim (noisy_share 0.5), bm25}, chunks of 2."""
    _, paths = world
    _install_policy(monkeypatch, ScriptedPolicy(tokenizer, _golds(paths, "test")), tokenizer)
    simulator = SimulatedSearchEngine(ScriptedSimulatorLM(), preset="zerosearch")
    _engines_via_build(monkeypatch, tmp_path, simulator=simulator)
    recipe = _recipe(
        tmp_path,
        paths,
        "engines.sim.kind=simulator",
        "engines.sim.simulator.preset=zerosearch",
        "engines.sim.simulator.chat=true",
        "engines.sim.simulator.generation.model.path=scripted",
        "engines.sim.gpu_hour_price=2.0",
        "noisy_share=0.5",
        "fidelity_size=0",
    )
    summary = evaluate.main(recipe)
    return tmp_path / "run", summary


def _rows(run: Path, method: str) -> list[dict]:
    return [json.loads(line) for line in (run / "examples" / method / "heldout.jsonl").read_text().splitlines()]


# --------------------------------------------------------------------------- cost of the eval run


def test_eval_counts_searches_and_writes_cost_table(eval_run):
    run, summary = eval_run
    cost = json.loads((run / "cost.json").read_text())["engines"]
    # The scripted policy searches once per question: 5 searches per engine, no cache.
    assert (cost["bm25"]["searches"], cost["bm25"]["queries_sent"], cost["bm25"]["cache_hits"]) == (5, 5, 0)
    assert cost["bm25"]["query_cost_usd"] == 0.0  # a local index is free
    assert cost["sim"]["searches"] == 5 and cost["sim"]["simulator_calls"] >= 3  # one call per turn of a chunk
    assert cost["sim"]["simulator_cost_usd"] == pytest.approx(cost["sim"]["simulator_s"] / 3600 * 2.0)
    assert cost["sim"]["prompt_tokens_complete"] is False  # chat strings, no tokenizer: not counted
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5, 6]  # 2 engines x 3 chunks (2 + 2 + 1 questions)
    assert sum(row["search/bm25/searches"] for row in rows) == 5
    table = (run / "table.md").read_text()
    assert "## Search cost and latency" in table
    assert re.search(r"^\| sim \| simulator \| 5 \| 0 \| 5 \|", table, re.M)
    assert summary["cost"]["bm25"]["searches"] == 5


# --------------------------------------------------------------------------- page data


def test_page_data_pairs_engines_per_question_and_marks_noisy(eval_run):
    run, _ = eval_run
    data = view.page_data(run)
    assert data["kind"] == "eval" and data["columns"] == ["bm25", "sim"]  # the recipe's order
    assert len(data["items"]) == 5
    first = data["items"][0]
    assert first["question"] == _rows(run, "bm25")[0]["question"]
    assert set(first["runs"]) == {"sim", "bm25"}
    noisy_rows = [d["noisy"] for row in _rows(run, "sim") for t in row["samples"][0]["turns"] for d in t["documents"]]
    shown = [
        d["noisy"] for item in data["items"] for t in item["runs"]["sim"]["samples"][0]["turns"] for d in t["documents"]
    ]
    assert shown == noisy_rows and any(noisy_rows) and not all(noisy_rows)  # noisy_share 0.5: some of each


def test_page_is_self_contained_and_escapes_data(tmp_path):
    run = tmp_path / "run"
    row = {
        "id": "x1", "question": "Who wrote </script><script>alert(1)</script>?", "golden_answers": ["me"],
        "scores": {"substring_em": 1.0, "em": 1.0, "f1": 1.0},
        "samples": [{"answer": "me", "num_searches": 0, "finish": "answer", "turns": [],
                     "scores": {"substring_em": 1.0, "em": 1.0, "f1": 1.0}}],
    }  # fmt: skip
    (run / "examples" / "bm25").mkdir(parents=True)
    (run / "examples" / "bm25" / "d.jsonl").write_text(json.dumps(row) + "\n")
    page = view.write_page(run).read_text()
    assert "<script>alert" not in page  # the data cannot close its script element
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing fetched from a network
    assert "@import" not in page and "url(" not in page


def test_no_rows_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="trajectory_samples"):
        view.page_data(tmp_path)


def test_train_page_groups_rollouts_per_step(tmp_path):
    logger = RunLogger(tmp_path)
    for step, query in ((1, "first try"), (11, "better query")):
        rows = [
            {"id": "q7", "question": "Where is X?", "golden_answers": ["Paris"], "group": 0, "sample": s,
             "reward": float(s), "p_noise": 0.1, "answer": "Paris" if s else "Rome", "num_searches": 1,
             "finish": "answer", "scores": {"substring_em": float(s)},
             "turns": [{"text": "<search> " + query + " </search>", "action": "search", "query": query,
                        "executed": True, "num_noisy": 0, "documents": [{"title": "X", "text": "in Paris"}]}]}
            for s in (0, 1)
        ]  # fmt: skip
        logger.log_trajectories(step, rows)
    logger.close()
    data = view.page_data(tmp_path)
    assert data["kind"] == "train" and data["columns"] == ["rollout 1", "rollout 2"]
    assert [item["dataset"] for item in data["items"]] == ["step 1", "step 11"]
    assert data["items"][1]["runs"]["rollout 2"]["samples"][0]["turns"][0]["query"] == "better query"
    # A resumed run cuts sampled trajectories after its checkpoint, like its metrics.
    RunLogger(tmp_path, resume_step=5).close()
    assert [item["dataset"] for item in view.page_data(tmp_path)["items"]] == ["step 1"]


def test_cli_view_writes_the_page(eval_run, capsys):
    run, _ = eval_run
    assert cli.main(["view", str(run)]) == 0
    assert (run / "view.html").is_file() and "view.html" in capsys.readouterr().out
    assert cli.main(["view", str(run / "missing")]) == 2


# --------------------------------------------------------------------------- in a browser


def _chromium(*args: str) -> str:
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-extensions", "--run-all-compositor-stages-before-draw",
               "--virtual-time-budget=5000", *args]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


def _visible_text(dom: str) -> str:
    """The text of the rendered body, without the embedded JSON and script (what a person reads)."""
    body = re.sub(r"<script\b.*?</script>", "", dom, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


@needs_chromium
def test_page_in_chromium_shows_question_both_engines_documents_and_answer(eval_run, tmp_path):
    run, _ = eval_run
    page = view.write_page(run)
    dom = _chromium("--dump-dom", page.as_uri())
    text = _visible_text(dom)
    first_sim, first_bm25 = _rows(run, "sim")[0], _rows(run, "bm25")[0]
    assert first_bm25["question"] in text
    for gold in first_bm25["golden_answers"]:
        assert gold in text
    assert first_bm25["samples"][0]["answer"] in text
    bm25_docs = [d for t in first_bm25["samples"][0]["turns"] for d in t["documents"]]
    sim_docs = [d for t in first_sim["samples"][0]["turns"] for d in t["documents"]]
    assert bm25_docs and sim_docs
    assert all(" ".join(d["text"].split()) in " ".join(text.split()) for d in bm25_docs + sim_docs)
    assert 'data-column="sim"' in dom and 'data-column="bm25"' in dom
    assert "5 of 5 questions" in text

    shot = tmp_path / "view.png"
    _chromium("--window-size=1400,900", f"--screenshot={shot}", page.as_uri())
    image = Image.open(shot).convert("RGB")
    assert image.size == (1400, 900)
    assert len(set(image.getdata())) > 20  # something was drawn, not a blank page


@needs_chromium
def test_filters_work_when_clicked(eval_run, tmp_path):
    run, _ = eval_run
    page = view.write_page(run)
    rows = _rows(run, "bm25")
    wrong = [r["question"] for r in rows if r["scores"]["substring_em"] < 1]
    assert wrong and len(wrong) < len(rows)
    # The page as shipped, plus a script that does what a person does: pick "wrong" in the
    # Answer filter and "bm25" in the Engine filter, then click the last question of the list.
    clicks = """<script>
      const pick = (id, value) => { const s = document.getElementById(id); s.value = value;
        s.dispatchEvent(new Event("change")); };
      pick("f-engine", "bm25"); pick("f-correct", "wrong");
      const items = document.querySelectorAll("#list .item"); items[items.length - 1].click();
      document.body.setAttribute("data-hash", location.hash);
    </script></body>"""
    scripted = tmp_path / "clicked.html"
    scripted.write_text(page.read_text().replace("</body>", clicks))
    dom = _chromium("--dump-dom", scripted.as_uri())
    listed = re.findall(r'<div class="item(?: active)?" data-key="[^"]*"><span class="q">(.*?)</span>', dom)
    assert [html.unescape(q) for q in listed] == wrong
    assert f"{len(wrong)} of 5 questions" in dom
    detail = dom[dom.index('id="detail"') :]
    assert html.unescape(re.search(r'<p class="question">(.*?)</p>', detail).group(1)) == wrong[-1]
    assert 'data-column="bm25"' in detail and 'data-column="sim"' not in detail  # one engine shown
    hash_ = re.search(r'data-hash="([^"]*)"', dom).group(1)
    assert "engine=bm25" in hash_ and "correct=wrong" in hash_
    # The same view from a link: the fragment restores the filters.
    linked = _chromium("--dump-dom", page.as_uri() + "#engine=bm25&correct=wrong")
    assert f"{len(wrong)} of 5 questions" in linked
