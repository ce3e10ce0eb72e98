"""Report building blocks: per-example rows, summaries, tables and plots, on hand-worked data."""

from __future__ import annotations

import csv
import json
import math

import pytest
from PIL import Image

from simsearch.config import EvalRecipe, load_recipe
from simsearch.errors import DataError, RecipeError
from simsearch.eval import report
from simsearch.eval.metrics import NORMALIZATIONS
from simsearch.types import Document, QAExample, Trajectory, Turn


def _sample(answer, searches, invalid, tokens):
    return {"answer": answer, "num_searches": searches, "num_invalid": invalid, "policy_tokens": tokens}


def _row(id_, sub, em, f1, samples, wall_s):
    return {"id": id_, "scores": {"substring_em": sub, "em": em, "f1": f1}, "samples": samples, "wall_s": wall_s}


ROWS = [
    _row("a", 1.0, 1.0, 1.0, [_sample("x", 2, 0, 10)], 0.5),
    _row("b", 1.0, 0.0, 0.5, [_sample(None, 0, 1, 4)], 0.25),
    _row("c", 0.0, 0.0, 0.0, [_sample("y", 1, 2, 7), _sample(None, 3, 0, 5)], 0.25),
]


def test_summarize_hand_computed() -> None:
    got = report.summarize(ROWS)
    # scores: means over the 3 questions; behaviour: means over the 4 samples
    assert got == pytest.approx(
        {
            "questions": 3.0,
            "samples": 4.0,
            "substring_em": 2 / 3,  # (1 + 1 + 0) / 3
            "em": 1 / 3,  # (1 + 0 + 0) / 3
            "f1": 0.5,  # (1 + 0.5 + 0) / 3
            "answer_rate": 0.5,  # x, None, y, None
            "searches_per_question": 1.5,  # (2 + 0 + 1 + 3) / 4
            "invalid_actions": 0.75,  # (0 + 1 + 2 + 0) / 4
            "tokens_per_question": 6.5,  # (10 + 4 + 7 + 5) / 4
            "wall_s": 1.0,  # 0.5 + 0.25 + 0.25
        },
        abs=1e-12,
    )
    with pytest.raises(ValueError, match="at least one"):
        report.summarize([])


def test_average_is_unweighted_over_datasets_and_sums_counts() -> None:
    results = {
        "nq": {"substring_em": 0.5, "questions": 10.0, "wall_s": 2.0},
        "bamboogle": {"substring_em": 0.25, "questions": 30.0, "wall_s": 3.0},
    }
    # the papers' Avg.: (0.5 + 0.25) / 2 = 0.375, not the question-weighted 12.5 / 40 = 0.3125
    assert report.average(results) == pytest.approx({"substring_em": 0.375, "questions": 40.0, "wall_s": 5.0})
    assert report.average({}) == {}


def test_score_answer_and_pass_at_n_row() -> None:
    # "it is paris" vs "paris": precision 1/3, recall 1 -> F1 = 2 * (1/3) / (4/3) = 0.5
    assert report.score_answer("it is Paris", ["Paris"], normalization="squad") == {
        "substring_em": 1.0,
        "em": 0.0,
        "f1": 0.5,
    }
    assert report.score_answer(None, ["Paris"], normalization="squad") == {"substring_em": 0.0, "em": 0.0, "f1": 0.0}
    example = QAExample(id="q1", question="Capital of France?", golden_answers=["Paris"])
    samples = [{"answer": "it is Paris"}, {"answer": "Paris"}, {"answer": None}]
    row = report.example_row(example, samples, normalization="squad", retrieval={"k": 1})
    assert row["scores"] == {"substring_em": 1.0, "em": 1.0, "f1": 1.0}  # best sample per metric
    assert [s["scores"]["em"] for s in row["samples"]] == [0.0, 1.0, 0.0]
    assert row["id"] == "q1" and row["golden_answers"] == ["Paris"] and row["retrieval"] == {"k": 1}


@pytest.mark.parametrize(
    ("normalization", "expected"),
    [
        # "Rock \u2019n\u2019 roll": squad keeps the curly apostrophes, tokens {rock, \u2019n\u2019, roll}
        # vs {rock, n, roll}: overlap 2, F1 2/3; the empty gold "!!!" is in every answer
        ("squad", {"substring_em": 1.0, "em": 0.0, "f1": 2 / 3}),
        # unicode deletes them (a match) and drops the empty gold
        ("unicode", {"substring_em": 1.0, "em": 1.0, "f1": 1.0}),
    ],
)
def test_example_row_scores_with_the_given_normalization(normalization: str, expected: dict) -> None:
    example = QAExample(id="q", question="Genre?", golden_answers=["Rock \u2019n\u2019 roll", "!!!"])
    row = report.example_row(example, [{"answer": "rock n roll"}], normalization=normalization)
    assert row["scores"] == pytest.approx(expected, abs=1e-12)
    # only the empty gold left: squad matches an empty answer, unicode never
    empty_gold = QAExample(id="e", question="?", golden_answers=["!!!"])
    row = report.example_row(empty_gold, [{"answer": ""}], normalization=normalization)
    assert row["scores"]["em"] == (1.0 if normalization == "squad" else 0.0)


