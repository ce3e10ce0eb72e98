"""benchmarks/ablations.py: its pure parts by hand, and `--smoke` end to end (every arm for two steps)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from simsearch.tinyworld.world import build_world
from simsearch.types import Document, SearchRequest
from tests.benchmark_scripts import load_benchmark

ablations = load_benchmark("ablations")

KEYS = {
    "curriculum_exp", "curriculum_constant", "curriculum_none", "loop_simulator", "loop_bm25", "loop_none",
    "told_answer", "query_only", "leak_told_answer", "leak_query_only", "algo_reinforce", "algo_grpo", "algo_ppo",
    "ssrl_selfsearch", "ssrl_sim2real_bm25", "wall_s",
}  # fmt: skip  # the issue's keys


def test_constant_arm_takes_the_exponential_schedules_mean() -> None:
    # p_i = 0.25 (4^(i/m) - 1) / 3. m = 2: p_0 = 0, p_1 = 0.25 (2 - 1) / 3 = 0.083333; mean 0.041667.
    assert ablations.constant_p_noise(0.0, 0.25, 4.0, 2) == pytest.approx(0.25 / 6, abs=1e-12)
    # m = 4: 0, 0.25(sqrt2 - 1)/3 = 0.034518, 0.083333, 0.25(2sqrt2 - 1)/3 = 0.152369; mean 0.067555.
    assert ablations.constant_p_noise(0.0, 0.25, 4.0, 4) == pytest.approx(0.067555, abs=1e-6)


def test_question_without_name_keeps_every_other_word() -> None:
    assert ablations.question_without_name("In which year was the bakery of Ganlo founded?", "Ganlo") == (
        "In which year was the bakery of founded"
    )


class _Echo:
    """Writes the request's first gold answer when it is told it and the query is long, else nothing useful."""

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        return [
            [Document("t", r.golden_answers[0] if r.num_noisy == 0 and len(r.query.split()) > 1 else "nothing")]
            for r in requests
        ]


def test_answer_leakage_counts_sets_holding_the_answer() -> None:
    world = build_world(seed=0, n_entities=6, n_train_entities=4)
    leak = ablations.answer_leakage(_Echo(), world, n=4, top_k=3)
    # Every no-name query still has several words, so each set holds the answer; noisy sets never do.
    assert leak == {"no_name": 1.0, "noisy": 0.0}


def test_table_lines_give_mean_and_sd_over_seeds() -> None:
    results = {
        0: {"em": {"default": {"simulator": 10.0, "bm25": 40.0, "dense": 30.0}}, "leak": {}},
        1: {"em": {"default": {"simulator": 20.0, "bm25": 50.0, "dense": 30.0}}, "leak": {}},
    }
    question = ablations.QUESTIONS[3]  # algorithm: only GRPO (the default arm) was run
    lines = ablations.table_lines(question, results)
    # sd of (40, 50) = sqrt(50) = 7.07; of (10, 20) likewise.
    assert "| GRPO | 15.0 ± 7.1 | 45.0 ± 7.1 | 30.0 ± 0.0 |" in lines
    assert "| REINFORCE | - | - | - |" in lines


def test_write_doc_rewrites_the_tables_and_keeps_the_prose(tmp_path: Path) -> None:
    results = {0: {"em": {"default": {"simulator": 1.0, "bm25": 2.0, "dense": 3.0}}, "leak": {}}}
    figures = {"seeds": [0], "steps": 5, "smoke": False, "wall_s": 120.0}
    doc = tmp_path / "ablations.md"
    ablations.write_doc(doc, results, figures)
    doc.write_text(doc.read_text().replace("## 2. What is in the loop", "## 2. What is in the loop\n\nOur reading."))
    results[0]["em"]["default"]["bm25"] = 9.0
    ablations.write_doc(doc, results, figures)
    text = doc.read_text()
    assert "Our reading." in text and "Not measured yet" not in text and "2.0 min" in text
    assert "| fine-tuned simulator | 1.0 ± 0.0 | 9.0 ± 0.0 | 3.0 ± 0.0 |" in text
    assert sorted(p.name for p in (tmp_path / "ablations").iterdir()) == [
        f"{q.key}.png" for q in sorted(ablations.QUESTIONS, key=lambda q: q.key)
    ]


@pytest.mark.slow
def test_smoke_runs_every_arm_and_prints_every_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ablations.main(["--smoke", "--run-dir", str(tmp_path), "--threads", "1"])
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # the JSON is the last line
    assert set(figures) >= KEYS
    for key in KEYS - {"wall_s"}:
        assert 0.0 <= figures[key] <= 100.0, key
    assert figures["smoke"] is True and figures["steps"] == 2 and figures["wall_s"] > 0
    seed = tmp_path / "seed_0"
    for arm in [*ablations.ARMS, "knowing_base"]:
        summary = json.loads((seed / "eval" / arm / "summary.json").read_text())
        engines = (
            {"self", "simulator", "bm25", "dense", "none"}
            if arm in ("ssrl", "knowing_base")
            else {"simulator", "bm25", "dense", "none"}
        )
        assert set(summary["rows"]) == engines, arm
    for arm in ablations.ARMS:  # the same budget: two steps each
        rows = (seed / "train" / arm / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(r)["step"] for r in rows] == [1, 2], arm
    # The constant arm ran at the exponential schedule's mean over its two steps (hand value above).
    constant = (seed / "train" / "constant" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["curriculum/p_noise"] for r in constant] == pytest.approx([0.041667] * 2, abs=1e-6)
    # The doc and its charts went to the run directory, not to docs/.
    text = (tmp_path / "ablations.md").read_text()
    assert text.count("smoke: a pipeline check") == len(ablations.QUESTIONS)
    for question in ablations.QUESTIONS:
        with Image.open(tmp_path / "ablations" / f"{question.key}.png") as image:
            assert image.size == (1200, 600)
