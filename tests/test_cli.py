"""The CLI dispatches, documents each command, and turns recipe errors into one clear line."""

import subprocess
import sys
from pathlib import Path

import pytest

from simsearch import cli
from simsearch.cli import build_parser, main


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

    monkeypatch.setattr(cli, "run", start_a_group)
    assert cli.main(["train", "recipe.yaml"]) == 0
    assert not dist.is_initialized()
