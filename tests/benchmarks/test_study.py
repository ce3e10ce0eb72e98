"""benchmarks/study.py: a toy study through the runner: workers' arguments, records, aggregate, render, page."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import study


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("overrides", nargs="*")


def _check(args: argparse.Namespace) -> str:
    return "--scale: must be positive" if args.scale <= 0 else ""


def _world(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    return {"seed": seed, "value": seed * args.scale, "overrides": args.overrides, "smoke": args.smoke}


def _summary(worlds: dict[int, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    del args
    return {"total": sum(world["value"] for world in worlds.values())}


def _page(figures: dict[str, Any], args: argparse.Namespace) -> dict[str, str]:
    del args
    return {"total": f"{figures['total']:.1f}", "table": f"| seeds |\n|---|\n| {figures['seeds']} |"}


TOY = study.Study(name="toy", description="a toy", title="Toy", seeds=(3, 4), world=_world, summary=_summary,
                  page=_page, options=_options, check=_check, done=lambda world: f"value {world['value']}")  # fmt: skip


@pytest.fixture
def in_process_workers(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Each worker's command run in this process (`python -m benchmarks.toy ARGS` is `study.main(TOY, ARGS)`)."""
    commands: list[list[str]] = []

    def launch(command: list[str], log: Any) -> None:
        assert command[1:3] == ["-m", "benchmarks.toy"] and log.writable()
        log.write(f"worker {len(commands)}\n")
        commands.append(command[3:])
        study.main(TOY, command[3:])

    monkeypatch.setattr(study, "launch", launch)
    return commands


def test_each_world_runs_in_a_worker_with_the_command_line_and_writes_its_record(
    tmp_path: Path, in_process_workers: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--run-dir", str(tmp_path), "--out", str(tmp_path / "page.md"), "--seeds", "1", "2", "--scale", "2",
            "--", "a=1", "--b"]  # fmt: skip
    figures = study.main(TOY, argv)
    # the seed and the run directory first: the overrides after `--` stay overrides
    assert in_process_workers[0][:4] == ["--one-world", "1", "--run-dir", str(tmp_path)]
    record = json.loads((tmp_path / "world_2" / "toy.json").read_text())
    assert record["value"] == 4.0 and record["overrides"] == ["a=1", "--b"]
    assert set(record["provenance"]) >= {"commit", "cpu", "cpu_capability"}
    assert figures["total"] == 6.0 and figures["seeds"] == [1, 2] and figures["smoke"] is False
    assert set(figures["provenance"]) == {"commit", "cpu", "torch_threads", "jobs"}
    out = capsys.readouterr().out
    log = tmp_path / "world_2" / "toy.log"  # the study's own log beside its record
    assert "world 2: done, value 4.0" in out and f"(log: {log})" in out and log.read_text() == "worker 1\n"
    study.main(TOY, argv)  # the world again: its earlier log is kept
    assert log.read_text() == "worker 1\nworker 3\n" and json.loads(out.strip().splitlines()[-1]) == figures
    assert (tmp_path / "page.md").read_text() == "# Toy\n\n<!-- total -->6.0<!-- /total -->\n\n" + (
        "<!-- table -->\n| seeds |\n|---|\n| [1, 2] |\n<!-- /table -->\n"
    )


