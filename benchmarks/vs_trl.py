"""Seconds per GRPO step: simsearch's trainer against TRL's GRPOTrainer, on the same job.

Run:  python -m benchmarks.vs_trl [--steps 6] [--prompts 8] [--group 8]
          [--new-tokens 32] [--threads 2]
Needs TRL, which simsearch does not depend on: `pip install trl` (measured with trl 1.16.0).

The job, identical on both sides, in one process and one run:

- a tiny Qwen2 (hidden 128, 4 layers, the 0.92M-parameter size of the quickstart's base policy)
  with random weights, saved once and loaded by both trainers from the same directory;
- single-turn GRPO: `--prompts` questions per step rendered with Search-R1's prompt, `--group`
  samples each at temperature 1, at most `--new-tokens` new tokens; simsearch with
  `rollout.max_turns=0` (one generation, no search), TRL with `max_completion_length`;
- reward: F1 of the last `<answer>` against the gold answers (simsearch's reward function in
  both), group-normalized advantages (`scale_rewards="group"`);
- token-mean loss (TRL's "dapo", simsearch's "token-mean"), clip 0.2, KL to a frozen reference
  0.001 (k3 on both sides), one update per batch (on-policy), the whole batch in one forward;
- AdamW lr 1e-5, betas (0.9, 0.999), no weight decay, constant schedule, gradient clip 1.0.

The tokenizer has no tag tokens (tags are several BPE pieces), so a random model almost never
writes a stop string and both sides generate to the length limit or an eos; the mean completion
length of each side is printed so the work can be compared. A random model earns reward 0, so
every group is flat: both sides still run the full forward/backward (the KL term keeps simsearch
from skipping flat rows). Seconds per step are wall-clock means over the steps after the first
(warm-up). The last line is JSON: {"simsearch_s_per_step", "trl_s_per_step", "ratio", ...}.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from simsearch.config import TrainRecipe, load_recipe
from simsearch.data.templates import SEARCH_R1_TEMPLATE, render_prompt
from simsearch.models import EOS_TOKEN, PAD_TOKEN, build_tiny_model, save_tiny, train_tokenizer
from simsearch.policy.rewards import f1_rewards
from simsearch.training.runlog import read_metrics

if TYPE_CHECKING:
    from trl import GRPOConfig

LR = 1e-5
KL = 0.001


def build_job(root: Path, prompts: int, steps: int) -> tuple[Path, list[dict]]:
    """Writes the tiny model and the QA rows; returns the model directory and the rows."""
    rows = [
        {"id": str(i), "question": f"Which city hosts the festival number {i}?", "golden_answers": [f"city {i}"]}
        for i in range(prompts * steps)
    ]
    texts = [SEARCH_R1_TEMPLATE.format(question=r["question"]) for r in rows] * 5
    tokenizer = train_tokenizer(texts, vocab_size=1000, special_tokens=(PAD_TOKEN, EOS_TOKEN))
    model = build_tiny_model(tokenizer, hidden=128, layers=4, heads=4, kv_heads=2, ffn=384, seed=0)
    save_tiny(model, tokenizer, root / "model")
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "corpus.jsonl").write_text(json.dumps({"id": "0", "contents": '"Doc"\nunused'}) + "\n")
    return root / "model", rows


def run_simsearch(root: Path, model: Path, args: argparse.Namespace) -> dict[str, float]:
    from simsearch.experiments import stages

    overrides = {
        "run_dir": root / "simsearch_run",
        "policy.model.path": model,
        "policy.batch_size": args.prompts * args.group,
        "data.train": f"[{root / 'train.jsonl'}]",
        "search.kind": "bm25",  # never called: max_turns=0 is a single answer turn
        "search.corpus": root / "corpus.jsonl",
        "sampling.temperature": 1.0,
        "sampling.max_new_tokens": args.new_tokens,
        "rollout.max_turns": 0,
        "rollout.group_size": args.group,
        "reward.weights": "{f1: 1.0}",
        "algorithm.estimator": "grpo",
        "algorithm.kl_coef": KL,
        "algorithm.kl_estimator": "k3",
        "algorithm.entropy_coef": 0.0,
        "algorithm.loss_agg": "token-mean",
        "optim.lr": LR,
        "optim.weight_decay": 0.0,
        "optim.schedule": "constant",
        "optim.grad_clip": 1.0,
        "curriculum.kind": "constant",
        "steps": args.steps,
        "prompts_per_step": args.prompts,
        "micro_batch_size": args.prompts * args.group,
        "save_every": 0,
        "tensorboard": "false",
        "resume": "false",
    }
    recipe = load_recipe(TrainRecipe, None, [f"{k}={v}" for k, v in overrides.items()])
    stages.train(recipe)
    rows = read_metrics(recipe.run_dir)[1:]  # the first step warms up
    return {
        "s_per_step": sum(r["time/step_s"] for r in rows) / len(rows),
        "completion_len": sum(r["rollout/response_len"] for r in rows) / len(rows),
    }


def trl_config(root: Path, args: argparse.Namespace) -> GRPOConfig:
    """TRL's settings for the job the module docstring describes, on the CPU."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(root / "trl_run"),
        per_device_train_batch_size=args.prompts * args.group,  # one optimizer step per generation batch
        gradient_accumulation_steps=1,
        num_generations=args.group,
        max_completion_length=args.new_tokens,
        temperature=1.0,
        top_p=1.0,
        beta=KL,
        epsilon=0.2,
        num_iterations=1,
        loss_type="dapo",
        scale_rewards="group",
        learning_rate=LR,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        shuffle_dataset=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )


