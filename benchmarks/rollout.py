"""Rollout throughput with and without prefix reuse: trajectories/s of a 2-turn rollout, split
into generation, search and assembly.

Run:  python -m benchmarks.rollout [--protocol tags|tool-call] [--questions 4] [--group-size 16]
          [--repeats 5] [--threads 1]
      python -m benchmarks.rollout --model runs/base   # a model saved by `python -m
                                                       # benchmarks.pretrain_base --save runs/base`

Setup (seed 0): the tiny world (`tinyworld.world`, 940 passages), real BM25 over it
(`retrieval.bm25`, top 3), a 1000-token byte-level BPE and the 0.92M-parameter Qwen2 of the
quickstart's base policy (`models.build_tiny_model`). So that the policy actually searches and
answers, it is first pretrained briefly in its protocol (`tinyworld.traces` traces,
`tinyworld.pretrain.pretrain`, x 16 at lr 3e-3; 40 steps for tags and 160 for tool-call by
default, as Hermes calls take longer to come out well formed: enough to search on most
trajectories, not to answer well; `--pretrain-steps 0` keeps the random weights, which never
search), unless `--model` loads a saved one (for tool-call, its tokenizer's chat template must
take tools, else the rollout raises `ChatTemplateError`). `--threads` sets torch's thread count
(0 = torch's default); on a loaded machine 1 thread can be much faster.

`--protocol tool-call` measures `rollout.protocol: tool-call` (Hermes calls): the BPE carries
`models.TOOL_SPECIAL_TOKENS` and `TINY_TOOL_TEMPLATE`, turns end at eos and get 44 new tokens by
default (32 plus the 12 more a Hermes call and its eos take than a tag search), and the output adds
the share of trajectories that searched and the counts of invalid turns and call errors (reuse on).

Measured: `generate_trajectories` on `--questions` x `--group-size` trajectories (default 4 x 16
= 64), `max_turns=1` (one search turn, then the answer turn), temperature 1, 32 new tokens per
tag turn, through two HFEngines (batch 64) over the same model: prefix reuse on (the default; the
answer turn prefills only the information block on top of the kept first turn) and off. One
warm-up rollout per mode, then `--repeats` timed rollouts per mode, interleaved (on, off, then
off, on, ...) so that load on this shared machine hits both alike; the table shows each mode's
median run. Both modes sample from the same seed, so they generate the same trajectories
(barring float rounding flipping a sample), which the output checks.

Time is split as the rollout reports it: policy generation (every `generate` call), search (every
`search` call) and assembly (everything else: rendering and tokenizing prompts and observations,
masks, parsing, decoding response texts, metrics). Generation is further split into prompt
processing and decoding by replaying every generate call of the median run with `max_new_tokens=1`
(prefill plus one sampled token), each replay preceded, with reuse on, by an untimed full replay
of the call before it (so the kept sequences are the ones the rollout had), and taking the rest as
decoding. Token counts come from the engine's `stats` (`prefill_slots` counts padding too: the
prefill compute).

The last line is a JSON object with `trajectories_per_s` (reuse on), `assembly_share` (reuse on;
target: at most 10% of the total), `prefix_reuse_speedup` (median total time off / on) and the
other figures (`_off` for reuse off).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from simsearch.config import RolloutConfig
from simsearch.data.chat import tool_call_messages, write_call
from simsearch.data.templates import SEARCH_R1_TEMPLATE
from simsearch.generation.hf import HFEngine
from simsearch.models import TINY_TOOL_TEMPLATE, TOOL_SPECIAL_TOKENS, build_tiny_model, load_model, train_tokenizer
from simsearch.policy.rollout import RolloutResult, RolloutSettings, generate_trajectories
from simsearch.retrieval.bm25 import BM25SearchEngine
from simsearch.tinyworld.pretrain import pretrain
from simsearch.tinyworld.traces import make_traces
from simsearch.tinyworld.world import World, build_world
from simsearch.types import Completion, SamplingParams

TEMPLATE_COPIES = 100  # as benchmarks/pretrain_base.py: the prompt's words become single tokens
MODES = ("on", "off")
# Per protocol: pretraining steps, new tokens per turn. A Hermes call and its end-of-turn token take
# 12 tokens more than a tag search, and more pretraining before most are well formed.
PROTOCOL_DEFAULTS = {"tags": (40, 32), "tool-call": (160, 32 + 12)}


@dataclass
class RecordingEngine:
    """Passes calls through to an engine and keeps them, so they can be replayed."""

    engine: HFEngine
    calls: list[tuple[list[list[int]], SamplingParams]] = field(default_factory=list)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        self.calls.append((prompts, params))
        return self.engine.generate(prompts, params)


@dataclass
class Run:
    """One timed rollout."""

    total_s: float
    result: RolloutResult
    calls: list[tuple[list[list[int]], SamplingParams]]
    stats: dict[str, int]  # the engine's token counters over this rollout


def prefill_seconds(engine: HFEngine, calls: list[tuple[list[list[int]], SamplingParams]]) -> float:
    """Time of the calls' prompt processing: each replayed with one new token."""
    engine.reset_prefix_cache()
    seconds = 0.0
    for c, (prompts, params) in enumerate(calls):
        if engine.prefix_cache and c > 0:
            engine.generate(*calls[c - 1])  # untimed: keeps what the rollout kept before call c
        began = time.perf_counter()
        engine.generate(prompts, replace(params, max_new_tokens=1))
        seconds += time.perf_counter() - began
    return seconds


