"""benchmarks/turn_rewards.py: its pure parts by hand, and `--smoke` end to end (every arm for two steps)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks import study, turn_rewards
from simsearch.tinyworld.world import TWO_HOP, build_world

KEYS = {
    "grpo_em", "igpo_em", "grpo_dynamic_em", "grpo_flat_share", "igpo_flat_share", "igpo_s_per_step_over_grpo",
    "differences", "provenance",
}  # fmt: skip
PROVENANCE = {"commit": "abc1234", "cpu": "Some CPU", "torch_threads": 1, "jobs": 2}  # as the runner gives it
RUN = argparse.Namespace(render="", steps=3, smoke=False)


def test_split_questions_halves_training_and_matches_held_out_sets() -> None:
    world = build_world(seed=0, n_entities=12, n_train_entities=8, n_cities=4, two_hop_share=1.0)
    splits = turn_rewards.split_questions(world, seed=0)
    relation = {q.id: world.facts[q.id].relation for q in world.train + world.test}
    # 8 training people: 8 two-hop questions and 8 of their 24 one-hop ones; 4 held out: 4 and 4.
    assert [relation[q.id] == TWO_HOP for q in splits["train"]] == [False] * 8 + [True] * 8
    assert len(splits["one_hop"]) == len(splits["two_hop"]) == 4
    assert {relation[q.id] for q in splits["two_hop"]} == {TWO_HOP}
    assert TWO_HOP not in {relation[q.id] for q in splits["one_hop"]}
    assert {q.id for q in splits["one_hop"] + splits["two_hop"]} <= {q.id for q in world.test}
    assert turn_rewards.split_questions(world, seed=0) == splits  # seeded
    assert turn_rewards.split_questions(world, seed=1)["train"] != splits["train"]


def _seed(em: dict[str, float], flat: float, step_s: float) -> dict:
    rl = {"flat_share": flat, "step_s": step_s, "prompts_per_step": 8.0, "searches": 1.5, "steps": 3.0}
    return {
        "em": {arm: {"all": em[arm], "one_hop": 2 * em[arm], "two_hop": 0.0} for arm in ("base", *turn_rewards.ARMS)},
        "rl": {arm: dict(rl) for arm in turn_rewards.ARMS},
    }


def test_summarize_gives_means_over_seeds_and_the_step_time_ratio() -> None:
    results = {
        0: _seed({"base": 1.0, "grpo": 10.0, "igpo": 20.0, "grpo_dynamic": 30.0}, flat=0.5, step_s=1.0),
        1: _seed({"base": 3.0, "grpo": 20.0, "igpo": 40.0, "grpo_dynamic": 50.0}, flat=0.7, step_s=2.0),
    }
    results[1]["rl"]["igpo"]["step_s"] = 4.0
    figures = turn_rewards.summarize(results, RUN)
    assert set(figures) >= KEYS - {"provenance"}  # the runner adds it
    assert figures["steps"] == 3 and set(figures["by_world"]) == {"0", "1"}
    assert (figures["grpo_em"], figures["igpo_em"], figures["grpo_dynamic_em"]) == (15.0, 30.0, 40.0)
    assert figures["grpo_flat_share"] == pytest.approx(0.6, abs=1e-9)
    # igpo: (1 + 4) / 2 = 2.5 s a step; grpo: (1 + 2) / 2 = 1.5 s; 2.5 / 1.5 = 1.6667.
    assert figures["igpo_s_per_step_over_grpo"] == pytest.approx(1.6667, abs=1e-4)
    lines = turn_rewards.table_lines(results)
    # EM all (10, 20): 15.0 ± 7.1 (sd sqrt(50)); one-hop (20, 40): 30.0 ± 14.1; flat (0.5, 0.7): 0.60 ± 0.14.
    grpo = "| GRPO | 15.0 ± 7.1 | 30.0 ± 14.1 | 0.0 ± 0.0 | 0.60 ± 0.14 | 1.50 ± 0.71 | 8.0 ± 0.0 | 1.50 ± 0.00 |"
    assert grpo in lines
    assert "| base, no RL | 2.0 ± 1.4 | 4.0 ± 2.8 | 0.0 ± 0.0 | - | - | - | - |" in lines
    # igpo - grpo per seed: all 10, 20; one-hop 20, 40; two-hop 0, 0. Two seeds: one degree of freedom,
    # t(0.975, 1) = 12.706205; all: 15 -+ 12.706205 * 5 = 15 -+ 63.531; one-hop 30 -+ 127.062; two-hop 0 -+ 0.
    assert figures["differences"]["igpo"]["all"] == {"mean": 15.0, "ci_low": -48.53, "ci_high": 78.53}
    assert figures["differences"]["igpo"]["two_hop"] == {"mean": 0.0, "ci_low": 0.0, "ci_high": 0.0}
    assert figures["interval_method"].startswith("95% t-interval of the paired mean")
    assert lines[-2] == (
        "| IGPO turn rewards | no measurable difference (+15.0; -48.5 to +78.5) "
        "| no measurable difference (+30.0; -97.1 to +157.1) | no measurable difference (0.0; 0.0 to 0.0) |"
    )
    assert set(figures["differences"]) == {"igpo", "grpo_dynamic"}


def test_a_difference_whose_interval_holds_zero_is_no_measurable_difference() -> None:
    # grpo_dynamic - grpo: 3 seeds, +10, -4, +6 on EM all: mean 4, sd 7.2111, standard error 4.1633,
    # t(0.975, 2) = 4.302653: 4 -+ 17.913, which holds 0.
    results = {
        seed: _seed({"base": 0.0, "grpo": 20.0, "igpo": 20.0 + d, "grpo_dynamic": 20.0 + d}, flat=0.5, step_s=1.0)
        for seed, d in enumerate((10.0, -4.0, 6.0))
    }
    lines = turn_rewards.table_lines(results)
    row = next(line for line in lines if line.startswith("| GRPO + dynamic sampling | no"))
    # one-hop doubles every EM: 8 -+ 35.827.
    assert row.startswith(
        "| GRPO + dynamic sampling | no measurable difference (+4.0; -13.9 to +21.9) "
        "| no measurable difference (+8.0; -27.8 to +43.8) |"
    )


def test_seeds_default_to_three_reporting_worlds_and_smoke_to_one() -> None:
    assert study.parse(turn_rewards.STUDY, []).seeds == [0, 1, 2]
    assert study.parse(turn_rewards.STUDY, ["--smoke"]).seeds == [0]
    assert study.parse(turn_rewards.STUDY, ["--seeds", "0", "1"]).seeds == [0, 1]
    steps = [study.parse(turn_rewards.STUDY, argv).steps for argv in ([], ["--smoke"], ["--steps", "9"])]
    assert steps == [60, 2, 9]  # the runner's --steps: the study's budget, the smoke's, or the one given


def _figures(by_world: dict[str, dict], **extra: object) -> dict:
    """A run's printed figures, as far as the page reads them."""
    seeds = [int(seed) for seed in by_world]
    return {"seeds": seeds, "steps": 5, "smoke": False, "wall_s": 120.0, "provenance": PROVENANCE,
            "by_world": by_world, **extra}  # fmt: skip


