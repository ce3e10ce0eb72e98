"""benchmarks/ablations.py: its pure parts by hand, and `--smoke` end to end (every arm for two steps)."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest
import torch
from PIL import Image

from benchmarks import ablations, benchlib, study

KEYS = {
    "curriculum_exp", "curriculum_constant", "curriculum_none", "loop_simulator", "loop_bm25", "loop_none",
    "simulator_default", "simulator_told_prompt", "simulator_outcome_labels", "simulator_no_contrast",
    "leak_default", "leak_told_prompt", "leak_outcome_labels", "leak_no_contrast", "algo_reinforce", "algo_grpo",
    "algo_ppo", "ssrl_selfsearch", "ssrl_sim2real_bm25", "wall_s",
}  # fmt: skip
PROVENANCE = {"commit": "abc1234", "cpu": "Some CPU, AVX512 kernels", "torch_threads": 1, "jobs": 2}  # the runner's
DOCS = Path(__file__).resolve().parents[2] / "docs"


def _record(tmp_path: Path, by_seed: dict[str, dict], **more: object) -> Path:
    """A run's printed JSON of `by_seed`'s worlds, saved as `--render` reads it."""
    seeds = [int(seed) for seed in by_seed]
    figures = {"seeds": seeds, "steps": 5, "smoke": False, "wall_s": 120.0, "provenance": PROVENANCE,
               "by_seed": by_seed, **more}  # fmt: skip
    record = tmp_path / "figures.json"
    record.write_text("a log line\n" + json.dumps(figures) + "\n")
    return record


def test_constant_arm_takes_the_exponential_schedules_mean() -> None:
    # p_i = 0.25 (4^(i/m) - 1) / 3. m = 2: p_0 = 0, p_1 = 0.25 (2 - 1) / 3 = 0.083333; mean 0.041667.
    assert ablations.constant_p_noise(0.0, 0.25, 4.0, 2) == pytest.approx(0.25 / 6, abs=1e-12)
    # m = 4: 0, 0.25(sqrt2 - 1)/3 = 0.034518, 0.083333, 0.25(2sqrt2 - 1)/3 = 0.152369; mean 0.067555.
    assert ablations.constant_p_noise(0.0, 0.25, 4.0, 4) == pytest.approx(0.067555, abs=1e-6)


def test_difference_cell_by_hand() -> None:
    # The page's cells are benchlib's t-interval (t(0.975, n - 1) standard errors either side of the mean).
    # 2, 4, 6: mean 4, sd 2, standard error 1.1547, t(0.975, 2) = 4.302653: 4 -+ 4.968, which holds 0 (a
    # percentile bootstrap over three worlds gave their range, +2.0 to +6.0).
    assert benchlib.difference_cell([2.0, 4.0, 6.0]) == "no measurable difference (+4.0; -1.0 to +9.0)"
    # 9, 10, 11: 10 -+ 4.302653 / sqrt(3) = 10 -+ 2.484, clear of 0.
    assert benchlib.difference_cell([9.0, 10.0, 11.0]) == "+10.0 (+7.5 to +12.5)"
    # Two worlds give an interval (one degree of freedom, t = 12.7062): 6 -+ 12.7062 * 1 = 6 -+ 12.706.
    assert benchlib.difference_cell([5.0, 7.0]) == "no measurable difference (+6.0; -6.7 to +18.7)"
    assert benchlib.difference_cell([5.0]) == "+5.0 (1 world: no interval)"
    assert benchlib.difference_cell([]) == "-"


def test_paired_subtracts_per_seed_where_both_were_measured() -> None:
    results = [
        {"em": {"a": {"bm25": 50.0}, "default": {"bm25": 40.0}}},
        {"em": {"a": {"bm25": 30.0}, "default": {"bm25": 35.0}}},
        {"em": {"default": {"bm25": 10.0}}},  # arm a not run on this seed: no pair
    ]
    assert study.paired_values(results, "a", "default", "bm25") == [10.0, -5.0]
    assert study.paired_values(results, "a", "default", "self") == []
    leak = [{"leak": {"x": {"no_name": 0.5}, "y": {"no_name": 0.125}}}]

    def leaked(record: dict, row: str, probe: str) -> float | None:
        return record["leak"].get(row, {}).get(probe)

    assert study.paired_values(leak, "x", "y", "no_name", leaked, scale=100.0) == [37.5]
    # One seed: the mean only. 10, -5, 10: mean 5, sd 8.6603, standard error 5, t(0.975, 2) = 4.302653:
    # 5 -+ 21.513.
    assert ablations.paired_figures([10.0]) == {"mean": 10.0, "ci_low": None, "ci_high": None}
    assert ablations.paired_figures([10.0, -5.0, 10.0]) == {"mean": 5.0, "ci_low": -16.51, "ci_high": 26.51}


def test_the_measured_block_names_the_commit_machine_seeds_and_steps(tmp_path: Path) -> None:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    info = benchlib.provenance()  # what the runner records for each world
    assert info["commit"].split(" ")[0] == head and info["cores"] >= 1 and info["torch_threads"] >= 1
    assert info["cpu"]
    assert benchlib.provenance(tmp_path)["commit"] == "unknown"  # not a git work tree
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    world = {"em": {}, "leak": {}, "wall_s": 60.0}
    figures = json.loads(_record(tmp_path, {"0": world}).read_text().splitlines()[-1])
    blocks = ablations.page(figures, study.parse(ablations.STUDY, ["--out", str(tmp_path / "ablations.md")]))
    assert blocks["measured"] == (
        "Measured at commit abc1234 on Some CPU, AVX512 kernels (1 torch thread(s) a world, 2 world(s) at once).\n"
        "Seeds 0; 5 RL steps an arm."
    )


def test_seeds_default_to_three_reporting_worlds_and_smoke_to_one() -> None:
    def parse(*argv: str) -> argparse.Namespace:
        return study.parse(ablations.STUDY, list(argv))

    assert parse().seeds == [0, 1, 2]
    assert parse("--smoke").seeds == [0]
    assert parse("--smoke", "--seeds", "0", "1", "2").seeds == [0, 1, 2]
    assert parse("--seeds", "4").seeds == [4]
    assert parse().arms == list(ablations.ARMS) and parse("--arms", "default", "ppo").arms == ["default", "ppo"]
    assert parse("--steps", "7").steps == 7 and parse().quickstart_dir == ""


def test_each_simulator_arm_changes_one_thing() -> None:
    variants = ablations.VARIANTS
    assert variants["told_prompt"].collect == ("show_question=true", "show_answer=true")
    assert variants["outcome_labels"].collect == ("target=trajectory", "contrast_queries=0")
    assert variants["no_contrast"].collect == ("contrast_queries=0",)
    for name in variants:  # RL and evaluation run each on its own simulator, with no other override
        assert ablations.ARMS[name] == ablations.Arm(simulator=name)
    assert ablations.simulator_told("told_prompt") == ("show_question", "show_answer")
    assert ablations.simulator_told("outcome_labels") == ablations.simulator_told("simulator") == ()


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
    assert "| `reinforce` − `default` | - | - | - |" in lines  # not run: no difference


def test_table_lines_give_each_arms_paired_difference() -> None:
    def seed(default: float, reinforce: float) -> dict:
        return {"em": {"default": {"bm25": default}, "reinforce": {"bm25": reinforce}}, "leak": {}}

    question = ablations.Question("q", "title", (("GRPO", "default"),), ("bm25",), pairs=(("reinforce", "default"),))
    # reinforce - default per seed: 9, 10, 11: mean 10, sd 1, 10 -+ 4.302653 / sqrt(3) = 10 -+ 2.484.
    better = {0: seed(40.0, 49.0), 1: seed(30.0, 40.0), 2: seed(20.0, 31.0)}
    lines = ablations.table_lines(question, better)
    assert "| `reinforce` − `default` | +10.0 (+7.5 to +12.5) |" in lines
    assert any("95% t-interval of the paired mean" in line for line in lines)
    # 5, 10, 15: the same sign on every seed, but sd 5: 10 -+ 12.421 holds 0.
    same_sign = {0: seed(40.0, 45.0), 1: seed(30.0, 40.0), 2: seed(20.0, 35.0)}
    cell = "| `reinforce` − `default` | no measurable difference (+10.0; -2.4 to +22.4) |"
    assert cell in ablations.table_lines(question, same_sign)


def test_leakage_lines_give_each_variants_difference_from_the_quickstarts_simulator() -> None:
    leak = {"simulator": {"no_name": 0.03, "noisy": 0.4}, "told_prompt": {"no_name": 0.63, "noisy": 0.7}}
    lines = ablations.leakage_lines({0: {"leak": leak}})
    assert "| question and gold answer in the prompt | 63.0 ± 0.0 | 70.0 ± 0.0 |" in lines
    # one seed: 63 - 3 = 60 and 70 - 40 = 30 points, no interval.
    diff = "| `told_prompt` − `simulator` | +60.0 (1 world: no interval) | +30.0 (1 world: no interval) |"
    assert diff in lines
    assert "| `no_contrast` − `simulator` | - | - |" in lines


def test_the_page_is_rewritten_from_a_record_and_keeps_the_prose(tmp_path: Path) -> None:
    em = {"default": {"simulator": 1.0, "bm25": 2.0, "dense": 3.0}}
    record = _record(tmp_path, {"0": {"em": em, "leak": {}, "wall_s": 150.0}})
    doc = tmp_path / "ablations.md"
    ablations.main(["--render", str(record), "--out", str(doc)])  # a missing page: started bare
    doc.write_text(doc.read_text().replace("<!-- table:loop -->", "## 2. What is in the loop\n\nOur reading.\n\n"
                                           "<!-- table:loop -->"))  # fmt: skip
    record.write_text(record.read_text().replace('"bm25": 2.0', '"bm25": 9.0'))
    ablations.main(["--render", str(record), "--out", str(doc)])
    text = doc.read_text()
    assert "Our reading." in text and "<!-- wall -->2 min<!-- /wall -->" in text  # 2.5 min rounds to 2
    assert "Measured at commit abc1234 on Some CPU, AVX512 kernels" in text and "Seeds 0; 5 RL steps an arm." in text
    assert "| fine-tuned simulator | 1.0 ± 0.0 | 9.0 ± 0.0 | 3.0 ± 0.0 |" in text
    assert "![2. What is in the loop: simulator vs real BM25 vs no search](ablations/loop.png)" in text
    assert sorted(p.name for p in (tmp_path / "ablations").iterdir()) == [
        f"{q.key}.png" for q in sorted(ablations.QUESTIONS, key=lambda q: q.key)
    ]


def test_the_saved_record_renders_the_pages_tables_as_committed(tmp_path: Path) -> None:
    doc = tmp_path / "ablations.md"
    doc.write_text((DOCS / "ablations.md").read_text())
    figures = ablations.main(["--render", str(DOCS / "ablations" / "figures.json"), "--out", str(doc)])
    for question in ablations.QUESTIONS:
        block = f"<!-- table:{question.key} -->"
        assert doc.read_text().split(block)[1] == (DOCS / "ablations.md").read_text().split(block)[1], question.key
    assert "<!-- wall -->66-73 min<!-- /wall --> a world" in doc.read_text()  # each world's minutes, as measured
    saved = json.loads((DOCS / "ablations" / "figures.json").read_text())
    assert figures == saved  # its differences are those this code computes


@pytest.mark.slow
@pytest.mark.timeout(900)  # a whole pipeline for a step or two: minutes on a busy 2-core machine
def test_smoke_runs_every_arm_and_prints_every_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    returned = ablations.main(["--smoke", "--run-dir", str(tmp_path), "--threads", "1"])
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # the JSON is the last line
    assert figures == returned
    assert set(figures) >= KEYS
    # EM points of SMOKE_LIMIT (4) held-out questions and leakage of SMOKE_LEAK (4) result sets, one seed:
    # each a whole count out of 4, so 0, 25, 50, 75 or 100 (a fraction, or a mean over the wrong rows, is not).
    quarters = {0.0, 25.0, 50.0, 75.0, 100.0}
    assert ablations.SMOKE_LIMIT == ablations.SMOKE_LEAK == 4
    for key in KEYS - {"wall_s"}:
        assert figures[key] in quarters, (key, figures[key])
    for key, (row, engine) in ablations.FIGURES.items():  # each figure is its own arm's and engine's record
        summary = json.loads((tmp_path / "world_0" / "eval" / row / "summary.json").read_text())
        assert figures[key] == round(100.0 * summary["rows"][engine]["average"]["em"], 2), key
    assert figures["smoke"] is True and figures["steps"] == 2 and figures["wall_s"] > 0
    assert figures["differences"]["told_prompt-default"]["bm25"]["ci_low"] is None  # one seed: no interval
    assert set(figures["provenance"]) == {"commit", "cpu", "torch_threads", "jobs"}
    seed = tmp_path / "world_0"
    record = json.loads((seed / "ablations.json").read_text())  # the worker's record, as in by_seed
    assert record == figures["by_seed"]["0"] and record["steps"] == 2 and record["wall_s"] > 0
    assert (seed / "quickstart" / "report.json").is_file()  # the quickstart ran in the world's directory
    for name, variant in ablations.VARIANTS.items():  # each simulator collected with its overrides only
        collect = (seed / f"collect_{name}" / "recipe.yaml").read_text()
        shown = "true" if variant.told else "false"
        assert f"show_question: {shown}" in collect and f"show_answer: {shown}" in collect, name
        assert ("target: trajectory" in collect) == (name == "outcome_labels"), name
        assert ("contrast_queries: 0" in collect) == (name != "told_prompt"), name
        rl = (seed / "train" / name / "recipe.yaml").read_text()
        assert f"simulator_{name}" in rl and f"show_question: {shown}" in rl, name
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
    assert "Measured at commit " in text and "torch thread(s) a world" in text
    for question in ablations.QUESTIONS:
        with Image.open(tmp_path / "ablations" / f"{question.key}.png") as image:
            assert image.size == (1200, 600)


def test_render_rewrites_the_page_and_differences_from_a_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def seed(default: float, no_noise: float) -> dict:
        em = {
            "default": {"simulator": 1.0, "bm25": default, "dense": 5.0},
            "no_noise": {"simulator": 1.0, "bm25": no_noise, "dense": 5.0},
        }
        return {"em": em, "leak": {}, "wall_s": 3600.0}

    # no_noise - default on BM25 per seed: 9, 10, 11: 10 -+ 4.302653 / sqrt(3) = 10 -+ 2.484.
    by_seed = {"0": seed(40.0, 49.0), "1": seed(30.0, 40.0), "2": seed(20.0, 31.0)}
    stale = {"no_noise-default": {"bm25": {"mean": 10.0, "ci_low": 9.0, "ci_high": 11.0}}}
    record = _record(tmp_path, by_seed, differences=stale, kept="as it was")
    saved = record.read_text()
    doc = tmp_path / "ablations.md"
    doc.write_text("# Ablations\n\nProse.\n\n<!-- measured -->\nMeasured by hand at abc1234\n<!-- /measured -->\n"
                   "Wall: <!-- wall -->66-73 min a world<!-- /wall -->\n")  # fmt: skip
    rendered = ablations.main(["--render", str(record), "--out", str(doc)])
    text = doc.read_text()
    same = "no measurable difference (0.0; 0.0 to 0.0)"  # 0 on every seed: no width
    assert f"| `no_noise` − `default` | {same} | +10.0 (+7.5 to +12.5) | {same} |" in text
    assert text.startswith("# Ablations\n\nProse.\n\n<!-- measured -->\nMeasured at commit abc1234")
    assert "Wall: <!-- wall -->60 min<!-- /wall -->" in text  # every block from the record, the prose kept
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == rendered
    assert rendered["kept"] == "as it was" and rendered["by_seed"] == by_seed
    assert rendered["differences"]["no_noise-default"]["bm25"] == {"mean": 10.0, "ci_low": 7.52, "ci_high": 12.48}
    assert rendered["interval_method"].startswith("95% t-interval of the paired mean")
    assert record.read_text() == saved  # the record is read, not rewritten: the printed JSON is the new one