def test_trajectory_sample_keeps_turns_and_counts_policy_tokens() -> None:
    doc = Document(title="Paris", text="capital of France", score=1.5, source="bm25", id="7")
    turns = [
        Turn(text="<search> france </search>", action="search", query="france", documents=[doc], executed=True),
        Turn(text="<answer> Paris </answer>", action="answer"),
    ]
    trajectory = Trajectory(
        prompt_id=0,
        example=QAExample("q", "?", ["Paris"]),
        prompt_ids=[1, 2],
        response_ids=[3, 4, 5, 6, 7],
        loss_mask=[1, 1, 0, 0, 1],
        turns=turns,
        response_text="...",
        answer="Paris",
        num_searches=1,
        num_invalid=0,
        finish="answer",
    )
    sample = report.trajectory_sample(trajectory)
    assert sample["policy_tokens"] == 3  # inserted tokens (mask 0) are not the policy's
    assert sample["turns"][0]["documents"] == [
        {"title": "Paris", "text": "capital of France", "score": 1.5, "source": "bm25", "id": "7", "noisy": False}
    ]
    assert sample["turns"][0]["query"] == "france" and sample["num_searches"] == 1
    json.dumps(sample)  # JSON-ready


def test_rows_file_append_repair_and_errors(tmp_path) -> None:
    path = tmp_path / "m" / "d.jsonl"
    report.append_rows(path, [{"id": "a"}, {"id": "b"}], wall_s=3.0, fingerprint="f1")
    rows = report.read_rows(path)
    assert rows == [{"id": "a", "wall_s": 1.5, "fingerprint": "f1"}, {"id": "b", "wall_s": 1.5, "fingerprint": "f1"}]
    good = path.read_text()
    path.write_text(good + '{"id": "c", "wal')  # a write cut off by a kill
    with pytest.raises(DataError, match=r"d.jsonl: line 3 is not valid JSON"):
        report.read_rows(path)
    assert [r["id"] for r in report.read_rows(path, repair=True)] == ["a", "b"]
    assert path.read_text() == good  # the half line is gone from the file
    path.write_text('{"id": "a"}\nnot json\n{"id": "b"}\n')  # damage inside the file is not repaired
    with pytest.raises(DataError, match="line 2"):
        report.read_rows(path, repair=True)
    assert report.read_rows(tmp_path / "missing.jsonl") == []
    examples = [QAExample("b", "?", ["x"]), QAExample("a", "?", ["x"])]
    path.write_text('{"id": "a"}\n{"id": "b"}\n{"id": "z"}\n')
    assert [r["id"] for r in report.rows_in_order(path, examples)] == ["b", "a"]
    with pytest.raises(DataError, match=r"no result for 1 question\(s\), e.g. id 'q'"):
        report.rows_in_order(path, [QAExample("q", "?", ["x"])])


def _metrics(sub, em=0.0, f1=0.0):
    return {
        "substring_em": sub,
        "em": em,
        "f1": f1,
        "answer_rate": 1.0,
        "searches_per_question": 1.0,
        "invalid_actions": 0.0,
        "tokens_per_question": 10.0,
        "questions": 5.0,
        "samples": 5.0,
        "wall_s": 1.0,
    }


def _summary(n=1, fidelity=()):
    full = {"nq": _metrics(0.5), "popqa": _metrics(0.25)}
    partial = {"nq": _metrics(0.123456)}
    return {
        "datasets": ["nq", "popqa"],
        "n": n,
        "header": {"policy": "/models/p"},
        "normalization": "squad",
        "rows": {
            "bm25": {
                "kind": "bm25",
                "search": "bm25 top-3",
                "top_k": 3,
                "results": full,
                "average": report.average(full),
            },
            "sim": {
                "kind": "simulator",
                "search": "simulator top-3, p_noise 0",
                "top_k": 3,
                "results": partial,
                "average": report.average(partial),
            },
        },
        "fidelity": list(fidelity),
    }


