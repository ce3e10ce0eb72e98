"""benchmarks/controls.py: its statistics by hand, and `--smoke` end to end (every arm for two steps)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks import controls, study
from benchmarks import naming as naming_probe
from simsearch.config import QuickstartRecipe, load_recipe
from simsearch.experiments import knowing

KEYS = {
    "knowing_em_bm25_mean", "knowing_em_bm25_min", "oracle_em_bm25_mean", "knowing_over_oracle_mean",
    "knowing_over_oracle_ci_low", "knowing_over_oracle_ci_high", "knowing_share_of_bm25_loop_gain",
    "sim_em_bm25_mean", "sim_over_best_control_mean", "sim_over_best_control_ci_low", "interval_method",
    "world_set", "wall_s_max", "peak_rss_gb_max",
}  # fmt: skip  # the issue's keys
ARGS = argparse.Namespace(threads=1, smoke=False, aggregate=False, compare="")  # what summarize reads


def _write_doc(out: Path, figures: dict) -> None:
    """What a run writes from its figures: the page's block, the plot beside it, the README's headline."""
    blocks = controls.page(figures, ARGS)
    if blocks:
        study.write_page(out, "Controls", blocks)
        controls.charts(figures, out)
    controls.write_headline(figures)


def test_cells_are_benchlibs_t_interval() -> None:
    # The interval is benchlib's (tests/benchmarks/test_benchlib.py). Two worlds, 0 and 10: mean 5, standard
    # error 5, t(0.975, 1) = 12.7062, so 5 -+ 63.531; 1..5: 3 -+ 2.77645 * 0.70711 = 3 -+ 1.96324.
    assert controls.t_cell([7.0]) == "+7.0 (1 world: no interval)"
    assert controls.t_cell([0.0, 10.0]) == "no measurable difference (+5.0; -58.5 to +68.5)"
    assert controls.t_cell([1.0, 2.0, 3.0, 4.0, 5.0]) == "+3.0 (+1.0 to +5.0)"
    assert controls.paired([0.0, 10.0]) == {"mean": 5.0, "ci_low": -58.53, "ci_high": 68.53}


def test_world_sets() -> None:
    # The pre-registered reporting worlds; 0-4, on which designs were chosen, are development worlds now.
    assert controls.REPORTING_WORLDS == (200, 201, 202, 203, 204, 205)
    assert controls.world_set(list(reversed(controls.REPORTING_WORLDS))) == "reporting"
    assert controls.world_set([200, 203]) == "partial"  # no table of a subset: all six are reported at once
    assert controls.world_set([0, 1, 4]) == controls.world_set([100, 101]) == "development"
    assert controls.world_set([0, 200]) == "mixed"


def test_the_gate_passes_on_the_mean_over_worlds_at_half_of_todays_simulator(monkeypatch, capsys, tmp_path) -> None:
    shown = {100: (0.10, 0.40), 101: (0.30, 0.30)}  # knowing, today's simulator: means 0.2 and 0.35
    built = []

    def through_simulator(recipe):
        built.append((recipe.seed, recipe.threads, recipe.run_dir))
        return f"world {recipe.seed}", {}, {}

    def fidelity(root, world, paths, *, design, recipes, limit):
        knowing, simulator = shown[int(world.split()[1])]
        assert design == "mixed" and paths["knowing"] == f"{world} knowing"
        row = {"answer_shown": 0.0, "on_topic": 0.5, "documents": 3.0}
        return {"knowing": {**row, "answer_shown": knowing}, "simulator": {**row, "answer_shown": simulator},
                "bm25": {**row, "answer_shown": 1.0}}  # fmt: skip

    from simsearch.experiments import pipeline

    monkeypatch.setattr(pipeline, "through_simulator", through_simulator)
    monkeypatch.setattr(
        controls, "knowing_simulator", lambda root, seed, paths, fps, world, **how: ("fp", f"{world} knowing")
    )
    monkeypatch.setattr(controls, "measure_fidelity", fidelity)
    argv = ["--gate", "--knowing", "mixed", "--seeds", "100", "101", "--run-dir", str(tmp_path)]
    figures = controls.main(argv)
    assert built == [
        (100, 1, str(tmp_path / "world_100" / "quickstart")),
        (101, 1, str(tmp_path / "world_101" / "quickstart")),
    ]
    assert figures["knowing_answer_shown_mean"] == 0.2 and figures["simulator_answer_shown_mean"] == 0.35
    assert figures["knowing_over_simulator"] == 0.571 and figures["passes"] is True  # 0.2 / 0.35 >= 0.5
    out = capsys.readouterr().out.splitlines()
    assert "| 100 | 0.10 / 0.50 | 0.40 / 0.50 | 1.00 / 0.50 |" in out and json.loads(out[-1]) == figures
    shown[101] = (0.05, 0.30)  # 0.075 / 0.35: fails
    assert controls.main(argv)["passes"] is False


def _world(seed: int, bm25: dict[str, float]) -> dict:
    em = {row: {"bm25": value, "dense": value / 2} for row, value in bm25.items()}
    return {"seed": seed, "em": em, "quickstart_wall_s": 100.0 + seed, "quickstart_peak_rss_gb": 1.0}


def test_the_best_control_is_taken_world_by_world() -> None:
    worlds = {
        0: _world(0, {"base": 10, "simulator": 60, "empty": 5, "random": 20, "noisy": 12, "bm25": 70}),
        1: _world(1, {"base": 20, "simulator": 50, "empty": 30, "random": 10, "noisy": 25, "bm25": 60}),
    }
    args = ARGS
    figures = controls.summarize(worlds, args)
    # World 0's best control is random (20), world 1's empty (30): differences 40 and 20, mean 30, standard
    # error 10, t(0.975, 1) = 12.7062.
    assert figures["sim_over_best_control_mean"] == 30.0
    assert (figures["sim_over_best_control_ci_low"], figures["sim_over_best_control_ci_high"]) == (-97.06, 157.06)
    assert figures["interval_method"].startswith("95% t-interval")
    assert figures["sim_em_bm25_mean"] == 55.0 and figures["sim_em_bm25_min"] == 50.0
    # (55 - 15) / (65 - 15) = 0.8
    assert figures["sim_share_of_bm25_loop_gain"] == 0.8
    assert figures["sim_minus"]["empty"]["mean"] == 37.5  # (55 + 20) / 2
    assert figures["wall_s_max"] == 101.0 and figures["world_set"] == "development"
    assert figures["em_mean"]["random"] == {"bm25": 15.0, "dense": 7.5}
    # The page: dense's best controls are random (10) and empty (15), so 30 - 10 and 25 - 15: mean 15, standard
    # error 5.
    lines = controls.doc_lines(figures)
    cells = "no measurable difference (+30.0; -97.1 to +157.1) | no measurable difference (+15.0; -48.5 to +78.5)"
    assert f"| best control | {cells} |" in lines
    assert lines[0].startswith("Command: `python -m benchmarks.controls --seeds 0 1 --jobs 1 --threads 1`")


def test_the_knowing_arm_against_the_oracle_and_em_against_steps(tmp_path: Path) -> None:
    arms = {"base": 10, "simulator": 60, "knowing": 40, "oracle": 30, "bm25": 70, "empty": 5, "noisy": 12}
    worlds = {s: _world(s, {**arms, "knowing": 40 + 10 * (s - 100), "oracle": 30 + 2 * (s - 100)})
              for s in (100, 101, 102)}  # fmt: skip
    for seed, world in worlds.items():
        world["em_steps"] = {
            arm: {str(step): {"bm25": em * step / 100 + seed - 100, "dense": 1.0} for step in (50, 100)}
            for arm, em in (("simulator", 60), ("knowing", 40))
        }
    figures = controls.summarize(worlds, ARGS)
    # knowing 40, 50, 60 against the oracle's 30, 32, 34: differences 10, 18, 26, mean 18, sd 8, standard error
    # 4.6188, t(0.975, 2) = 4.3027: 18 -+ 19.873.
    assert figures["knowing_em_bm25_mean"] == 50.0 and figures["knowing_em_bm25_min"] == 40.0
    assert figures["oracle_em_bm25_mean"] == 32.0 and figures["knowing_over_oracle_mean"] == 18.0
    assert (figures["knowing_over_oracle_ci_low"], figures["knowing_over_oracle_ci_high"]) == (-1.87, 37.87)
    assert figures["knowing_share_of_bm25_loop_gain"] == 0.667  # (50 - 10) / (70 - 10)
    assert set(figures["minus"]["knowing"]) == {"empty", "noisy", "best control", "simulator", "oracle", "bm25", "base"}
    # EM against steps, the base at step 0: the simulator's 30 + (seed - 100) at step 50, mean 31.
    assert controls.em_steps_mean(worlds, "simulator", "bm25") == {0: 10.0, 50: 31.0, 100: 61.0}
    assert controls.em_steps_mean(worlds, "oracle", "bm25") == {}  # no checkpoint kept
    lines = controls.doc_lines(figures)
    assert "| arm | 0 | 50 | 100 |" in lines and "| knowing | 10.0 | 21.0 | 41.0 |" in lines
    # dense, half of each: 5, 9, 13, mean 9, standard error 2.3094
    assert (
        "| oracle | no measurable difference (+18.0; -1.9 to +37.9) | no measurable difference (+9.0; -0.9 to +18.9) |"
        in lines
    )
    out = tmp_path / "page.md"
    _write_doc(out, figures)  # a development block, and the plot beside the page
    assert "<!-- development -->" in out.read_text() and "<!-- results -->" not in out.read_text()
    assert (tmp_path / "page" / "em_steps_development.png").stat().st_size > 1000


def test_the_page_tabulates_each_arms_answer_in_results_and_query_naming() -> None:
    worlds = {
        s: _world(s, {"base": 10, "simulator": 60, "empty": 5, "random": 8, "noisy": 12, "bm25": 70}) for s in (0, 1)
    }
    for world in worlds.values():
        world["answer_in_results"] = {arm: {"share": 0.5, "searches": 4} for arm in ("simulator", "noisy", "bm25")}
        world["query_naming"] = {arm: {"exact": {"share": 0.8, "em": 0.75}} for arm in ("base", "rl_search", "noisy")}
    lines = controls.doc_lines(controls.summarize(worlds, ARGS))
    assert "| world | simulator | bm25 | noisy |" in lines and "| 1 | 0.50 | 0.50 | 0.50 |" in lines
    # The simulator arm's policy is the quickstart's rl_search; arms without a naming record are left out.
    assert "| world | base | simulator | noisy |" in lines
    assert "| 0 | 0.80 / 0.75 | 0.80 / 0.75 | 0.80 / 0.75 |" in lines


def test_the_reporting_worlds_write_the_readme_headline_with_the_pre_registered_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- headline -->\nold\n<!-- /headline -->\n\n## Using it\n")
    monkeypatch.setattr(controls, "README", readme)
    arms = {"base": 10, "simulator": 60, "oracle": 30, "bm25": 70, "empty": 5}
    # knowing minus oracle 10, 12, ..., 20 (mean 15, sd 3.742, t(0.975, 5) 2.5706: 15 -+ 3.93): above 0
    worlds = {s: _world(s, {**arms, "knowing": 40 + 2 * (s - 200)}) for s in controls.REPORTING_WORLDS}
    figures = controls.summarize(worlds, ARGS)
    _write_doc(tmp_path / "controls.md", figures)
    text = readme.read_text()
    assert "old" not in text and text.endswith("<!-- /headline -->\n\n## Using it\n")
    assert "over the 6 pre-registered worlds (200, 201, 202, 203, 204, 205)" in text
    assert "| RL against a simulator that knows the world (never fit on RL's people) | 45.0 ± 3.7 |" in text
    assert "knowing simulator minus oracle: +15.0 (+11.1 to +18.9)" in text
    assert "teaches more than showing the answer does" in text
    # the same difference in one world only of six: the interval holds 0
    for seed in controls.REPORTING_WORLDS[1:]:
        worlds[seed]["em"]["knowing"] = dict(worlds[seed]["em"]["oracle"])
    figures = controls.summarize(worlds, ARGS)
    assert "teaches no more than an answer dispenser (no measurable difference)" in controls.headline(figures)[-1]
    development = {s: _world(s, {**arms, "knowing": 50}) for s in (100, 101)}
    _write_doc(tmp_path / "dev.md", controls.summarize(development, ARGS))  # fmt: skip
    assert "teaches no more" not in readme.read_text()  # development worlds never touch the README
    # five of the six reporting worlds: neither the doc nor the README is written
    partial = {s: worlds[s] for s in controls.REPORTING_WORLDS[:5]}
    _write_doc(tmp_path / "partial.md", controls.summarize(partial, ARGS))  # fmt: skip
    assert not (tmp_path / "partial.md").exists() and "teaches no more" not in readme.read_text()


def test_worlds_without_the_bm25_arm_are_summarized_without_its_share() -> None:
    worlds = {s: _world(s, {"base": 10, "simulator": s - 40, "noisy": 4, "answerless": 2}) for s in (100, 101)}
    figures = controls.summarize(worlds, ARGS)
    assert figures["sim_share_of_bm25_loop_gain"] is None
    assert set(figures["sim_minus"]) == {"noisy", "answerless", "best control", "base"}
    assert figures["sim_over_best_control_mean"] == 56.5
    assert not any(line.startswith("| bm25 ") for line in controls.doc_lines(figures))


def test_an_arm_one_world_lacks_is_left_out_of_the_summary_and_the_best_control() -> None:
    worlds = {
        0: _world(0, {"base": 10, "simulator": 60, "empty": 5, "random": 8, "noisy": 12, "answerless": 50, "bm25": 70}),
        1: _world(1, {"base": 20, "simulator": 50, "empty": 30, "random": 10, "noisy": 25, "bm25": 60}),
    }
    figures = controls.summarize(worlds, ARGS)
    assert "answerless" not in figures["rows"] and "answerless" not in figures["controls"]
    assert "answerless" not in figures["em_mean"] and "answerless" not in figures["sim_minus"]
    assert figures["sim_over_best_control_mean"] == 34.0  # 60 - 12 (noisy, not answerless's 50) and 50 - 30 (empty)
    assert not any("answerless" in line for line in controls.doc_lines(figures))
    worlds[1]["em"]["answerless"] = {"bm25": 40.0, "dense": 20.0}
    figures = controls.summarize(worlds, ARGS)
    assert figures["controls"][-1] == "answerless" and figures["sim_over_best_control_mean"] == 10.0


def test_aggregate_summarizes_finished_worlds_with_the_commit_and_cpu_each_ran_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for seed, commit, kernels in ((0, "aaa1111", "AVX2"), (1, "aaa1111", "AVX2"), (2, "bbb2222", "AVX512")):
        world = {**_world(seed, {"base": 10, "simulator": 60 + seed, "empty": 5, "random": 8, "noisy": 30,
                                 "bm25": 70}), "commit": commit, "arm_s": {},
                 "machine": {"cpu": "AMD EPYC", "cpu_capability": kernels}}  # fmt: skip
        (tmp_path / f"world_{seed}").mkdir()
        (tmp_path / f"world_{seed}" / "controls.json").write_text(json.dumps(world))
    out = tmp_path / "page.md"
    controls.main(["--seeds", "0", "1", "2", "--aggregate", "--run-dir", str(tmp_path), "--out", str(out)])
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["sim_over_best_control_mean"] == 31.0  # 30, 31, 32 over noisy's 30
    assert figures["provenance"]["commit"] == "aaa1111 (worlds 0, 1), bbb2222 (world 2)"
    worlds = {2: {**json.loads((tmp_path / "world_2" / "controls.json").read_text()),
                  "arm_runs": {"noisy": {"commit": "bbb2222"}, "answerless": {"commit": "ccc3333"}}}}  # fmt: skip
    assert controls.world_commits(worlds) == "bbb2222 + the answerless arm at ccc3333"
    assert figures["provenance"]["cpu"] == "AMD EPYC, AVX2 kernels (worlds 0, 1), AMD EPYC, AVX512 kernels (world 2)"
    assert "then the same with `--aggregate`" in out.read_text()
    with pytest.raises(SystemExit, match="world 3 has no"):
        controls.main(["--seeds", "3", "--aggregate", "--run-dir", str(tmp_path), "--out", str(out)])


def _record(seed: int, arms: dict[str, float], simulator: str = "s1", base_em: float = 10.0) -> dict:
    world = _world(seed, {"base": base_em, "simulator": 60, **arms})
    runs = {arm: {"fingerprint": f"fp-{arm}", "commit": "old1234", "s": 5.0} for arm in arms}
    shown = {arm: {"share": 0.5, "searches": 10} for arm in arms}
    naming = {arm: {"exact": {"share": 0.25, "em": 0.5}} for arm in ("base", "rl_search", *arms)}
    fingerprints = {"world": "w", "base": "b", "simulator": simulator, "train": "t"}
    return {**world, "arm_runs": runs, "arm_s": {a: 5.0 for a in arms}, "answer_in_results": shown,
            "fingerprints": fingerprints, "query_naming": naming}  # fmt: skip


def test_the_reporting_records_render_the_pages_results_and_the_readme_headline_as_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = Path(__file__).resolve().parents[2]
    readme = tmp_path / "README.md"
    readme.write_text((repo / "README.md").read_text())
    monkeypatch.setattr(controls, "README", readme)
    doc = tmp_path / "controls.md"
    doc.write_text((repo / "docs" / "controls.md").read_text())
    seeds = [str(seed) for seed in controls.REPORTING_WORLDS]
    argv = ["--seeds", *seeds, "--aggregate", "--run-dir", str(repo / "docs" / "controls" / "reporting")]
    figures = controls.main([*argv, "--out", str(doc)])
    assert figures["world_set"] == "reporting"

    def block(text: str, name: str) -> list[str]:
        return text.split(f"<!-- {name} -->")[1].split(f"<!-- /{name} -->")[0].splitlines()

    committed = block((repo / "docs" / "controls.md").read_text(), "results")
    # Every table and sentence as committed; the first line names the commit and machine, in the words of
    # the runner that renders it.
    assert block(doc.read_text(), "results")[2:] == committed[2:]
    assert "Measured at commit f0358f4 on AMD EPYC, AVX2 kernels" in committed[1]
    assert block(readme.read_text(), "headline") == block((repo / "README.md").read_text(), "headline")


def test_the_development_records_render_the_pages_block_and_pick_the_quickstarts_simulator(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    doc = tmp_path / "controls.md"
    doc.write_text((repo / "docs" / "controls.md").read_text())
    argv = ["--seeds", "100", "101", "102", "--aggregate", "--run-dir", str(repo / "docs" / "controls" / "development")]
    figures = controls.main([*argv, "--out", str(doc)])
    assert figures["world_set"] == "development"

    def block(text: str) -> list[str]:
        return text.split("<!-- development -->")[1].split("<!-- /development -->")[0].splitlines()

    committed = block((repo / "docs" / "controls.md").read_text())
    assert block(doc.read_text())[2:] == committed[2:] and "Measured at commit f0358f4" in committed[1]
    # The rule written before these runs: the knowing simulator is the quickstart's default if its arm's mean
    # held-out BM25 EM over the development worlds is no more than 5 points below the simulator arm's.
    knowing_wins = figures["knowing_em_bm25_mean"] >= figures["sim_em_bm25_mean"] - 5
    assert load_recipe(QuickstartRecipe, None, []).simulator == ("knowing" if knowing_wins else "fit")


def test_arms_not_run_are_carried_from_a_record_of_the_same_world_and_base() -> None:
    earlier = _record(0, {"empty": 5, "random": 8, "noisy": 40, "answerless": 4, "bm25": 70})
    result = _record(0, {"noisy": 12}, simulator="s2")
    controls.carry_arms(result, earlier, "docs/controls/old")
    # The simulator changed, so the earlier noisy arm is not this world's; the others are carried.
    assert result["em"]["noisy"]["bm25"] == 12
    assert set(result["em"]) == {"base", "simulator", "noisy", "empty", "random", "answerless", "bm25"}
    assert result["arm_runs"]["bm25"] == {"fingerprint": "fp-bm25", "commit": "old1234", "s": 5.0,
                                          "borrowed_from": "docs/controls/old"}  # fmt: skip
    assert result["answer_in_results"]["empty"] == {"share": 0.5, "searches": 10}
    assert result["query_naming"]["empty"] == {"exact": {"share": 0.25, "em": 0.5}}
    assert "the bm25 arm at old1234" in controls.world_commits({0: {**result, "commit": "new5678"}})
    without_noisy = _record(0, {}, simulator="s2")
    controls.carry_arms(without_noisy, earlier, "")
    assert "noisy" not in without_noisy["em"] and "bm25" in without_noisy["em"]
    other_base = {**_record(0, {}), "fingerprints": {**earlier["fingerprints"], "base": "x"}}
    for other in (_record(0, {}, base_em=11.0), other_base):
        with pytest.raises(SystemExit, match="world 0: docs/controls/old's record is of another world or base"):
            controls.carry_arms(other, earlier, "docs/controls/old")


def test_compare_pairs_the_arms_that_moved_against_earlier_records_of_the_same_bases(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, noisy, simulator in (("now", 4, 60), ("before", 30, 58)):
        for seed in (0, 1, 2):
            world = {**_world(seed, {"base": 10, "simulator": simulator + seed, "empty": 5, "noisy": noisy + seed}),
                     "commit": name, "arm_s": {}, "machine": {"cpu": "AMD EPYC"}}  # fmt: skip
            (tmp_path / name / f"world_{seed}").mkdir(parents=True)
            (tmp_path / name / f"world_{seed}" / "controls.json").write_text(json.dumps(world))
    out = tmp_path / "page.md"
    run = ["--seeds", "0", "1", "2", "--aggregate", "--run-dir", str(tmp_path / "now"), "--out", str(out)]
    controls.main([*run, "--compare", str(tmp_path / "before")])
    versus = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["versus"]
    # Only the arms that moved: empty is the same run in both.
    assert versus["diffs"] == {"simulator": {"bm25": [2, 2, 2], "dense": [1.0, 1.0, 1.0]},
                               "noisy": {"bm25": [-26, -26, -26], "dense": [-13.0, -13.0, -13.0]}}  # fmt: skip
    assert versus["commit"] == "before"
    assert "| noisy | -26.0 (-26.0 to -26.0) | -13.0 (-13.0 to -13.0) |" in out.read_text()
    before = tmp_path / "before" / "world_1" / "controls.json"
    before.write_text(json.dumps({**json.loads(before.read_text()), "em": {"base": {"bm25": 1, "dense": 1}}}))
    with pytest.raises(SystemExit, match="world 1's base is not this run's"):
        controls.main([*run, "--compare", str(tmp_path / "before")])
    with pytest.raises(SystemExit):  # argparse: no records there
        controls.main([*run, "--compare", str(tmp_path / "nowhere")])


@pytest.mark.slow
@pytest.mark.timeout(1500)  # a whole pipeline for a step or two, eight arms: minutes on a busy 2-core machine
def test_smoke_trains_every_arm_on_its_own_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    controls.main(["--smoke", "--run-dir", str(tmp_path), "--threads", "1"])
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # the JSON is the last line
    assert set(figures) >= KEYS and figures["smoke"] is True and figures["seeds"] == [0]
    world = tmp_path / "world_0"
    kinds = {"knowing": "simulator", "oracle": "oracle", "bm25": "bm25", "empty": "empty", "random": "random",
             "noisy": "simulator", "answerless": "answerless"}  # fmt: skip
    quickstart_rl = [json.loads(line) for line in (world / "quickstart" / "train" / "metrics.jsonl").open()]
    for arm, kind in kinds.items():
        engines = json.loads((world / "train" / arm / "cost.json").read_text())["engines"]
        assert [usage["kind"] for usage in engines.values()] == [kind], arm
        rows = [json.loads(line) for line in (world / "train" / arm / "metrics.jsonl").read_text().splitlines()]
        assert [row["step"] for row in rows] == [1, 2], arm  # the same budget for every arm
        # The knowing arm's curriculum is the quickstart's RL run's; the noisy arm asks for noise on every search.
        p_noise = {row["curriculum/p_noise"] for row in (quickstart_rl if arm == "knowing" else rows)}
        assert {row["curriculum/p_noise"] for row in rows} == ({1.0} if arm == "noisy" else p_noise), arm
        assert "threads: 1" in (world / "train" / arm / "recipe.yaml").read_text().splitlines()
        summary = json.loads((world / "eval" / arm / "summary.json").read_text())
        assert set(summary["rows"]) == {"bm25", "dense"}, arm
    assert set(figures["by_world"]["0"]["em"]) == {"base", "simulator", *kinds}
    # The knowing simulator: its own model in the loop, and its fidelity to BM25 measured before RL.
    knowing_rl = (world / "train" / "knowing" / "recipe.yaml").read_text()
    assert (
        str(world / "knowing" / "simulator") in knowing_rl and str(world / "quickstart" / "simulator") not in knowing_rl
    )
    fidelity = figures["by_world"]["0"]["fidelity"]
    assert fidelity["questions"] == 8 and fidelity["bm25"]["answer_shown"] == 1.0
    assert fidelity["knowing"].keys() == {"answer_shown", "on_topic", "documents"}
    # Nothing the knowing simulator was trained on holds a held-out person (its reading, its SFT pairs), and no
    # SFT pair asks about, or shows, one of RL's people.
    from simsearch.tinyworld.knowing import names, reading_passages
    from simsearch.tinyworld.world import build_world

    built = build_world(seed=0, n_entities=300, n_train_entities=200, n_background_entities=900)
    held_out, rl_people = built.people("test"), built.people("train")
    read = reading_passages(built, knowing.KNOWING_FIT_PEOPLE)
    assert not any(names(p.text, name) for p in read for name in held_out)  # as words: "Tasburg" is no "Tasbur"
    pairs = (world / "knowing" / "collect" / "train.jsonl").read_text()
    assert pairs and not any(names(pairs, name) for name in held_out | rl_people)
    # The design's SFT file: those pairs, then reading (RL's and the fit people's articles), no held-out name.
    sft = (world / "knowing" / f"sft-{controls.KNOWING_DESIGN}.jsonl").read_text()
    assert sft.startswith(pairs) and len(sft) > len(pairs) and not any(names(sft, name) for name in held_out)
    # EM against steps: every checkpoint of the step arms kept and evaluated (smoke: steps 1 and 2).
    steps = figures["by_world"]["0"]["em_steps"]
    assert steps.keys() == set(controls.STEP_ARMS) and all(curve.keys() == {"1", "2"} for curve in steps.values())
    assert steps["bm25"]["2"] == figures["by_world"]["0"]["em"]["bm25"]  # the last checkpoint is the final policy
    assert (tmp_path / "controls" / "em_steps_development.png").is_file()
    assert figures["by_world"]["0"]["sim_rl_searches_by_kind"].keys() == {"simulator"}
    shown = figures["by_world"]["0"]["answer_in_results"]
    assert shown.keys() == {"simulator", *kinds} and shown["answerless"]["share"] == 0.0
    # The noisy arm takes train.yaml's simulator as the quickstart's RL did: answers redacted from noise.
    for train_run in (world / "train" / "noisy", world / "quickstart" / "train"):
        assert "noisy_answers: redact" in (train_run / "recipe.yaml").read_text()
    naming = figures["by_world"]["0"]["query_naming"]
    assert naming.keys() == {"base", "rl_search", *kinds} and naming["bm25"]["exact"].keys() == {"share", "em"}
    # Run again in the same directory: every stage is reused, and the record keeps the first run's times.
    first = json.loads((world / "controls.json").read_text())
    controls.main(["--smoke", "--run-dir", str(tmp_path), "--threads", "1"])
    again = json.loads((world / "controls.json").read_text())
    assert again["arm_runs"] == first["arm_runs"] and again["em"] == first["em"]
    assert again["quickstart_wall_s"] == first["quickstart_wall_s"] > 0
    # One arm run again: the others come from the record already there.
    controls.main(["--smoke", "--run-dir", str(tmp_path), "--threads", "1", "--arms", "empty"])
    once_more = json.loads((world / "controls.json").read_text())
    assert once_more["em"] == first["em"] and once_more["arm_runs"] == first["arm_runs"]
    # The page went to the run directory, not to docs/, with the commit and machine it ran on.
    page = (tmp_path / "controls.md").read_text()
    assert "smoke: a pipeline check" in page and "Measured at commit" in page
    # benchmarks/naming.py probes every policy of the run, and trains the noisy arm again under another seed.
    capsys.readouterr()
    naming_probe.main(["--smoke", "--controls", str(tmp_path), "--threads", "1", "--reseed", "7"])
    probed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["by_world"]["0"]
    assert probed["policies"].keys() == {"base", "simulator", *kinds, "noisy_seed7"}
    probes = {f"{engine}/{dataset}" for engine in ("none", "noisy", "bm25") for dataset in ("train", "heldout")}
    assert all(cells.keys() == probes for cells in probed["policies"].values())
    reseeded = world / "train" / "noisy_seed7"
    assert "seed: 7" in (reseeded / "recipe.yaml").read_text().splitlines()
    # every trajectory saved: 2 steps x 2 prompts x 2 rollouts
    assert sum(half["samples"] for half in probed["training"]["noisy_seed7"].values()) == 8
    probe = world / "naming" / "noisy_seed7"
    assert set(json.loads((probe / "summary.json").read_text())["rows"]) == {"none", "noisy", "bm25"}
    # The noisy probe is the noisy arm's engine: the simulator, noise on every search, answers redacted.
    assert "noisy_answers: redact" in (probe / "recipe.yaml").read_text()