def run_trl(root: Path, model: Path, rows: list[dict], args: argparse.Namespace) -> dict[str, float]:
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model)
    dataset = Dataset.from_list(
        [
            {"prompt": render_prompt(r["question"], template="search-r1"), "golden_answers": r["golden_answers"]}
            for r in rows
        ]
    )

    def f1_reward(completions: list[str], golden_answers: list[list[str]], **_: object) -> list[float]:
        return f1_rewards(completions, golden_answers)

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_step_begin(self, *_: object, **__: object) -> None:
            if not self.ends:
                self.ends.append(time.perf_counter())

        def on_step_end(self, *_: object, **__: object) -> None:
            self.ends.append(time.perf_counter())

    clock = StepClock()
    config = trl_config(root, args)
    trainer = GRPOTrainer(
        model=str(model), reward_funcs=f1_reward, args=config, train_dataset=dataset, processing_class=tokenizer,
        callbacks=[clock],
    )  # fmt: skip
    trainer.train()
    steps = [b - a for a, b in zip(clock.ends, clock.ends[1:])][1:]  # the first step warms up
    lengths = [row["completions/mean_length"] for row in trainer.state.log_history if "completions/mean_length" in row][
        1:
    ]
    return {"s_per_step": sum(steps) / len(steps), "completion_len": sum(lengths) / len(lengths)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model, rows = build_job(root, args.prompts, args.steps)
        ours = run_simsearch(root, model, args)
        theirs = run_trl(root, model, rows, args)
    ratio = ours["s_per_step"] / theirs["s_per_step"]
    print(f"\nGRPO, {args.prompts} prompts x {args.group} samples, <= {args.new_tokens} new tokens, "
          f"{args.threads} threads, mean of steps 2..{args.steps}")  # fmt: skip
    print(f"{'trainer':<12}{'s/step':>10}{'completion tokens':>20}")
    print(f"{'simsearch':<12}{ours['s_per_step']:>10.3f}{ours['completion_len']:>20.1f}")
    print(f"{'trl':<12}{theirs['s_per_step']:>10.3f}{theirs['completion_len']:>20.1f}")
    print(json.dumps({
        "simsearch_s_per_step": round(ours["s_per_step"], 4),
        "trl_s_per_step": round(theirs["s_per_step"], 4),
        "ratio": round(ratio, 3),
        "simsearch_completion_len": round(ours["completion_len"], 1),
        "trl_completion_len": round(theirs["completion_len"], 1),
        "steps": args.steps, "prompts": args.prompts, "group": args.group,
        "new_tokens": args.new_tokens, "threads": args.threads,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