def test_score_table_is_paper_shaped() -> None:
    table = report.score_table(_summary(), "substring_em")
    assert table.splitlines() == [
        "| Method | Search | nq | popqa | Avg. |",
        "|---|---|---:|---:|---:|",
        "| bm25 | bm25 top-3 | 50.00 | 25.00 | 37.50 |",  # Avg. (50 + 25) / 2
        "| sim | simulator top-3, p_noise 0 | 12.35 | – | – |",  # no partial averages
    ]
    with pytest.raises(ValueError, match="metric='wall_s'"):
        report.score_table(_summary(), "wall_s")


def test_markdown_report_sections() -> None:
    text = report.markdown_report(_summary())
    assert "## Substring EM" in text and "## Exact match (EM" in text and "## Token F1, %" in text
    assert "pass@" not in text and "Simulator fidelity" not in text
    entry = {
        "simulator": "sim",
        "reference": "bm25",
        "dataset": "nq",
        "policy_queries": 3,
        "question_queries": 1,
        "fidelity/useful_contains_answer": 0.75,
        "fidelity/gap": 0.5,
    }
    text = report.markdown_report(_summary(n=4, fidelity=[entry]))
    assert '## Exact match (EM; what Search-R1 and SSRL report as "EM"), %, pass@4' in text
    fidelity_line = next(line for line in text.splitlines() if line.startswith("| sim | bm25 | nq"))
    assert fidelity_line.startswith("| sim | bm25 | nq | 3 / 1 | 75.00 | – | 50.00 |")


def test_the_protocol_is_stated_once_and_every_score_table_names_its_metric() -> None:
    summary = _summary()
    summary["rows"]["direct"] = {"kind": "direct", "search": "", "top_k": 0, "results": {}, "average": {}}
    lines = report.markdown_report(summary).splitlines()
    engines = "Engine, top-k: bm25 top-3 (bm25); simulator top-3, p_noise 0 (sim); none (direct)."
    protocols = [line for line in lines if line.startswith("Protocol")]
    assert protocols == [
        f"Protocol of the score tables. {engines} Normalization: squad (" + NORMALIZATIONS["squad"].summary + ")."
    ]
    assert lines.index(protocols[0]) < lines.index(f"## {report.SCORE_TITLES['substring_em']}, %")
    for metric, title in report.SCORE_TITLES.items():
        heading = lines.index(f"## {title}, %")
        assert lines[heading + 2].startswith(f"Metric: {metric}, ")  # the heading, a blank line, the metric
    assert report.metric_line("em") == "Metric: em, the normalized answer equals a normalized gold answer.\n"
    assert report.protocol_line({**summary, "normalization": "unicode"}).endswith(
        "Normalization: unicode (" + NORMALIZATIONS["unicode"].summary + ").\n"
    )
    # the titles name whose "EM" each metric is
    substring_title = report.SCORE_TITLES["substring_em"]
    assert "ZeroSearch" in substring_title and "Search-R1" not in substring_title
    assert "Search-R1 and SSRL" in report.SCORE_TITLES["em"]


def test_a_summary_without_normalization_has_no_protocol() -> None:
    summary = _summary()
    del summary["normalization"]
    with pytest.raises(ValueError, match="normalization=None is not one of squad, unicode"):
        report.markdown_report(summary)


def test_csv_and_json_round_trip(tmp_path) -> None:
    summary = _summary()
    with report.write_csv(summary, tmp_path / "s.csv").open() as handle:
        lines = list(csv.DictReader(handle))
    # bm25: nq, popqa, average; sim: nq, average
    assert [(r["method"], r["dataset"]) for r in lines] == [
        ("bm25", "nq"),
        ("bm25", "popqa"),
        ("bm25", "average"),
        ("sim", "nq"),
        ("sim", "average"),
    ]
    assert float(lines[2]["substring_em"]) == pytest.approx(0.375)
    assert float(lines[2]["questions"]) == 10.0  # summed over datasets
    assert json.loads(report.write_json(summary, tmp_path / "s.json").read_text()) == summary


def _png(path) -> Image.Image:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return Image.open(path).convert("RGB")


def test_bar_layout_averages_only_several_datasets_and_labels_a_search_only_when_there_is_one() -> None:
    groups, methods = report.bar_layout(_summary(), "substring_em")
    assert groups == ["nq", "popqa", "Avg."]
    (bm25_label, bm25_values, bm25_hatched), (sim_label, sim_values, sim_hatched) = methods
    assert (bm25_label, bm25_values, bm25_hatched) == ("bm25 (bm25 top-3)", [50.0, 25.0, 37.5], False)
    assert sim_label == "sim (simulator top-3, p_noise 0)" and sim_hatched
    assert sim_values[0] == pytest.approx(12.3456) and math.isnan(sim_values[1]) and math.isnan(sim_values[2])
    # The quickstart's shape: engines as the groups, no averages, policies without a search label.
    base = {"kind": "policy", "search": "", "results": {"bm25": _metrics(0.2)}, "average": {}}
    one = {"datasets": ["bm25"], "rows": {"base": base}}
    assert report.bar_layout(one, "substring_em") == (["bm25"], [("base", [20.0], False)])


