"""The CLI dispatches, documents each command, and turns recipe errors into one clear line."""

import subprocess
import sys
from pathlib import Path

import pytest

from simsearch import cli
from simsearch.cli import build_parser, main
from simsearch.errors import RecipeError


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--help"],
        ["eval", "--help"],
        ["serve", "--help"],
        ["quickstart", "--help"],
        ["simulator", "collect", "--help"],
        ["simulator", "finetune", "--help"],
    ],
)
def test_every_command_has_help_pointing_at_recipes(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "recipe" in out.lower()


def test_recipe_error_is_one_line_and_exit_2(tmp_path, capsys: pytest.CaptureFixture) -> None:
    code = main(["train", str(tmp_path / "missing.yaml")])
    err = capsys.readouterr().err
    assert code == 2
    assert "missing.yaml: recipe file not found" in err and "Traceback" not in err


def test_a_key_of_a_section_given_at_the_top_names_its_place(capsys: pytest.CaptureFixture) -> None:
    # The quickstart's tiny-world settings sit in its `tinyworld` section; a key written flat, as they once were,
    # is refused in one line that gives the key's place in the recipe.
    assert main(["quickstart", "drill_steps=100"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert "key drill_steps: QuickstartRecipe has no drill_steps of its own; it is tinyworld.drill_steps" in err[0]
    assert main(["config", "train", TINY, "lr=0.1"]) == 2
    assert "it is optim.lr: write optim.lr=..." in capsys.readouterr().err
    assert main(["quickstart", "tinyworld.drill_stepz=1"]) == 2  # a slip inside the section: OmegaConf's guess
    assert "Did you mean: 'drill_steps'?" in capsys.readouterr().err


def test_console_script_help_runs_without_heavy_imports() -> None:
    # `simsearch --help` must answer without importing torch.
    code = (
        "import sys; from simsearch.cli import main; \n"
        "try:\n main(['--help'])\nexcept SystemExit: pass\nprint('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("False")


def _eval_recipe(tmp_path: Path, model: Path | str, data: Path) -> str:
    recipe = tmp_path / "eval.yaml"
    recipe.write_text(
        f"run_dir: {tmp_path / 'run'}\npolicy: {{model: {{path: {model}}}}}\nbaselines: [direct]\n"
        f"datasets: [{{name: qa, path: {data}}}]\n"
    )
    return str(recipe)


def test_missing_model_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = tmp_path / "qa.jsonl"
    data.write_text('{"id": "a", "question": "q?", "golden_answers": ["x"]}\n')
    missing = tmp_path / "no_such_model"
    code = main(["eval", _eval_recipe(tmp_path, missing, data)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines() == [
        f"simsearch: error: policy.model.path={str(missing)!r}: no such directory; fix the path, or give a hub "
        "name like Qwen/Qwen2.5-3B"
    ]


def test_missing_qa_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    missing = tmp_path / "nq" / "test.jsonl"
    code = main(["eval", _eval_recipe(tmp_path, "unused", missing)])
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"simsearch: error: datasets[0].path={str(missing)!r}: no such file"
    ]


def test_a_file_the_os_did_not_find_keeps_its_traceback(monkeypatch, capsys: pytest.CaptureFixture) -> None:
    # No loader checked this path first (simsearch would have named it and the fix): a bug.
    def run(args) -> None:
        open("/no/such/dir/opened/by/a/bug")  # noqa: SIM115 - the error is the point

    monkeypatch.setattr(cli, "run", run)
    code = main(["eval", "any.yaml"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" in err and "No such file or directory" in err


def test_train_help_lists_the_choices_from_their_tables(capsys: pytest.CaptureFixture) -> None:
    from simsearch.curriculum.schedules import SCHEDULE_KINDS
    from simsearch.retrieval.recipe import SEARCH_KINDS

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert f"search.kind {'|'.join(SEARCH_KINDS)};" in out.replace("| ", "|")
    assert f"curriculum.kind {'|'.join(SCHEDULE_KINDS)}." in out.replace("| ", "|")


def test_a_command_that_started_torch_distributed_ends_it(monkeypatch) -> None:
    import torch.distributed as dist

    from tests.servers import free_port

    def start_a_group(args) -> None:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)

    barriers: list[int] = []
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: barriers.append(1))
    monkeypatch.setattr(cli, "run", start_a_group)
    assert cli.main(["train", "recipe.yaml"]) == 0
    assert not dist.is_initialized()
    assert barriers == [1]  # a finished command waits for its peers (rank 0 may still be writing)

    def fail_after_starting(args) -> None:
        start_a_group(args)
        raise RecipeError("bad")

    monkeypatch.setattr(cli, "run", fail_after_starting)
    assert cli.main(["train", "recipe.yaml"]) == 2
    assert not dist.is_initialized()
    assert barriers == [1]  # a failed one does not: its peers may never arrive


# --------------------------------------------------------------------------- first-hour slips, each one line

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "recipes" / "train" / "tiny_cpu.yaml")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["train", str(ROOT / "recipes" / "quickstart" / "eval.yaml")],
         "is a recipe for `simsearch eval` (its first line), not for `simsearch train`: run simsearch eval "),
        (["config", "serve", TINY], "is a recipe for `simsearch train` (its first line), not for `simsearch serve`"),
        (["quickstart", "--smoke", "steps=2"],
         "steps is a key of the quickstart's stage recipes, not of the quickstart (its keys: simsearch config "
         "quickstart --doc); --smoke already runs each stage for a step or two, and one stage runs alone as "
         "simsearch train recipes/quickstart/train.yaml steps=2"),
        (["config", "train", TINY, "search.cache=null"],
         "override search.cache=null: search.cache is not optional and cannot be removed; give it a value instead "
         "(e.g. search.cache= for an empty string)"),
        (["config", "train", TINY, "save_every=-1"], "save_every=-1 must be >= 0 (0 = only at the end)"),
        (["config", "train", TINY, "data.val_size=-5"], "data.val_size=-5 must be >= 0 (0 = every validation"),
        (["view", str(ROOT / "docs")], "is not a run directory (it holds none of recipe.yaml, metrics.jsonl"),
    ],
)  # fmt: skip
def test_a_first_hour_slip_is_one_line_saying_what_to_do(
    argv: list[str], said: str, capsys: pytest.CaptureFixture
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and said in err[0], err


def test_an_empty_override_is_an_empty_string_and_config_takes_the_command_as_typed(
    capsys: pytest.CaptureFixture,
) -> None:
    import yaml

    assert main(["config", "train", TINY, "search.cache="]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["search"]["cache"] == ""
    collect = str(ROOT / "recipes" / "quickstart" / "collect.yaml")
    assert main(["config", "simulator", "collect", collect]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["run_dir"] == "runs/quickstart/collect"


def test_a_resumed_run_says_from_which_step(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from simsearch.commands import preflight
    from simsearch.config import FinetuneRecipe, load_recipe

    recipe = load_recipe(FinetuneRecipe, None, [f"run_dir={tmp_path}", "model.path=m", "train_file=t.jsonl"])
    preflight.start_records(recipe, tmp_path, 0, {}, "simulator finetune")
    assert "resumed" not in capsys.readouterr().out
    preflight.start_records(recipe, tmp_path, 7, {}, "simulator finetune")
    assert capsys.readouterr().out.startswith(f"simsearch simulator finetune: resumed from step 7 ({tmp_path};")


def test_a_run_keeps_future_warnings_and_deepspeeds_accelerator_line_off_stderr(monkeypatch) -> None:
    import logging
    import warnings

    logger = logging.getLogger("DeepSpeed")
    monkeypatch.setattr(logger, "filters", [])
    with warnings.catch_warnings():
        cli._quiet_stderr()
        with warnings.catch_warnings(record=True) as caught:
            warnings.warn("going away", FutureWarning, stacklevel=1)
        assert caught == []
    record = logging.LogRecord(
        "DeepSpeed", logging.INFO, "", 0, "Setting ds_accelerator to cpu (auto detect)", (), None
    )
    assert not logger.filter(record)
    record.msg = "DeepSpeed info: version=0.18"
    assert logger.filter(record)
