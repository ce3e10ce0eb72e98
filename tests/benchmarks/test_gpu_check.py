"""benchmarks/gpu_check.sh end to end on CPU with a tiny shape, so the GPU check cannot rot unseen."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simsearch.training.runlog import read_metrics

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.sh"


@pytest.mark.slow  # ~30 s: two train runs (one under DeepSpeed ZeRO-2 in a torchrun process) and the benchmarks
def test_gpu_check_runs_every_part_on_cpu_and_ends_with_its_json(tmp_path: Path) -> None:
    # ZeRO-3 on CPU is tested in tests/commands/test_train.py and the compiled engine in
    # tests/generation/test_hf.py (a compile takes ~40 s on CPU); both are skipped here for time.
    args = ["--device", "cpu", "--shape", "tiny", "--new-tokens", "8", "--batch", "8", "--prompt-tokens", "16",
            "--prompts-per-step", "2", "--quickstart-steps", "2", "--skip", "zero3", "compiled",
            "--work-dir", str(tmp_path)]  # fmt: skip
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=280, env=env,
                          cwd=SCRIPT.parents[1])  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.strip().splitlines()
    facts = next(line for line in lines if line.startswith("gpu_check: Python "))  # libraries may log before it
    assert "torch " in facts and "transformers " in facts and "deepspeed " in facts
    summary = json.loads(lines[-1])
    ran = ("train_hf_step_s", "train_zero2_step_s", "rollout_tokens_per_s", "engine_tokens_per_s",
           "bare_loop_tokens_per_s", "rollout_over_engine", "quickstart_rl_s_per_step", "wall_s")  # fmt: skip
    assert all(math.isfinite(summary[key]) and summary[key] > 0 for key in ran), summary
    assert summary["rollout_over_engine"] == pytest.approx(
        summary["rollout_tokens_per_s"] / summary["engine_tokens_per_s"], rel=1e-9
    )
    for key in ("train_zero3_step_s", "compiled_tokens_per_s", "compiled_over_bare_loop"):
        assert summary[key] is None
    assert set(summary["skipped"]) == {"zero3", "compiled", "vllm"} and summary["failed"] == {}
    # The quickstart part trained its 2 steps and evaluated the policy on BM25 and the simulator.
    assert [r["step"] for r in read_metrics(tmp_path / "quickstart" / "train")] == [1, 2]
    rows = json.loads((tmp_path / "quickstart" / "eval" / "summary.json").read_text())["rows"]
    assert set(rows) == {"bm25", "simulator"} and all(r["results"]["heldout"]["questions"] == 8 for r in rows.values())
    # The parts really trained: 3 hf steps and 2 ZeRO-2 steps, each logged with a finite loss.
    assert [r["step"] for r in read_metrics(tmp_path / "train_hf")] == [1, 2, 3]
    zero2 = read_metrics(tmp_path / "zero2")
    assert [r["step"] for r in zero2] == [1, 2] and all(math.isfinite(r["losses/policy"]) for r in zero2)
    assert 0 < summary["rollout_rows_per_decode_step"] <= 8
    # The context part decoded the rollout's first-turn prompts as they are (of unequal lengths, so
    # padded and masked), cut to equal length, and those three times over.
    shortest, longest = summary["context_prompt_tokens"]
    assert 0 < shortest < longest and summary["long_prompt_tokens"] == 3 * shortest
    for name in ("ragged", "even", "long"):
        assert math.isfinite(summary[f"{name}_tokens_per_s"]) and summary[f"{name}_ms_per_decode_step"] > 0
    assert summary["ragged_over_even"] == pytest.approx(
        summary["ragged_tokens_per_s"] / summary["even_tokens_per_s"], rel=1e-9
    )


def test_first_difference_finds_where_compiled_decoding_parts_from_eager() -> None:
    from benchmarks.gpu_check import first_difference

    assert first_difference([5, 6, 7], [5, 6, 7]) is None
    assert first_difference([5, 6, 7], [5, 9, 7]) == 1
    assert first_difference([4, 6], [5, 6]) == 0
    assert first_difference([5, 6], [5, 6, 7]) == 2  # one row stopped early: it parts where it stopped


def test_the_compiled_part_reports_teacher_forced_agreement(tmp_path: Path, monkeypatch) -> None:
    import torch

    from benchmarks import gpu_check
    from simsearch.tinyworld.world import build_world

    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: model)  # the static-cache loop, eagerly
    args = gpu_check.parse(["--device", "cpu", "--shape", "tiny", "--batch", "4", "--prompt-tokens", "8",
                            "--new-tokens", "5"])  # fmt: skip
    model = gpu_check.build_policy(gpu_check.SHAPES["tiny"], build_world(seed=0), tmp_path / "policy")
    figures = gpu_check.compiled(args, model)
    assert figures["compiled_same_greedy_tokens"] is True and figures["compiled_first_difference"] is None
    assert figures["compiled_positions"] == 4 * 5 and figures["compiled_flips"] == 0
    assert figures["compiled_max_logprob_delta"] < 1e-4 and figures["eager_noise_logprob_delta"] < 1e-4
    assert figures["compiled_agrees"] is True