def test_plot_bars_png_of_the_requested_size(tmp_path) -> None:
    path = report.plot_bars(_summary(), tmp_path / "bars.png", size_px=(800, 400))
    image = _png(path)
    assert image.size == (800, 400)
    assert len(image.getcolors(maxcolors=1 << 20)) > 10  # bars, text and legend were drawn


def test_curve_panels_group_keys() -> None:
    rows = [
        {
            "step": 1,
            "reward/mean": 0.1,
            "reward/f1": 0.2,
            "val/nq/substring_em": 0.3,
            "curriculum/p_noise": 0.0,
            "losses/policy": 1.0,
        },
        {"step": 2, "reward/mean": None, "reward/f1": 0.4, "search/calls_per_traj": 1.5},
        {"reward/mean": 9.0},  # no step: skipped
    ]
    panels = report.curve_panels(rows)
    assert [title for title, _ in panels] == ["Reward", "EM / F1", "Searches per trajectory", "Curriculum: p_noise"]
    assert panels[0][1] == {"reward/mean": ([1], [0.1])}  # the null at step 2 is skipped
    assert panels[1][1] == {"reward/f1": ([1, 2], [0.2, 0.4]), "val/nq/substring_em": ([1], [0.3])}
    assert panels[2][1] == {"search/calls_per_traj": ([2], [1.5])}


def test_plot_training_curves(tmp_path) -> None:
    rows = [
        {"step": s, "reward/mean": 0.1 * s, "rollout/response_len": 50.0 - s, "curriculum/p_noise": 0.01 * s}
        for s in range(1, 6)
    ]
    image = _png(report.plot_training_curves(rows, tmp_path / "curves.png", size_px=(900, 600)))
    assert image.size == (900, 600)
    assert len(image.getcolors(maxcolors=1 << 20)) > 10
    with pytest.raises(ValueError, match="none of the plotted keys"):
        report.plot_training_curves([{"step": 1, "losses/policy": 0.3}], tmp_path / "none.png")


def test_eval_recipe_normalization_defaults_to_squad_and_is_checked() -> None:
    datasets = ["datasets=[{name: nq, path: nq.jsonl}]", "run_dir=r", "policy.model.path=m"]
    assert load_recipe(EvalRecipe, None, datasets).normalization == "squad"
    assert load_recipe(EvalRecipe, None, [*datasets, "normalization=unicode"]).normalization == "unicode"
    with pytest.raises(RecipeError, match="normalization='ascii' is not one of squad, unicode"):
        load_recipe(EvalRecipe, None, [*datasets, "normalization=ascii"])


def test_cost_table_shows_counts_latency_and_unknown_prices():
    cost = {
        "sim": {
            "kind": "simulator", "searches": 1200, "cache_hits": 200, "queries_sent": 1000,
            "latency_p50_s": 0.25, "latency_p95_s": 0.5, "latency_p99_s": 1.0,
            "simulator_calls": 40, "prompt_tokens": 9000, "prompt_tokens_complete": True,
            "completion_tokens": 30000, "simulator_s": 90.0,
            "price_per_1k_queries": 0.0, "query_cost_usd": 0.0, "simulator_cost_usd": None,
        },
        "google": {
            "kind": "serper", "searches": 10, "cache_hits": 0, "queries_sent": 10,
            "latency_p50_s": None, "latency_p95_s": None, "latency_p99_s": None,
            "simulator_calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "simulator_s": 0.0,
            "price_per_1k_queries": None, "query_cost_usd": None, "simulator_cost_usd": 0.0,
        },
    }  # fmt: skip
    lines = report.cost_table(cost).splitlines()
    assert lines[2] == (
        "| sim | simulator | 1,200 | 200 | 1,000 | 250.0 | 500.0 | 1000.0 | 40 | 9,000 | 30,000 | 90.0 "
        "| $0.00 | $0.00 | unknown |"
    )
    assert lines[3] == (
        "| google | serper | 10 | 0 | 10 | unknown | unknown | unknown | – | – | – | – | unknown | unknown | – |"
    )
    summary = {"datasets": ["nq"], "rows": {}, "normalization": "squad", "cost": cost}
    assert "## Search cost and latency" in report.markdown_report(summary)
