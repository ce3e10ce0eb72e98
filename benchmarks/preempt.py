"""SIGTERM at random steps of a tiny CPU `simsearch train` run: is the resumed run the uninterrupted one?

    python -m benchmarks.preempt                 # 20 runs of 6 steps (docs/reliability.md)
    python -m benchmarks.preempt --tiny          # 2 runs of 4 steps (the test suite's)

A tiny world built in-process (a toy QA set "What color is item N?", a BM25 corpus stating each
answer, a tiny Qwen2 taught for a few seconds to answer red or blue at random, so rewards vary in
every group), then GRPO with dynamic sampling and `save_every=0`: every checkpoint a stopped run
has is the one its stop wrote. One uninterrupted run is the reference. Each stopped run draws
a step k in [2, steps - 1] and a delay of 0-0.1 s (seeded), waits until step k - 1 is logged plus the delay,
sends SIGTERM, waits for the exit, then resumes with the command the stop line printed (a run
whose last step was already in flight finishes instead, exit 0, and is compared as it is).

Per run: `stop_s` (seconds from SIGTERM to exit), `lost` (steps logged but not in the checkpoint
the stop wrote: 0 when the step in flight was finished and saved), `identical` (the resumed run's
metrics other than wall-clock figures, its trajectories and final weights equal the reference's,
bit for bit). The table on stdout; as the last line one JSON object: `resumed_identical` (count),
`runs`, `max_stop_s`, `lost_steps` (sum), `exit_143` (count), `grace_s`, `steps`, `command`,
`provenance`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from benchmarks.benchlib import provenance
from simsearch.data.templates import SEARCH_R1_TEMPLATE, render_prompt
from simsearch.models import build_tiny_model, save_tiny, train_tokenizer
from simsearch.training.checkpoint import latest_checkpoint, load_state
from simsearch.training.runlog import read_metrics

COLORS = ("red", "blue")
QUESTIONS = [(f"What color is item {i}?", COLORS[i % 2]) for i in range(16)]
GRACE_S = 60.0


def build_world(root: Path) -> Path:
    """QA file, corpus and a tiny policy that answers red or blue at random; returns `root`."""
    rows = [{"id": str(i), "question": q, "golden_answers": [a]} for i, (q, a) in enumerate(QUESTIONS)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus = [{"id": str(i), "contents": f'"Item {i}"\nItem {i} is {a}.'} for i, (_, a) in enumerate(QUESTIONS)]
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    answers = [f"<think> ok </think>\n<answer> {color} </answer>" for color in COLORS]
    tokenizer = train_tokenizer([SEARCH_R1_TEMPLATE.format(question=q) for q, _ in QUESTIONS] * 10 + answers * 20,
                                vocab_size=600)  # fmt: skip
    model = build_tiny_model(tokenizer, hidden=32, layers=2, heads=2, kv_heads=1, ffn=64, seed=0)
    sequences = [
        tokenizer.encode(render_prompt(q, template="search-r1"))
        + tokenizer.encode(answer, add_special_tokens=False)
        + [tokenizer.eos_token_id]
        for q, _ in QUESTIONS
        for answer in answers
    ]
    width = max(len(s) for s in sequences)
    inputs = torch.tensor([s + [tokenizer.pad_token_id] * (width - len(s)) for s in sequences])
    optimizer, generator = torch.optim.AdamW(model.parameters(), lr=1e-2), torch.Generator().manual_seed(0)
    for _ in range(40):  # a few seconds: enough for the answer format
        batch = inputs[torch.randint(0, len(sequences), (8,), generator=generator)]
        logits = model(input_ids=batch).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), batch[:, 1:], ignore_index=tokenizer.pad_token_id
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    save_tiny(model.eval(), tokenizer, root / "policy")
    return root


def train_command(world: Path, run: Path, steps: int) -> list[str]:
    """The `simsearch train` command line of one run (a recipe file that only sets the seed, and overrides)."""
    recipe = world / "recipe.yaml"
    recipe.write_text("seed: 0\n")
    overrides = {
        "run_dir": run, "policy.model.path": world / "policy", "data.train": f"[{world / 'train.jsonl'}]",
        "search.kind": "bm25", "search.corpus": world / "corpus.jsonl", "search.top_k": 1,
        "sampling.max_new_tokens": 16, "rollout.max_turns": 1, "rollout.group_size": 4,
        "rollout.max_obs_tokens": 64, "rollout.max_context_tokens": 256, "prompts_per_step": 2,
        "micro_batch_size": 4, "steps": steps, "save_every": 0, "tensorboard": "false", "optim.lr": 1e-3,
        "algorithm.dynamic_sampling": "true", "algorithm.kl_coef": 0.001, "trajectory_every": 1,
        "stop_grace_s": GRACE_S,
    }  # fmt: skip
    return [sys.executable, "-m", "simsearch.cli", "train", str(recipe), *(f"{k}={v}" for k, v in overrides.items())]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def stop_and_resume(command: list[str], run: Path, step: int, delay: float) -> dict[str, Any]:
    """SIGTERM while `step` is in flight (`delay` s after step - 1 is logged), then the printed resume command."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env())
    while process.poll() is None and not (
        (run / "metrics.jsonl").is_file() and len(read_metrics(run)) >= step - 1
    ):  # fmt: skip
        time.sleep(0.01)
    time.sleep(delay)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=GRACE_S + 60)
    stop_s = time.monotonic() - sent
    checkpoint = latest_checkpoint(run)
    saved = int(load_state(checkpoint)["step"]) if checkpoint is not None else 0
    logged = len(read_metrics(run))
    resume = [line.split("resume: ", 1)[1] for line in stderr.splitlines() if "stopped by SIGTERM" in line]
    if resume:  # `simsearch train RUN/recipe.yaml`, run as this interpreter's module
        args = resume[0].split()[1:]
        subprocess.run([sys.executable, "-m", "simsearch.cli", *args], check=True, capture_output=True, env=_env())
    return {"step": step, "stopped_after": saved, "status": process.returncode, "stop_s": stop_s,
            "lost": logged - saved, "resumed": bool(resume)}  # fmt: skip


