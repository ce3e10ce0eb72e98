"""Every example in every `--help` and every command in docs/usage.md, run after `simsearch quickstart
--smoke` in a fresh directory: each ends in success or in one line and exit status 2 with nothing
written; none in a traceback.

The long ones run in their `--check` form (checked, nothing run): a full quickstart, a 40-step
training, a server. One worker process runs them all through `cli.main`, each with its own output.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from simsearch import cli

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
HELP = [["quickstart"], ["train"], ["eval"], ["serve"], ["simulator", "collect"], ["simulator", "finetune"], ["config"]]
PLACEHOLDERS = re.compile(r"RECIPE|RUN_DIR|COMMAND|\[k=v|\[-|…")
SHORT = re.compile(r"(^|\s)(steps=[12]|max_questions=\d+|--check|--smoke)(\s|$)")

_WORKER = """
import contextlib, io, json, os, sys
from simsearch import cli

def files():
    return {str(p): p.stat().st_mtime_ns for p in __import__("pathlib").Path("runs").rglob("*") if p.is_file()}

verdicts = []
for argv in json.loads(sys.argv[1]):
    before = files()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exit:  # argparse: --help, --version
            code = exit.code
    verdicts.append({"argv": argv, "code": code, "out": out.getvalue(), "err": err.getvalue(),
                     "unchanged": files() == before})
print(json.dumps(verdicts))
"""


def help_examples() -> list[str]:
    """The example lines of every command's --help."""
    lines = []
    for argv in HELP:
        text = io.StringIO()
        with contextlib.redirect_stdout(text), pytest.raises(SystemExit):
            cli.build_parser().parse_args([*argv, "--help"])
        lines += [line.strip() for line in text.getvalue().splitlines() if line.startswith("  simsearch ")]
    return lines


def usage_commands() -> list[str]:
    """The `simsearch ...` commands in docs/usage.md's code blocks (continued lines joined), less syntax lines."""
    text = (ROOT / "docs" / "usage.md").read_text().replace("\\\n", " ")
    commands, inside = [], False
    for line in (line.strip().removeprefix("$ ") for line in text.splitlines()):
        if line.startswith("```"):
            inside = not inside
            continue
        words = line.split("#")[0].split() if inside else []
        if len(words) < 2 or words[0] != "simsearch" or words[1].endswith(":") or PLACEHOLDERS.search(line):
            continue
        commands.append(" ".join(words))
    return commands


def cpu_form(command: str) -> list[str]:
    """The argv that runs `command` here: as written when it is short, else with --check (nothing run)."""
    argv = shlex.split(command)[1:]
    if argv[0] in ("config", "view") or argv[0].startswith("--") or SHORT.search(command):
        return argv
    return [*argv, "--check"]


@pytest.fixture(scope="module")
def after_smoke(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh directory holding the recipes and what `simsearch quickstart --smoke` wrote."""
    work = tmp_path_factory.mktemp("help_examples")
    (work / "recipes").symlink_to(ROOT / "recipes")
    smoke = subprocess.run([sys.executable, "-m", "simsearch.cli", "quickstart", "--smoke"], cwd=work,
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert smoke.returncode == 0, smoke.stderr[-3000:]
    return work


def _run(work: Path, argvs: list[list[str]]) -> list[dict[str, Any]]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", _WORKER, json.dumps(argvs)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return list(json.loads(done.stdout.splitlines()[-1]))


def test_every_help_example_and_usage_command_runs_or_says_why_in_one_line(after_smoke: Path) -> None:
    commands = help_examples() + usage_commands()
    assert len(help_examples()) >= 9 and len(usage_commands()) >= 10
    for verdict in _run(after_smoke, [cpu_form(command) for command in commands]):
        shown = f"simsearch {shlex.join(verdict['argv'])}: {verdict['err'][-2000:]}"
        assert "Traceback" not in verdict["err"], shown
        if verdict["code"] != 0:
            assert verdict["code"] == 2 and len(verdict["err"].strip().splitlines()) == 1, shown
            assert verdict["unchanged"], f"{shown}: refused, but it wrote into runs/"
            assert "run `simsearch quickstart --smoke` first" not in verdict["err"], f"{shown}: the advice loops"


def test_the_eval_example_after_a_smoke_run_names_the_overrides_that_make_it_run(after_smoke: Path) -> None:
    argv = ["eval", "recipes/quickstart/eval.yaml", "run_dir=runs/eval_after_smoke", "fidelity_size=0"]
    for _ in range(3):  # the policy, then the simulator: each refusal names the checkpoint the smoke wrote
        (verdict,) = _run(after_smoke, [argv])
        if verdict["code"] == 0:
            break
        advice = re.search(r"set (\S+=\S+step_\d+/model),", verdict["err"])
        assert verdict["code"] == 2 and advice, verdict["err"]
        argv.append(advice.group(1))
    assert verdict["code"] == 0, verdict["err"][-2000:]
    assert (after_smoke / "runs" / "eval_after_smoke" / "table.md").is_file()