def median_run(runs: list[Run]) -> Run:
    """The median run by total time (the upper one of an even count)."""
    return sorted(runs, key=lambda run: run.total_s)[len(runs) // 2]


def mode_figures(runs: list[Run], engine: HFEngine) -> dict[str, float]:
    """The median run's figures (by total time) plus the spread of all runs."""
    ordered = sorted(runs, key=lambda run: run.total_s)
    median = median_run(runs)
    prefill_s = prefill_seconds(engine, median.calls)
    t = median.result.timings
    m = median.result.metrics
    count = len(median.result.trajectories)
    return {
        "trajectories_per_s": count / median.total_s,
        "total_s": median.total_s,
        "generate_s": t["time/generate_s"],
        "prefill_s": min(prefill_s, t["time/generate_s"]),
        "decode_s": max(t["time/generate_s"] - prefill_s, 0.0),
        "search_s": t["time/search_s"],
        "assembly_s": t["time/assembly_s"],
        "assembly_share": t["time/assembly_s"] / median.total_s,
        "generate_calls": len(median.calls),
        "prompt_tokens": median.stats["prompt_tokens"],
        "prefill_tokens": median.stats["prefill_tokens"],
        "prefill_slots": median.stats["prefill_slots"],
        "reused_tokens": median.stats["reused_tokens"],
        "decoded_tokens": m["perf/decoded_tokens"],
        "searches_per_traj": m["search/calls_per_traj"],
        "answer_rate": m["rollout/answer_rate"],
        "invalid_per_traj": m["rollout/invalid_actions"],
        "response_len": m["rollout/response_len"],
        "total_s_spread": [round(run.total_s, 3) for run in ordered],
    }


def build_tokenizer(world_texts: list[str], tool_call: bool) -> PreTrainedTokenizerFast:
    """The 1000-token BPE: the tag prompt's words, or (tool-call) the user message's and a Hermes call's, whole."""
    if not tool_call:
        return train_tokenizer(world_texts + [SEARCH_R1_TEMPLATE.format(question="")] * TEMPLATE_COPIES, 1000)
    policy_texts = [tool_call_messages("", "search-r1")[0]["content"], write_call("", "hermes")]
    texts = world_texts + policy_texts * TEMPLATE_COPIES
    return train_tokenizer(texts, 1000, TOOL_SPECIAL_TOKENS, TINY_TOOL_TEMPLATE)


def call_figures(result: RolloutResult) -> dict[str, float]:
    """Whether the policy really called the tool: share of trajectories that searched, invalid turns."""
    trajectories = result.trajectories
    return {
        "searched_share": sum(t.num_searches > 0 for t in trajectories) / len(trajectories),
        "invalid_turns": sum(t.num_invalid for t in trajectories),
        "call_errors": sum(len(turn.call_reasons) for t in trajectories for turn in t.turns),
    }


def parse_args() -> argparse.Namespace:
    """The command line, with the protocol's defaults filled in for --pretrain-steps and --new-tokens."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--protocol", choices=list(PROTOCOL_DEFAULTS), default="tags", help="rollout.protocol")
    parser.add_argument("--new-tokens", type=int, help="per turn (default: 32 for tags, 44 for tool-call)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rollouts per mode (median kept)")
    parser.add_argument("--pretrain-steps", type=int, help="x 16 traces (default: 40 for tags, 160 for tool-call)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--model", default="", help="a saved tiny model directory (skips pretraining)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    pretrain_steps, new_tokens = PROTOCOL_DEFAULTS[args.protocol]
    args.pretrain_steps = pretrain_steps if args.pretrain_steps is None else args.pretrain_steps
    args.new_tokens = new_tokens if args.new_tokens is None else args.new_tokens
    return args


def build_policy(
    args: argparse.Namespace, world: World, search: BM25SearchEngine, tool_call: bool
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, float]:
    """The model and tokenizer (--model's, or built and briefly pretrained) and the pretraining seconds."""
    if args.model:
        model, tokenizer = load_model(args.model)
        return model, tokenizer, 0.0
    tokenizer = build_tokenizer(world.texts_for_tokenizer(), tool_call)
    model = build_tiny_model(tokenizer, seed=args.seed)
    began = time.perf_counter()
    if args.pretrain_steps:
        n = 16 * args.pretrain_steps
        traces = make_traces(world, search, tokenizer, n=n, seed=args.seed, protocol=args.protocol)
        pretrain(model, traces, steps=args.pretrain_steps, batch_size=16, lr=3e-3,
                 copy_loss_weight=1.0, seed=args.seed, progress=False)  # fmt: skip
    return model, tokenizer, time.perf_counter() - began


def rollout_runner(
    args: argparse.Namespace,
    world: World,
    search: BM25SearchEngine,
    tokenizer: PreTrainedTokenizerBase,
    policies: dict[str, RecordingEngine],
) -> Callable[[str], Run]:
    """A function that runs one rollout of the measured job with the mode's engine."""
    rollout_config = RolloutConfig(template="search-r1", max_turns=1, protocol=args.protocol)
    settings = RolloutSettings(rollout_config, top_k=3, rendering="search-r1")
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=args.seed)
    questions = world.train[: args.questions]

    def rollout(mode: str) -> Run:
        policy = policies[mode]
        policy.calls.clear()
        before = dict(policy.engine.stats)
        result = generate_trajectories(
            questions, policy=policy, tokenizer=tokenizer, search=search, settings=settings,
            sampling=sampling, group_size=args.group_size,
        )  # fmt: skip
        stats = {k: v - before[k] for k, v in policy.engine.stats.items()}
        return Run(result.timings["time/total_s"], result, list(policy.calls), stats)

    return rollout


def timed_rollouts(rollout: Callable[[str], Run], repeats: int) -> tuple[dict[str, Run], dict[str, list[Run]]]:
    """One warm-up rollout per mode, then `repeats` per mode, the modes interleaved."""
    warm = {mode: rollout(mode) for mode in MODES}
    runs: dict[str, list[Run]] = {mode: [] for mode in MODES}
    for r in range(repeats):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            runs[mode].append(rollout(mode))
    return warm, runs


@dataclass
class Measured:
    """What the timed rollouts gave: trajectories per rollout, each mode's figures, the speedup of reuse (median
    totals) and the paired run ratios, whether both modes wrote the same trajectories, the tool-call figures."""

    count: int
    figures: dict[str, dict[str, float]]
    speedup: float
    paired: list[float]
    same: bool
    calls: dict[str, float]


def print_report(args: argparse.Namespace, m: Measured) -> None:
    """The time split per stage and mode, the token counts, the speedup and (tool-call) the calls made."""
    count, figures, speedup, paired, same, calls = m.count, m.figures, m.speedup, m.paired, m.same, m.calls
    on, off = figures["on"], figures["off"]
    protocol = f", protocol {args.protocol}" if args.protocol == "tool-call" else ""  # the tag run's output as it was
    print(f"rollout{protocol}: {args.questions} questions x group {args.group_size} = {count} trajectories, "
          f"max_turns=1, {args.new_tokens} new tokens/turn, median of {args.repeats} per mode "
          f"(interleaved), {torch.get_num_threads()} torch threads")  # fmt: skip
    print(f"{'stage':<28}{'reuse on':>10}{'share':>8}{'reuse off':>11}{'share':>8}")
    for name, key in [("policy generation", "generate_s"), ("  prompt processing (est.)", "prefill_s"),
                      ("  decoding (est.)", "decode_s"), ("search (BM25)", "search_s"),
                      ("assembly", "assembly_s"), ("total", "total_s")]:  # fmt: skip
        print(f"{name:<28}{on[key]:>10.3f}{on[key] / on['total_s']:>8.1%}"
              f"{off[key]:>11.3f}{off[key] / off['total_s']:>8.1%}")  # fmt: skip
    for mode, f in figures.items():
        print(f"reuse {mode:>3}: trajectories/s {f['trajectories_per_s']:.1f}; prompt tokens "
              f"{f['prompt_tokens']}, prefilled {f['prefill_tokens']} ({f['prefill_slots']} slots with "
              f"padding), reused {f['reused_tokens']}; "
              f"decoded {f['decoded_tokens']:.0f}; totals {f['total_s_spread']}")  # fmt: skip
    print(f"prefix reuse speedup {speedup:.2f}x (median totals; paired run ratios "
          f"{[round(x, 2) for x in paired]}); same trajectories on/off: {same}; "
          f"searches/traj {on['searches_per_traj']:.2f}, answer rate {on['answer_rate']:.2f}")  # fmt: skip
    if calls:
        print(f"tool calls (reuse on): {calls['searched_share']:.0%} of trajectories searched; "
              f"{calls['invalid_turns']} invalid turns, {calls['call_errors']} call errors")  # fmt: skip


def summary(args: argparse.Namespace, m: Measured, pretrain_s: float) -> dict[str, object]:
    """The final JSON object: reuse on's figures, reuse off's main ones suffixed `_off`, and the setup."""
    on, off = m.figures["on"], m.figures["off"]
    out: dict[str, object] = {
        "trajectories": m.count,
        **on,
        "prefix_reuse_speedup": m.speedup,
        "prefix_reuse_paired_median": statistics.median(m.paired),
        **{
            f"{key}_off": off[key]
            for key in (
                "trajectories_per_s",
                "total_s",
                "generate_s",
                "prefill_s",
                "decode_s",
                "assembly_share",
                "prefill_tokens",
                "prefill_slots",
                "total_s_spread",
            )
        },
        "same_trajectories": m.same,
        **({"protocol": args.protocol, **m.calls} if args.protocol == "tool-call" else {}),
        "pretrain_s": pretrain_s,
        "torch_threads": torch.get_num_threads(),
        "search_engine": "bm25 (bm25s) over the tiny world, 940 passages",
    }
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


def main() -> None:
    args = parse_args()
    tool_call = args.protocol == "tool-call"
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)

    world = build_world(seed=0)
    search = BM25SearchEngine.build(world.passages, show_progress=False)
    model, tokenizer, pretrain_s = build_policy(args, world, search, tool_call)
    policies = {
        "on": RecordingEngine(HFEngine(model, tokenizer, batch_size=64, prefix_cache=True)),
        "off": RecordingEngine(HFEngine(model, tokenizer, batch_size=64, prefix_cache=False)),
    }
    warm, runs = timed_rollouts(rollout_runner(args, world, search, tokenizer, policies), args.repeats)
    same = [t.response_ids for t in warm["on"].result.trajectories] == [
        t.response_ids for t in warm["off"].result.trajectories
    ]
    figures = {mode: mode_figures(runs[mode], policies[mode].engine) for mode in MODES}
    speedup = figures["off"]["total_s"] / figures["on"]["total_s"]
    # Paired ratios (run r of each mode ran back to back): how much the load moved the median.
    paired = sorted(b.total_s / a.total_s for a, b in zip(runs["on"], runs["off"]))
    count = len(warm["on"].result.trajectories)
    calls = call_figures(median_run(runs["on"]).result) if tool_call else {}
    measured = Measured(count, figures, speedup, paired, same, calls)
    print_report(args, measured)
    print(json.dumps(summary(args, measured, pretrain_s)))


if __name__ == "__main__":
    main()