def fingerprint(run: Path, steps: int) -> tuple[list[dict], str, dict[str, torch.Tensor]]:
    """What must match between runs: metrics without wall-clock figures, trajectories, final weights."""
    rows = [{k: v for k, v in row.items() if not k.startswith(("time/", "perf/")) and "latency" not in k}
            for row in read_metrics(run)]  # fmt: skip
    weights = load_file(run / "checkpoints" / f"step_{steps:07d}" / "model" / "model.safetensors")
    return rows, (run / "trajectories.jsonl").read_text(), weights


def identical(a: tuple[list[dict], str, dict[str, torch.Tensor]], b: tuple[list[dict], str, dict]) -> bool:
    return (
        a[0] == b[0]
        and a[1] == b[1]
        and a[2].keys() == b[2].keys()
        and all(torch.equal(a[2][k], b[2][k]) for k in a[2])
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = _parse(argv)
    runs, steps = (2, 4) if args.tiny else (args.runs, args.steps)
    root = Path(args.out or tempfile.mkdtemp(prefix="preempt_"))
    root.mkdir(parents=True, exist_ok=True)
    world = build_world(root)
    subprocess.run(train_command(world, root / "whole", steps), check=True, capture_output=True, env=_env())
    reference = fingerprint(root / "whole", steps)
    rng = random.Random(args.seed)
    results = []
    for i in range(runs):
        run = root / f"stopped_{i}"
        result = stop_and_resume(train_command(world, run, steps), run, rng.randint(2, steps - 1), rng.uniform(0, 0.1))
        result["identical"] = (result["resumed"] or result["status"] == 0) and identical(
            fingerprint(run, steps), reference
        )
        results.append(result)
        print(f"run {i:2d}  SIGTERM in step {result['step']}  stopped after {result['stopped_after']}  "
              f"exit {result['status']}  stop {result['stop_s']:5.2f} s  lost {result['lost']}  "
              f"identical {result['identical']}", flush=True)  # fmt: skip
    figures = {
        "resumed_identical": sum(r["identical"] for r in results), "runs": runs,
        "max_stop_s": round(max(r["stop_s"] for r in results), 2), "lost_steps": sum(r["lost"] for r in results),
        "exit_143": sum(r["status"] == 143 for r in results), "grace_s": GRACE_S, "steps": steps,
        "command": "python -m benchmarks.preempt" + (" --tiny" if args.tiny else f" --runs {runs} --steps {steps}"),
        "provenance": provenance(),
    }  # fmt: skip
    print(json.dumps(figures))
    return figures


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="stopped runs (default 20)")
    parser.add_argument("--steps", type=int, default=6, help="steps of every run (default 6, at least 3)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the steps and delays of the signals")
    parser.add_argument("--tiny", action="store_true", help="2 runs of 4 steps (the test suite's)")
    parser.add_argument("--out", default="", help="where the world and runs go (default: a new temp dir)")
    args = parser.parse_args(argv)
    if args.steps < 3 or args.runs < 1:
        parser.error("--steps must be >= 3 and --runs >= 1")
    return args


if __name__ == "__main__":
    main()
