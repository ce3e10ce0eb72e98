"""Every shipped recipe on this machine, as a newcomer would start it: it can run here (`--check`
stops after the checks), or it is refused in one line, exit status 2, its run directory untouched.

One worker process runs them all through `cli.main` (one torch import instead of forty), each with
its own stdout and stderr. `HF_HUB_OFFLINE=1` makes a hub name that is not cached a refusal on any
machine; the quickstart's stage recipes meet an empty directory, so their inputs are missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from simsearch.cli import recipe_command

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").rglob("*.yaml"))

_WORKER = """
import contextlib, io, json, sys
from simsearch import cli
verdicts = {}
for name, argv in json.loads(sys.argv[1]).items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exit:  # argparse
            code = exit.code
    verdicts[name] = {"code": code, "out": out.getvalue(), "err": err.getvalue()}
print(json.dumps(verdicts))
"""


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT / "recipes"))


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """(working directory, recipe -> {code, out, err}) of `simsearch COMMAND RECIPE run_dir=... --check`."""
    work = tmp_path_factory.mktemp("every_recipe")
    argvs = {}
    for path in RECIPES:
        command = recipe_command(str(path))
        assert command is not None, f"{path}: the first line does not name the command that runs it"
        run_dir = work / "runs" / _name(path).removesuffix(".yaml")
        argvs[_name(path)] = [*command.split("-"), str(path), f"run_dir={run_dir}", "--check"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, json.dumps(argvs)], cwd=work, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return work, json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("path", RECIPES, ids=_name)
def test_every_shipped_recipe_can_run_here_or_is_refused_in_one_line(
    path: Path, verdicts: tuple[Path, dict[str, Any]]
) -> None:
    work, results = verdicts
    verdict = results[_name(path)]
    assert "Traceback" not in verdict["err"], verdict["err"]
    if verdict["code"] == 0:
        assert "can run here (checked; nothing run)" in verdict["out"]
    else:
        lines = verdict["err"].strip().splitlines()
        assert verdict["code"] == 2 and len(lines) == 1 and lines[0].startswith("simsearch: error: "), verdict
    assert not (work / "runs").exists(), "a check wrote into a run directory"


def test_a_gpu_recipe_on_a_machine_without_vllm_names_the_backend(verdicts: tuple[Path, dict[str, Any]]) -> None:
    from simsearch.commands.readiness import installed

    if installed("vllm"):
        pytest.skip("vLLM is installed here")
    _, results = verdicts
    verdict = results["train/zerosearch_qwen2.5-3b-base_grpo.yaml"]
    assert "policy.kind=vllm needs vllm, which is not installed here" in verdict["err"]
