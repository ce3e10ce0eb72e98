"""Pretrain a tiny base model of the quickstart's shape and measure what RL would start from.

    python -m benchmarks.pretrain_base                         # this script's defaults
    python -m benchmarks.pretrain_base --steps 800 --lr 2e-3   # tuning

An experiment bench for base pretraining, not the quickstart's own base (`simsearch quickstart`
builds that one; its recipe and docs/quickstart.md give its settings). This script pretrains on
traces from other worlds (seeds 1..N) with the long Search-R1 prompt and `make_traces`' defaults
(no reading traces, no whole-token years or cities), as the quickstart did before it had those.

Builds the tiny world (seed 0), a 1000-token byte-level BPE, the 0.92M-parameter Qwen2 of the
quickstart's base policy (hidden 128, 4 layers, 4 heads / 2 KV heads, FFN 384, tied), pretrains it on
`tinyworld.traces.make_traces` traces, then rolls it out with `policy.rollout` on the held-out
questions against real BM25 (top 3, one search then the answer, as in RL): greedy exact match,
and the success rate when sampling at temperature 1 in groups of 16 (RL needs most groups to
hold a success). Prints a table, then a JSON line with `pretrain_s`, `greedy_em` and
`sample_success_rate`.

The tokenizer is trained on the world's tokenizer texts plus copies of the Search-R1 prompt
(without a question): a pretrained LM's tokenizer knows English words, and without it the
prompt costs 280 tokens instead of about 120, which doubles the cost of every pretraining and
RL step. World names stay unseen by the tokenizer and split into pieces.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from simsearch.config import RolloutConfig
from simsearch.data.templates import SEARCH_R1_TEMPLATE
from simsearch.eval.metrics import exact_match
from simsearch.generation.hf import HFEngine
from simsearch.models import build_tiny_model, train_tokenizer
from simsearch.policy.rollout import RolloutResult, RolloutSettings, generate_trajectories
from simsearch.retrieval.bm25 import BM25SearchEngine
from simsearch.tinyworld.pretrain import pretrain
from simsearch.tinyworld.traces import Trace, make_copy_drills, make_traces
from simsearch.tinyworld.world import World, build_world
from simsearch.types import SamplingParams, Trajectory

TEMPLATE_COPIES = 100  # enough for every word of the prompt to become one token


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--copy-loss-weight", type=float, default=1.0)
    parser.add_argument("--traces", type=int, default=16000)
    parser.add_argument("--drill-steps", type=int, default=0, help="copy-drill steps (batch 64) before the traces")
    parser.add_argument("--drill-lr", type=float, default=2e-3)
    parser.add_argument("--top-k", type=int, nargs="+", default=[3], help="documents per trace search, split evenly")
    parser.add_argument("--worlds", type=int, default=10, help="pretraining worlds (seeds 1..N), never the RL world")
    parser.add_argument(
        "--query-mix", type=float, nargs=3, default=(1 / 3, 1 / 3, 1 / 3), metavar=("NAME", "WORDS", "MIXED")
    )
    parser.add_argument("--sample-questions", type=int, default=150, help="held-out questions sampled 16 times each")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--template-copies", type=int, default=TEMPLATE_COPIES, help="prompt copies in the tokenizer texts"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0 keeps torch's default")
    parser.add_argument("--save", default="", help="directory to save the pretrained model in")
    return parser.parse_args()


@dataclass
class Setup:
    """The RL world (seed 0), its BM25, the tokenizer and the untrained model."""

    world: World
    search: BM25SearchEngine
    tokenizer: PreTrainedTokenizerFast
    model: PreTrainedModel


@dataclass
class HeldOut:
    """The rollouts after pretraining and their seconds."""

    greedy: RolloutResult
    sampled: RolloutResult
    train_greedy: RolloutResult
    greedy_s: float
    sample_s: float


def build_setup(args: argparse.Namespace) -> Setup:
    """The RL world, its tokenizer (with `--template-copies` prompt copies), its BM25 and the tiny model."""
    world = build_world(seed=0)
    texts = world.texts_for_tokenizer() + [SEARCH_R1_TEMPLATE.format(question="")] * args.template_copies
    tokenizer = train_tokenizer(texts, vocab_size=1000)
    search = BM25SearchEngine.build(world.passages, show_progress=False)
    model = build_tiny_model(tokenizer, hidden=128, layers=4, heads=4, kv_heads=2, ffn=384, seed=args.seed)
    return Setup(world, search, tokenizer, model)


def build_traces(args: argparse.Namespace, tokenizer: PreTrainedTokenizerFast) -> list[Trace]:
    """`--traces` traces from worlds 1..`--worlds`, split evenly over the worlds and the `--top-k` values."""
    traces: list[Trace] = []
    per_call = args.traces // (args.worlds * len(args.top_k))
    for k in range(1, args.worlds + 1):
        other = build_world(seed=k)
        other_search = BM25SearchEngine.build(other.passages, show_progress=False)
        for top_k in args.top_k:
            traces += make_traces(
                other, other_search, tokenizer, n=per_call, seed=1000 * args.seed + 10 * k + top_k, top_k=top_k,
                query_mix=tuple(args.query_mix), examples=other.train + other.test,
            )  # fmt: skip
    return traces


def pretrain_model(
    args: argparse.Namespace, setup: Setup, traces: list[Trace]
) -> tuple[dict[str, list[float]], float, float]:
    """Copy drills (if asked), then the traces; saves with --save. Returns the history, wall and CPU seconds."""
    began, cpu_began = time.perf_counter(), time.process_time()
    if args.drill_steps:
        drills = make_copy_drills(setup.tokenizer, n=64 * args.drill_steps, seed=args.seed)
        drill_history = pretrain(
            setup.model, drills, steps=args.drill_steps, batch_size=64, lr=args.drill_lr, copy_loss_weight=0.0,
            seed=args.seed,
        )  # fmt: skip
        drill_losses = drill_history["losses/policy"]
        print(f"drill loss: first {drill_losses[0]:.3f}, last {_tail(drill_losses):.3f}")
    history = pretrain(
        setup.model, traces, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
        copy_loss_weight=args.copy_loss_weight, seed=args.seed,
    )  # fmt: skip
    pretrain_s = time.perf_counter() - began
    pretrain_cpu_s = time.process_time() - cpu_began
    if args.save:
        setup.model.save_pretrained(args.save)
        setup.tokenizer.save_pretrained(args.save)
    return history, pretrain_s, pretrain_cpu_s


def held_out_rollouts(args: argparse.Namespace, setup: Setup) -> HeldOut:
    """Greedy and sampled (groups of 16) rollouts on the held-out questions, greedy on 300 training ones."""
    engine = HFEngine(setup.model, setup.tokenizer, batch_size=64)
    settings = RolloutSettings(RolloutConfig(template="search-r1", max_turns=1), top_k=3, rendering="search-r1")
    world, tokenizer, search = setup.world, setup.tokenizer, setup.search
    began = time.perf_counter()
    greedy = generate_trajectories(
        world.test, policy=engine, tokenizer=tokenizer, search=search, settings=settings,
        sampling=SamplingParams(temperature=0.0, max_new_tokens=32),
    )  # fmt: skip
    greedy_s = time.perf_counter() - began
    sampled_questions = world.test[: args.sample_questions]
    began = time.perf_counter()
    sampled = generate_trajectories(
        sampled_questions, policy=engine, tokenizer=tokenizer, search=search, settings=settings,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=32, seed=args.seed), group_size=16,
    )  # fmt: skip
    sample_s = time.perf_counter() - began
    train_greedy = generate_trajectories(
        world.train[:300], policy=engine, tokenizer=tokenizer, search=search, settings=settings,
        sampling=SamplingParams(temperature=0.0, max_new_tokens=32),
    )  # fmt: skip
    return HeldOut(greedy, sampled, train_greedy, greedy_s, sample_s)


def _sample_scores(held: HeldOut) -> list[float]:
    return [exact_match(t.answer, t.example.golden_answers) for t in held.sampled.trajectories]


def table_rows(
    args: argparse.Namespace,
    world: World,
    traces: list[Trace],
    history: dict[str, list[float]],
    held: HeldOut,
    seconds: dict[str, float],
) -> list[tuple[str, str]]:
    """The (measure, value) rows of the printed table."""
    lengths = [len(t.input_ids) for t in traces]
    greedy, sampled = held.greedy, held.sampled
    sample_scores = _sample_scores(held)
    groups = [sample_scores[i : i + 16] for i in range(0, len(sample_scores), 16)]
    return [
        ("traces", f"{len(traces)} (mean {sum(lengths) / len(lengths):.0f} tokens, max {max(lengths)})"),
        (
            "pretraining",
            f"{args.steps} steps x {args.batch_size}, lr {args.lr:g}, copy weight {args.copy_loss_weight:g}",
        ),
        (
            "final losses (mean of last 50 steps)",
            f"policy {_tail(history['losses/policy']):.3f}, copy {_tail(history['losses/copy']):.3f}",
        ),
        ("held-out greedy EM", f"{_em(greedy.trajectories):.1%} ({len(greedy.trajectories)} questions)"),
        ("held-out greedy by relation", _by_relation(world, greedy.trajectories)),
        (
            "held-out greedy: searched / answered",
            f"{greedy.metrics['search/calls_per_traj']:.2f} / {greedy.metrics['rollout/answer_rate']:.2f}",
        ),
        ("training-set greedy EM (300 questions)", f"{_em(held.train_greedy.trajectories):.1%}"),
        (
            "held-out sampling success (T=1)",
            f"{sum(sample_scores) / len(sample_scores):.1%} ({len(sample_scores)} rollouts)",
        ),
        ("groups of 16 with a success", f"{sum(max(g) > 0 for g in groups) / len(groups):.1%}"),
        (
            "sampled: searched / answered",
            f"{sampled.metrics['search/calls_per_traj']:.2f} / {sampled.metrics['rollout/answer_rate']:.2f}",
        ),
        (
            "setup / traces / pretrain s",
            f"{seconds['setup']:.1f} / {seconds['traces']:.1f} / {seconds['pretrain']:.1f}",
        ),
        ("pretrain CPU s (all threads)", f"{seconds['pretrain_cpu']:.1f} ({torch.get_num_threads()} threads)"),
        ("greedy / sampled rollout s", f"{held.greedy_s:.1f} / {held.sample_s:.1f}"),
    ]


def print_report(rows: list[tuple[str, str]], greedy: list[Trajectory]) -> None:
    """The table, then six held-out greedy examples."""
    print("\n| measure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    print("\nexamples (held-out, greedy):")
    for trajectory in greedy[:6]:
        query = trajectory.turns[0].query if trajectory.turns else ""
        print(f"  {trajectory.example.question!r} gold {trajectory.example.golden_answers[0]!r}: "
              f"query {query!r} answer {trajectory.answer!r}")  # fmt: skip


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)

    began = time.perf_counter()
    setup = build_setup(args)
    seconds = {"setup": time.perf_counter() - began}
    began = time.perf_counter()
    traces = build_traces(args, setup.tokenizer)
    seconds["traces"] = time.perf_counter() - began
    history, seconds["pretrain"], seconds["pretrain_cpu"] = pretrain_model(args, setup, traces)
    held = held_out_rollouts(args, setup)

    print_report(table_rows(args, setup.world, traces, history, held, seconds), held.greedy.trajectories)
    sample_scores = _sample_scores(held)
    print(json.dumps({
        "pretrain_s": round(seconds["pretrain"], 1),
        "greedy_em": round(_em(held.greedy.trajectories), 4),
        "sample_success_rate": round(sum(sample_scores) / len(sample_scores), 4),
    }))  # fmt: skip


def _em(trajectories: list[Trajectory]) -> float:
    return sum(exact_match(t.answer, t.example.golden_answers) for t in trajectories) / len(trajectories)


def _tail(values: list[float], n: int = 50) -> float:
    return sum(values[-n:]) / len(values[-n:])


def _by_relation(world, trajectories: list[Trajectory]) -> str:
    by: dict[str, list[float]] = {}
    for t in trajectories:
        by.setdefault(world.facts[t.example.id].relation, []).append(exact_match(t.answer, t.example.golden_answers))
    return ", ".join(f"{r} {sum(v) / len(v):.0%}" for r, v in sorted(by.items()))


if __name__ == "__main__":
    main()