def test_the_page_rewrites_the_table_and_keeps_the_prose(tmp_path: Path) -> None:
    doc = tmp_path / "turn_rewards.md"
    world = _seed({"base": 1.0, "grpo": 10.0, "igpo": 20.0, "grpo_dynamic": 30.0}, flat=0.5, step_s=1.0)
    study.write_page(doc, "Turn rewards", turn_rewards.page(_figures({"0": world}), RUN))
    doc.write_text(doc.read_text() + "\nOur reading.\n")
    world["em"]["grpo"]["all"] = 12.0
    study.write_page(doc, "Turn rewards", turn_rewards.page(_figures({"0": world}), RUN))
    text = doc.read_text()
    assert "Our reading." in text and "| GRPO | 12.0 ± 0.0 |" in text and "| GRPO | 10.0" not in text
    assert "<!-- wall -->2.0 min<!-- /wall -->" in text
    assert (
        "<!-- measured -->\nMeasured at commit abc1234 on Some CPU (1 torch thread(s) a world, 2 world(s) at once)."
        "\nSeeds 0; 5 RL steps an arm.\n<!-- /measured -->"
    ) in text


@pytest.mark.slow
def test_smoke_runs_every_arm_and_prints_every_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    turn_rewards.main(["--smoke", "--run-dir", str(tmp_path), "--threads", "1"])
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # the JSON is the last line
    assert set(figures) >= KEYS
    for arm in turn_rewards.ARMS:
        assert 0.0 <= figures[f"{arm}_em"] <= 100.0, arm
    for arm in ("grpo", "igpo"):
        assert 0.0 <= figures[f"{arm}_flat_share"] <= 1.0, arm
    assert figures["igpo_s_per_step_over_grpo"] > 0
    assert figures["smoke"] is True and figures["steps"] == 2 and figures["seeds"] == [0]
    assert figures["differences"]["igpo"]["all"]["ci_low"] is None  # one seed: no interval
    seed = tmp_path / "world_0"
    assert json.loads((seed / "turn_rewards.json").read_text())["em"].keys() == {"base", *turn_rewards.ARMS}
    for arm in turn_rewards.ARMS:  # the same budget: two steps each, up to three searches, on BM25
        rows = [json.loads(r) for r in (seed / "train" / arm / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2], arm
        assert all("sampling/flat_share" in r for r in rows), arm
        recipe = (seed / "train" / arm / "recipe.yaml").read_text()
        assert "max_turns: 3" in recipe and "kind: bm25" in recipe, arm
    dynamic = [json.loads(r) for r in (seed / "train" / "grpo_dynamic" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["sampling/rounds"] >= 1 for r in dynamic)
    for policy in ("base", *turn_rewards.ARMS):
        summary = json.loads((seed / "eval" / policy / "summary.json").read_text())
        assert set(summary["rows"]) == {"bm25"} and set(summary["datasets"]) == {"one_hop", "two_hop"}, policy
    # The base was pretrained on a two-hop world with two-search traces.
    world = (seed / "world_and_base" / "recipe.yaml").read_text()
    assert "two_hop_share: 1.0" in world and "two_search_share: 0.5" in world
    text = (tmp_path / "turn_rewards.md").read_text()
    assert text.count("smoke: a pipeline check") == 1 and "(1 world: no interval)" in text
    assert "Measured at commit " in text and "torch thread(s)" in text


def test_render_rewrites_the_table_and_differences_from_a_record(tmp_path: Path) -> None:
    # igpo - grpo per world on EM all: 9, 10, 11 (one-hop doubles: 18, 20, 22): 10 -+ 4.302653 / sqrt(3).
    by_world = {
        str(seed): _seed({"base": 1.0, "grpo": 20.0, "igpo": 20.0 + d, "grpo_dynamic": 20.0}, flat=0.5, step_s=1.0)
        for seed, d in enumerate((9.0, 10.0, 11.0))
    }
    record = tmp_path / "figures.json"
    figures = _figures(by_world, differences={"igpo": "stale"})
    record.write_text(json.dumps(figures))
    doc = tmp_path / "turn_rewards.md"
    doc.write_text("<!-- measured -->\nnotes\n<!-- /measured -->\n<!-- table -->\n| a |\n<!-- /table -->\n"
                   "<!-- wall -->about 62 min<!-- /wall -->\n")  # fmt: skip
    rendered = turn_rewards.main(["--render", str(record), "--out", str(doc)])
    text = doc.read_text()
    # the differences and intervals come from the worlds' EM, not from the record's `differences`
    assert "| IGPO turn rewards | +10.0 (+7.5 to +12.5) | +20.0 (+15.0 to +25.0) | no measurable difference" in text
    assert "about 62 min" in text and "\nnotes\n" in text and "| a |" not in text  # the run's blocks kept
    assert rendered == figures and json.loads(record.read_text()) == figures  # the record as it was
