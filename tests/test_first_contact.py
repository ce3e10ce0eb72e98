"""What a researcher meets in the first hour: help that is true, recipes that load, paths checked
before any work, a run directory that never lies about the recipe it ran."""

from __future__ import annotations

import json
import shlex
import socket
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from simsearch import cli
from simsearch.commands import evaluate, recipe_doc
from simsearch.config import EvalDataset, EvalRecipe, TrainRecipe, load_recipe
from simsearch.training.runlog import RECIPE_CHANGES_FILE, read_metrics
from tests.commands.test_train import _overrides, world  # noqa: F401  (world: the tiny policy's fixture)

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").rglob("*.yaml"))
HELP = [["quickstart"], ["train"], ["eval"], ["serve"], ["simulator", "collect"], ["simulator", "finetune"], ["config"]]


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args([*argv, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def _examples(text: str) -> list[list[str]]:
    return [shlex.split(line)[1:] for line in text.splitlines() if line.startswith("  simsearch ")]


# --------------------------------------------------------------------------- help that is true


@pytest.mark.parametrize("argv", HELP, ids=" ".join)
def test_every_help_example_names_existing_files_and_its_recipe_loads(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = _help(argv, capsys)
    examples = _examples(text)
    assert examples, f"simsearch {' '.join(argv)} --help shows no example"
    assert "recipes/simulator" not in text  # a folder that does not exist
    monkeypatch.chdir(ROOT)  # the examples are written from a checkout's root
    for example in examples:
        args = cli.build_parser().parse_args(example)
        assert args.command == argv[0]
        missing = [word for word in example if word.endswith(".yaml") and not Path(word).is_file()]
        assert not missing, f"{example}: no such recipe {missing}"
        if args.command == "config":
            assert cli.main(example) == 0
            continue
        name = "-".join(argv)
        path, overrides = cli._recipe_and_overrides(args)
        overrides += ["smoke=true"] if getattr(args, "smoke", False) else []
        load_recipe(recipe_doc.COMMANDS[name], path, overrides)  # every override accepted


def test_eval_help_offers_the_keys_eval_has(capsys: pytest.CaptureFixture[str]) -> None:
    text = " ".join(_help(["eval"], capsys).split())
    assert "engines.NAME.kind" in text and "search.kind" not in text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("simsearch ")


def test_a_missing_recipe_argument_names_only_the_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["eval"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("the following arguments are required: recipe")


# --------------------------------------------------------------------------- recipes that load, and show


def _command(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    return next(c for c in recipe_doc.COMMANDS if f"simsearch {c.replace('-', ' ')} " in first + " ")


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_recipe_validates_and_shows_resolved(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command = _command(path)
    assert cli.main(["config", command, str(path)]) == 0
    shown = tmp_path / "shown.yaml"
    shown.write_text(capsys.readouterr().out)
    # what `config` prints is the recipe, every default filled in: it loads back to the same one
    schema = recipe_doc.COMMANDS[command]
    assert load_recipe(schema, shown) == load_recipe(schema, path)
    assert set(yaml.safe_load(shown.read_text())) == {f.name for f in fields(schema)}


def test_config_doc_annotates_every_key_and_still_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = ROOT / "recipes" / "train" / "tiny_cpu.yaml"
    assert cli.main(["config", "train", str(recipe), "optim.lr=1e-3", "--doc"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert "  lr: 0.001  # learning rate (the peak, after any warm-up)" in lines
    assert [line for line in lines if "  # " not in line] == []  # every key has its help (tests/test_config_help.py)
    estimator = next(line for line in lines if line.startswith("  estimator:"))
    assert "[grpo | " in estimator and "igpo" in estimator  # allowed values, from ESTIMATORS via the check
    template = next(line for line in lines if line.startswith("  template:"))
    assert "search-r1-brief" in template.split("#")[1]
    (tmp_path / "shown.yaml").write_text(text)
    assert load_recipe(TrainRecipe, tmp_path / "shown.yaml") == load_recipe(TrainRecipe, recipe, ["optim.lr=1e-3"])


def test_config_without_a_recipe_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["config", "serve"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["port"] == 8000 and shown["threads"] == 1 and shown["search"]["kind"] == "bm25"


def test_docs_recipes_md_is_generated_from_the_dataclasses() -> None:
    text = (ROOT / "docs" / "recipes.md").read_text()
    assert text == recipe_doc.markdown(), "stale: python -m simsearch.commands.recipe_doc --write docs/recipes.md"
    assert "| `resume` |" in text and "[SearchConfig](#searchconfig)" in text


def test_an_engine_is_removed_by_override() -> None:
    path = ROOT / "recipes" / "quickstart" / "eval.yaml"
    full = list(load_recipe(EvalRecipe, path).engines)
    assert "dense" in full
    for override in ("~engines.dense", "engines.dense=null"):
        assert list(load_recipe(EvalRecipe, path, [override]).engines) == [e for e in full if e != "dense"]


def test_a_field_that_is_not_optional_cannot_be_removed(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["config", "eval", str(ROOT / "recipes" / "quickstart" / "eval.yaml"), "~rollout"])
    assert code == 2
    assert "~rollout: rollout is not optional" in capsys.readouterr().err


# --------------------------------------------------------------------------- paths, before any work


def _qa(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"id": "a", "question": "q?", "golden_answers": ["x"]}\n')
    return path


@pytest.mark.parametrize(
    ("key", "override"),
    [
        ("search.corpus", "search.corpus={tmp}/no_corpus.jsonl"),
        ("policy.model.path", "policy.model.path={tmp}/no_model"),
        ("data.train[0]", "data.train=[{tmp}/no_qa.jsonl]"),
    ],
)
def test_a_missing_path_is_named_by_its_key_and_nothing_is_written(
    world: Path,  # noqa: F811
    tmp_path: Path,
    key: str,
    override: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = tmp_path / "run"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("seed: 0\n")
    code = cli.main(["train", str(recipe), *_overrides(world, run), override.format(tmp=tmp_path)])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"simsearch: error: {key}=")
    assert not run.exists()


def test_a_flashrag_folder_needs_a_split_and_loads_with_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "nq"
    _qa(folder / "test.jsonl")
    recipe = tmp_path / "eval.yaml"
    recipe.write_text(
        f"run_dir: {tmp_path / 'run'}\npolicy: {{model: {{path: unused}}}}\nbaselines: [direct]\n"
        f"datasets: [{{name: nq, path: {folder}}}]\n"
    )
    assert cli.main(["eval", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "datasets[0].path" in err and "set datasets[0].split" in err and "test.jsonl" in err
    assert cli.main(["eval", str(recipe), "datasets=[{name: nq, path: " + str(folder) + ", split: dev}]"]) == 2
    assert "datasets[0].split='dev'" in capsys.readouterr().err
    examples = evaluate.load_dataset(EvalDataset(name="nq", path=str(folder), split="test"))
    assert [e.id for e in examples] == ["a"]


def test_serve_on_a_busy_port_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "1", "contents": "\\"T\\"\\ntext"}\n')
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        recipe = ROOT / "recipes" / "serve" / "bm25_wiki18.yaml"
        code = cli.main(["serve", str(recipe), f"search.corpus={corpus}", "search.index_dir=''", f"port={port}"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.splitlines() == [captured.err.strip()] and f"port={port}: cannot listen" in captured.err
    assert "http://" not in captured.out  # no URL announced for a server that never started


# --------------------------------------------------------------------------- a run directory never lies


@pytest.mark.slow
def test_resume_with_a_changed_lr_is_refused_and_force_applies_it(
    world: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = tmp_path / "run"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("seed: 0\n")
    base = [str(recipe), *_overrides(world, run, steps=2, save_every=1)]
    assert cli.main(["train", *base]) == 0
    assert (
        capsys.readouterr()
        .out.strip()
        .splitlines()[-1]
        .startswith(f"simsearch train: final checkpoint {run / 'checkpoints' / 'step_0000002' / 'model'}")
    )

    assert cli.main(["train", *base, "optim.lr=3e-3"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "optim.lr (0.001 -> 0.003)" in err[0]
    assert "new run_dir" in err[0] and "resume=force" in err[0]
    assert load_recipe(TrainRecipe, run / "recipe.yaml").optim.lr == 1e-3  # the saved recipe still tells the truth

    assert cli.main(["train", *base, "optim.lr=3e-3", "steps=3", "resume=force"]) == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["optim/lr"] for r in rows] == pytest.approx([1e-3, 1e-3, 3e-3])  # constant schedule: the new peak
    change = json.loads((run / RECIPE_CHANGES_FILE).read_text())
    assert change == {
        "step": 2,
        "changes": {"optim.lr": {"was": 1e-3, "now": 3e-3}, "steps": {"was": 2, "now": 3}},
    }
    assert load_recipe(TrainRecipe, run / "recipe.yaml").optim.lr == 3e-3