def test_aggregate_and_render_run_nothing_and_write_the_page_again(
    tmp_path: Path, in_process_workers: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "page.md"
    out.write_text("# Toy\n\nProse kept.\n\nTotal: <!-- total -->old<!-- /total -->.\n")
    record = tmp_path / "record.json"
    figures = study.main(TOY, ["--run-dir", str(tmp_path), "--out", str(out), "--seeds", "5", "6"])
    record.write_text("log line\n" + json.dumps(figures) + "\n")
    ran = len(in_process_workers)
    # a finished world's record read back: a worker's value edited there shows, nothing runs again
    path = tmp_path / "world_6" / "toy.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "value": 100.0}))
    again = study.main(TOY, ["--run-dir", str(tmp_path), "--out", str(out), "--seeds", "5", "6", "--aggregate"])
    assert len(in_process_workers) == ran and again["total"] == 105.0
    assert "Total: <!-- total -->105.0<!-- /total -->." in out.read_text()
    rendered = study.main(TOY, ["--out", str(out), "--render", str(record)])
    assert rendered == figures
    text = out.read_text()
    assert text.startswith("# Toy\n\nProse kept.\n\nTotal: <!-- total -->11.0<!-- /total -->.\n")
    assert "| [5, 6] |" in text
    with pytest.raises(SystemExit, match="world 7 has no"):
        study.main(TOY, ["--run-dir", str(tmp_path), "--seeds", "7", "--aggregate"])


def test_smoke_defaults_to_a_temporary_run_and_a_page_in_it(in_process_workers: list[list[str]]) -> None:
    figures = study.main(TOY, ["--smoke"])
    assert figures["seeds"] == [0] and figures["smoke"] is True
    args = study.parse(TOY, ["--smoke"])
    assert args.out == args.run_dir / "toy.md" and "toy-smoke-" in str(args.run_dir)
    assert study.parse(TOY, []).seeds == [3, 4] and study.parse(TOY, []).out == Path("docs/toy.md")


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--scale", "0"], "--scale: must be positive"), (["--render", "missing.json"], "--render missing.json")],
)
def test_bad_options_are_refused_in_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        study.parse(TOY, argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_write_page_keeps_prose_adds_missing_blocks_and_writes_one_line_inline(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "page.md"
    study.write_page(out, "Title", {"a": "one", "b": "x\ny"})
    assert out.read_text() == "# Title\n\n<!-- a -->one<!-- /a -->\n\n<!-- b -->\nx\ny\n<!-- /b -->\n"
    out.write_text("# T\n\nkept\n<!-- b -->\nold\n<!-- /b -->\ntail\n")
    study.write_page(out, "Title", {"b": "new\nlines", "c": "z"})
    assert out.read_text() == "# T\n\nkept\n<!-- b -->\nnew\nlines\n<!-- /b -->\ntail\n\n<!-- c -->z<!-- /c -->\n"


def test_where_names_each_commit_and_cpu_with_its_worlds() -> None:
    worlds = {0: {"provenance": {"commit": "a", "cpu": "EPYC", "cpu_capability": "AVX2"}},
              1: {"provenance": {"commit": "b", "cpu": "EPYC", "cpu_capability": "AVX2"}},
              2: {"provenance": {"commit": "a", "cpu": "EPYC", "cpu_capability": "AVX2"}}}  # fmt: skip
    assert study.where(worlds) == {"commit": "a (worlds 0, 2), b (world 1)", "cpu": "EPYC, AVX2 kernels"}
    assert study.where({3: {}}) == {"commit": "not recorded", "cpu": "a CPU not recorded"}


def test_a_table_and_a_spread_cell_as_the_pages_write_them() -> None:
    assert study.table(["arm", "bm25"], [["knowing", "1.0"], ["oracle", "2.0"]]) == [
        "| arm | bm25 |", "|---|---|", "| knowing | 1.0 |", "| oracle | 2.0 |"
    ]  # fmt: skip
    assert study.table(["", "bm25"], []) == ["| | bm25 |", "|---|---|"]  # an empty corner cell, as toolcall's
    assert study.spread([1.0, 3.0]) == "2.0 ± 1.4"  # the sample sd: sqrt(2)
    assert study.spread([5.0], digits=2) == "5.00 ± 0.00" and study.spread([]) == "-"


def _staged(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Any]:
    """Replaces the experiments' stage runner: each stage's loaded (and edited) recipe is kept, nothing runs,
    and an evaluation's summary.json is written with one row per engine kept."""
    import simsearch.experiments.stages as stages
    from simsearch.config import load_recipe

    loaded: list[Any] = []

    def run_stage(schema: type, recipe_file: Path, overrides: list[str], command: Any, inputs: list[str],
                  edit: Any = None) -> str:  # fmt: skip
        recipe = load_recipe(schema, recipe_file, overrides)
        if edit is not None:
            edit(recipe)
        loaded.append(recipe)
        if schema.__name__ == "EvalRecipe":
            rows = {name: {"average": {"em": 0.25}} for name in recipe.engines}
            Path(recipe.run_dir).mkdir(parents=True)
            (Path(recipe.run_dir) / "summary.json").write_text(json.dumps({"rows": rows}))
        return "fingerprint"

    monkeypatch.setattr(stages, "run_stage", run_stage)
    return loaded


def test_train_runs_the_quickstart_rl_recipe_on_a_base_with_the_arm_on_top(monkeypatch, tmp_path: Path) -> None:
    loaded = _staged(monkeypatch, tmp_path)
    fingerprint = study.train(tmp_path / "arm", seed=7, base="b/base", questions="w/train.jsonl", inputs=["x"],
                              overrides=["steps=9", "rollout.group_size=4"], smoke=True)  # fmt: skip
    recipe = loaded[0]
    assert fingerprint == "fingerprint" and recipe.run_dir == str(tmp_path / "arm") and recipe.seed == 7
    assert recipe.policy.model.path == "b/base" and recipe.data.train == ["w/train.jsonl"]
    # the smoke settings first, the arm's last: its group size wins, the smoke's prompts stay
    assert (recipe.steps, recipe.rollout.group_size, recipe.prompts_per_step) == (9, 4, 2)


def test_evaluate_keeps_the_named_engines_and_points_them_at_the_world(monkeypatch, tmp_path: Path) -> None:
    loaded = _staged(monkeypatch, tmp_path)
    rows = study.evaluate(
        tmp_path / "eval", "p/model", seed=3, datasets={"train": "w/train.jsonl", "heldout": "w/test.jsonl"},
        engines={"bm25": ("w/corpus.jsonl", "i/bm25")}, keep={"noisy": "simulator", "bm25": "bm25"}, limit=5,
        inputs=["x"],
    )  # fmt: skip
    recipe = loaded[0]
    assert set(rows) == {"noisy", "bm25"} and set(recipe.engines) == {"noisy", "bm25"}
    assert recipe.engines["noisy"].kind == "simulator"  # kept under its new name
    assert (recipe.engines["bm25"].corpus, recipe.engines["bm25"].index_dir) == ("w/corpus.jsonl", "i/bm25")
    assert [(d.name, d.path, d.limit) for d in recipe.datasets] == [("train", "w/train.jsonl", 5),
                                                                     ("heldout", "w/test.jsonl", 5)]  # fmt: skip
    assert recipe.baselines == [] and recipe.fidelity_size == 0 and recipe.training_run == ""
    assert recipe.policy.model.path == "p/model" and recipe.seed == 3
    everything = study.evaluate(tmp_path / "all", "p/model", seed=3, datasets={"heldout": "w/test.jsonl"},
                                engines={}, inputs=[])  # fmt: skip
    assert set(everything) == {"simulator", "bm25", "dense", "none"}  # keep=None: every engine of eval.yaml


def test_an_arm_writes_its_edits_as_overrides_in_order_with_the_worlds_values_filled_in() -> None:
    arm = study.Arm({"search.kind": "bm25", "search.corpus": study.Of("corpus"), "curriculum.p_start": "0.0"})
    assert arm.overrides({"corpus": "w/corpus.jsonl", "bm25": "unused"}) == [
        "search.kind=bm25", "search.corpus=w/corpus.jsonl", "curriculum.p_start=0.0",
    ]  # fmt: skip
    assert (arm.simulator, arm.base) == ("simulator", "base") and study.Arm().overrides({}) == []
    with pytest.raises(KeyError, match="corpus"):
        arm.overrides({})


@pytest.mark.parametrize("name", ["ablations", "controls", "turn_rewards"])
def test_every_arm_of_every_study_is_a_valid_edit_of_the_quickstarts_train_recipe(name: str) -> None:
    import importlib

    from simsearch.config import TrainRecipe, load_recipe

    module = importlib.import_module(f"benchmarks.{name}")
    values = {key: "x" for key in ("corpus", "bm25", "knowing")} | {"constant_p": "0.1", "lr": "0.001"}
    for arm_name, arm in module.ARMS.items():
        overrides = arm.overrides(values)
        recipe = load_recipe(TrainRecipe, study.RECIPES / "train.yaml", overrides)  # an unknown key is refused
        for key, value in arm.edits.items():
            got: Any = recipe
            for part in key.split("."):
                got = getattr(got, part)
            written = values[value.name] if isinstance(value, study.Of) else value
            assert str(got).lower() == written.strip("'").lower() or float(got) == float(written), (arm_name, key)
