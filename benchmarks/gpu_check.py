"""The GPU path, run end to end on one device: training (hf, ZeRO-2, ZeRO-3), rollouts and generation speed.

Run:  bash benchmarks/gpu_check.sh [--model PATH] [--device cuda] [--shape 0.5b] [--skip PART ...]
      bash benchmarks/gpu_check.sh --device cpu --shape tiny     (what the test suite runs)

Offline and self-contained: the tiny world (`simsearch.tinyworld`) gives questions and a corpus; the
policy is a Qwen2 of `--shape` with random weights and a byte-level BPE trained on the world's texts
(`simsearch.models`), unless `--model` names a local directory or hub name. Parts, in order:

- train_hf:   `simsearch train` with the hf engine (REINFORCE, BM25, 2 turns, bf16 and gradient
              checkpointing on a GPU), 3 steps; the mean step time after the first.
- zero2/zero3: the same job under DeepSpeed ZeRO-2 and ZeRO-3 in one process (torchrun), 2 steps.
- generation: HFEngine vs a bare KV-cached greedy loop vs `model.generate`, `--batch` prompts of
              `--prompt-tokens`, `--new-tokens` new, greedy, best of 2.
- compiled:   HFEngine(compile=True) on the same prompts: its compile time, tokens/s, and whether its
              greedy tokens equal the eager engine's.
- rollout:    `generate_trajectories` on `--batch` trajectories, BM25 search, sampling at temperature 1:
              the policy's decoded tokens over its generate time (search time left out), and the mean
              rows each decode step served, the time a decode step took, the longest context;
              with `--profile`, torch.profiler's costliest ops over it (also in rollout_profile.txt).
- context:    the engine alone on the rollout's first-turn prompts, sampled as there (temperature 1,
              n = the group): as they are (ragged: left-padded under an attention mask), each cut
              to the shortest one's length (no padding, so no mask), and those cut prompts three
              times over (no mask, about a second turn's length): what the padding mask costs and
              what a longer context costs, apart from the rollout's loop.
- quickstart: the quickstart's RL stage (recipes/quickstart/train.yaml, `--quickstart-steps` steps) and
              its evaluation (eval.yaml on BM25 and the simulator), policy and simulator on `--device`:
              the base, simulator and world of the finished quickstart run `--quickstart-run`, or else
              the base of a smoke quickstart (it seldom searches) as policy and, untrained, as simulator.
- vllm:       the vLLM engine on the generation prompts, when `vllm` imports.

Parts run in that order. A part that cannot run here (no vLLM, `--skip`) reports null and `skipped`
says why; a part that fails reports null, `failed` holds its error, the other parts still run, and
the exit status is 1. The last line printed is one JSON object (keys: FIGURES plus `skipped`,
`failed` and the shape).
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoTokenizer

from benchmarks.benchlib import RECIPES, synchronize
from benchmarks.generate import bare_loop
from simsearch.config import EvalRecipe, QuickstartRecipe, RolloutConfig, TrainRecipe, load_recipe
from simsearch.data.templates import encode_prompt
from simsearch.experiments import pipeline, stages
from simsearch.generation.hf import HFEngine
from simsearch.models import build_tiny_model, load_model, save_tiny, train_tokenizer
from simsearch.policy.rollout import RolloutSettings, generate_trajectories
from simsearch.retrieval.bm25 import BM25SearchEngine
from simsearch.tinyworld.world import World, build_world
from simsearch.training.runlog import read_metrics
from simsearch.types import SamplingParams

SHAPES: dict[str, dict[str, int]] = {
    "0.5b": dict(hidden=896, layers=24, heads=14, kv_heads=2, ffn=4864, vocab=8000),  # Qwen2.5-0.5B's body
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=600),
}
ROLLOUT_GROUP = 4  # trajectories per question in the rollout and context parts
PARTS = ("generation", "compiled", "rollout", "context", "train_hf", "quickstart", "zero2", "zero3", "vllm")
FIGURES = (
    "train_hf_step_s", "train_zero2_step_s", "train_zero3_step_s", "rollout_tokens_per_s", "engine_tokens_per_s",
    "bare_loop_tokens_per_s", "compiled_tokens_per_s", "rollout_over_engine", "compiled_over_bare_loop",
    "quickstart_rl_s_per_step", "wall_s",
)  # fmt: skip

# DeepSpeed's shared-memory allreduce is a C++ extension compiled on first use: switched off (gloo or NCCL do).
LAUNCHER = """
import sys
import deepspeed

deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
from simsearch.cli import main

sys.exit(main(sys.argv[1:]))
"""


def environment() -> str:
    """One line: Python, torch, CUDA, transformers, the device, optional packages."""
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"no GPU ({platform.processor() or 'cpu'})"
    extras = []
    for name in ("deepspeed", "peft", "accelerate", "vllm"):
        try:
            extras.append(f"{name} {__import__(name).__version__}")
        except Exception:  # an optional package missing or broken: say so, go on
            extras.append(f"{name} -")
    return (
        f"gpu_check: Python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
        f"transformers {transformers.__version__}, {', '.join(extras)}; {device}"
    )


def build_policy(shape: dict[str, int], world: World, directory: Path) -> Path:
    """A random-weight Qwen2 of `shape` with a BPE trained on the world's texts, saved to `directory`."""
    train_tokenizer(world.texts_for_tokenizer(4000), vocab_size=shape["vocab"]).save_pretrained(directory)
    # Reloaded first: loading may add a token (<|endoftext|>), which the embeddings must cover too.
    tokenizer = AutoTokenizer.from_pretrained(directory)
    dims = {key: value for key, value in shape.items() if key != "vocab"}
    return save_tiny(build_tiny_model(tokenizer, seed=0, **dims), tokenizer, directory)


def train_overrides(
    args: argparse.Namespace, model: Path, data: dict[str, Path], run_dir: Path, steps: int
) -> list[str]:
    """The `simsearch train` job every training part runs (as key=value overrides)."""
    gpu = args.device.startswith("cuda")
    return [f"{key}={value}" for key, value in {
        "run_dir": run_dir, "seed": 0, "policy.model.path": model, "policy.model.device": args.device,
        "policy.model.dtype": "bfloat16" if gpu else "float32", "policy.batch_size": args.batch,
        "sampling.max_new_tokens": args.new_tokens, "data.train": f"[{data['train']}]", "search.kind": "bm25",
        "search.corpus": data["corpus"], "search.index_dir": run_dir.parent / "bm25", "search.top_k": 3,
        "curriculum.kind": "constant", "curriculum.p_start": 0.0, "rollout.template": "search-r1",
        "rollout.max_turns": 2, "rollout.group_size": 5, "rollout.max_context_tokens": 2048,
        "rollout.max_obs_tokens": 512, "algorithm.estimator": "reinforce", "algorithm.kl_coef": 0.0,
        "optim.lr": 1e-6, "steps": steps, "prompts_per_step": args.prompts_per_step, "micro_batch_size": 8,
        "gradient_checkpointing": gpu, "bf16": gpu, "save_every": 0, "eval_every": 0, "resume": "false",
        "tensorboard": "false",
    }.items()]  # fmt: skip


def mean_step_s(run_dir: Path) -> float:
    """Mean `time/step_s` over the steps after the first (warm-up), or the only step."""
    rows = read_metrics(run_dir)
    timed = rows[1:] or rows
    return statistics.fmean(row["time/step_s"] for row in timed)


def train_hf(args: argparse.Namespace, model: Path, data: dict[str, Path], work: Path) -> dict[str, Any]:
    run = work / "train_hf"
    stages.train(load_recipe(TrainRecipe, None, train_overrides(args, model, data, run, steps=3)))
    return {"train_hf_step_s": mean_step_s(run)}


def train_zero(stage: int, args: argparse.Namespace, model: Path, data: dict[str, Path], work: Path) -> dict[str, Any]:
    """Two steps under DeepSpeed ZeRO-`stage`, one process launched by torchrun (NCCL on a GPU, gloo on CPU)."""
    run = work / f"zero{stage}"
    (work / "launch.py").write_text(LAUNCHER)
    (work / "seed.yaml").write_text("seed: 0\n")  # everything else comes as overrides
    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    overrides = [*train_overrides(args, model, data, run, steps=2), f"deepspeed.stage={stage}"]
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_addr", "127.0.0.1"]
    command = [*launch, "--master_port", port, str(work / "launch.py"), "train", str(work / "seed.yaml"), *overrides]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.part_timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"ZeRO-{stage} training failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return {f"train_zero{stage}_step_s": mean_step_s(run)}


def best_rate(run: Callable[[], int], repeats: int = 2) -> float:
    """Best tokens/s of `repeats` runs of `run` (which returns the tokens it generated)."""
    best = 0.0
    for _ in range(repeats):
        synchronize()
        began = time.perf_counter()
        tokens = run()
        synchronize()
        best = max(best, tokens / (time.perf_counter() - began))
    return best


def load_policy(args: argparse.Namespace, model: Path) -> tuple[Any, Any]:
    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    return load_model(model, dtype=dtype, device=args.device)


def random_prompts(args: argparse.Namespace, tokenizer: Any, vocab: int) -> torch.Tensor:
    """[batch, prompt tokens] ordinary (non-special) ids below `vocab`, seeded."""
    first_plain = len(tokenizer.all_special_ids)
    generator = torch.Generator().manual_seed(0)
    return torch.randint(first_plain, min(vocab, len(tokenizer)), (args.batch, args.prompt_tokens), generator=generator)


def generation(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    """Engine vs bare loop vs `model.generate`, greedy, on equal-length prompts."""
    model, tokenizer = load_policy(args, model_dir)
    prompts = random_prompts(args, tokenizer, model.get_input_embeddings().num_embeddings)
    engine = HFEngine(model, tokenizer, batch_size=args.batch, prefix_cache=False)
    device = torch.device(args.device)

    def run_generate() -> int:
        ids = prompts.to(device)
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                max_new_tokens=args.new_tokens, pad_token_id=engine.pad_id, eos_token_id=None,
            )  # fmt: skip
        return int(out.shape[0] * (out.shape[1] - ids.shape[1]))

    engine_rate = best_rate(lambda: engine_tokens(engine, prompts, args))
    return {
        "engine_tokens_per_s": engine_rate,
        "engine_ms_per_decode_step": 1000 * args.batch / engine_rate,
        "bare_loop_tokens_per_s": best_rate(lambda: bare_loop(model, prompts.to(device), args.new_tokens)),
        "generate_tokens_per_s": best_rate(run_generate),
    }


def compiled(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    """HFEngine(compile=True) on the generation prompts: compile time, tokens/s, greedy tokens as eager's."""
    model, tokenizer = load_policy(args, model_dir)
    prompts = random_prompts(args, tokenizer, model.get_input_embeddings().num_embeddings)
    engine = HFEngine(model, tokenizer, batch_size=args.batch, prefix_cache=False, compile=True)
    began = time.perf_counter()
    engine_tokens(engine, prompts, args)  # compiles this batch's shapes
    figures: dict[str, Any] = {"compile_s": time.perf_counter() - began}
    figures["compiled_tokens_per_s"] = best_rate(lambda: engine_tokens(engine, prompts, args))
    eager = HFEngine(model, tokenizer, batch_size=args.batch, prefix_cache=False)
    params = greedy(args)
    ours = [c.token_ids for c in engine.generate(prompts.tolist(), params)]
    theirs = [c.token_ids for c in eager.generate(prompts.tolist(), params)]
    figures["compiled_same_greedy_tokens"] = ours == theirs
    figures["compiled_same_greedy_rows"] = sum(a == b for a, b in zip(ours, theirs)) / len(ours)
    # Where the first row parts from eager decoding: late means rounding on near-ties, 0 a real fault.
    differences = [first_difference(a, b) for a, b in zip(ours, theirs)]
    figures["compiled_first_difference"] = min((d for d in differences if d is not None), default=None)
    # Teacher-forced: both read the same text; eager in halves of the batch is the noise a shape makes.
    text = prompts.tolist()
    forced = forced_tokens(eager, len(text), args.new_tokens, model.get_input_embeddings().num_embeddings)
    reference = teacher_forced_logprobs(eager, text, forced)
    half = HFEngine(model, tokenizer, batch_size=max(1, args.batch // 2), prefix_cache=False)
    cut = len(text) // 2
    parts = [part for part in (slice(0, cut), slice(cut, None)) if text[part]]
    halves = [teacher_forced_logprobs(half, text[part], forced[part]) for part in parts]
    noise = agreement(reference, concatenated(halves))
    found = agreement(reference, teacher_forced_logprobs(engine, text, forced))
    figures.update({f"compiled_{key}": value for key, value in found.items()})
    figures["eager_noise_logprob_delta"] = noise["max_logprob_delta"]
    figures["compiled_agrees"] = agrees(found, noise)
    return figures


AGREEMENT_SLACK = 4.0
"""Compiled decoding may move a teacher-forced log-probability by up to this many times what eager
decoding of another batch shape moves it (to be confirmed on a GPU: docs/scaling.md)."""
AGREEMENT_MIN_NOISE = 1 / 128
"""The least eager-vs-eager noise assumed (one bfloat16 step at 1.0), so that an eager run that
happens to agree with itself exactly sets no bound of zero."""


def teacher_forced_logprobs(
    engine: HFEngine, prompts: list[list[int]], forced: list[list[int]]
) -> dict[str, torch.Tensor]:
    """What `engine` predicts when fed `forced[i]` after prompt i instead of its own samples.

    The engine decodes as ever (eager, or the compiled static-cache loop) but each step takes the
    forced token: two engines see the same contexts, so their predictions compare position by
    position. Returns, per prompt and step: `chosen` [P, S], the log-probability of the forced
    token; `top2` [P, S, 2], the two largest log-probabilities; `argmax` [P, S]. `forced` must
    hold no end token, every row equally many tokens, and the prompts fit one chunk.
    """
    steps = len(forced[0])
    assert all(len(row) == steps for row in forced) and not any(t in engine.eos_ids for row in forced for t in row)
    if len(prompts) > engine.batch_size:
        raise ValueError(f"{len(prompts)} prompts over batch_size={engine.batch_size}: teacher forcing needs one chunk")
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))  # the engine's row order (one chunk)
    records: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def forced_sample(logits: torch.Tensor, params: SamplingParams, generator: Any) -> tuple[list[int], None]:
        tokens = [forced[i][len(records)] for i in order]
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # [B, V]
        chosen = logprobs.gather(-1, torch.tensor(tokens, device=logprobs.device)[:, None]).squeeze(-1)
        records.append((chosen.cpu(), logprobs.topk(2, dim=-1).values.cpu(), logprobs.argmax(-1).cpu()))
        return tokens, None

    engine._sample = forced_sample  # type: ignore[method-assign]  # an instance attribute, removed below
    try:
        completions = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=steps))
    finally:
        del engine._sample
    assert [c.token_ids for c in completions] == forced  # the rows were mapped as the engine maps them
    back = torch.empty(len(order), dtype=torch.long)
    back[torch.tensor(order)] = torch.arange(len(order))  # engine row of each prompt
    return {
        name: torch.stack([record[k] for record in records], dim=1)[back]
        for k, name in enumerate(("chosen", "top2", "argmax"))
    }


def agreement(reference: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> dict[str, Any]:
    """How far `other`'s teacher-forced predictions are from `reference`'s (`teacher_forced_logprobs`).

    `max_logprob_delta`: the largest |difference| of the forced tokens' log-probabilities;
    `flips`: positions whose argmax differs; `largest_flip_margin`: the largest top-2 margin of
    `reference` among them (0 without flips): a flip where the two best tokens lie far apart is a
    fault, not rounding.
    """
    delta = (reference["chosen"] - other["chosen"]).abs()
    margin = reference["top2"][..., 0] - reference["top2"][..., 1]
    flipped = reference["argmax"] != other["argmax"]
    return {
        "max_logprob_delta": float(delta.max()),
        "flips": int(flipped.sum()),
        "largest_flip_margin": float(margin[flipped].max()) if bool(flipped.any()) else 0.0,
        "positions": int(flipped.numel()),
    }


def concatenated(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """`teacher_forced_logprobs` of consecutive groups of prompts as one."""
    return {name: torch.cat([part[name] for part in parts]) for name in parts[0]}


def agrees(compiled: dict[str, Any], noise: dict[str, Any]) -> bool:
    """Compiled-vs-eager `agreement` within what eager-vs-eager `noise` allows.

    Every forced log-probability within `bound` = AGREEMENT_SLACK x the noise (at least
    AGREEMENT_MIN_NOISE); an argmax flip only where eager's top-2 margin is below 2 x bound (only
    there can errors of at most `bound` on each of the two swap them).
    """
    bound = AGREEMENT_SLACK * max(noise["max_logprob_delta"], AGREEMENT_MIN_NOISE)
    return compiled["max_logprob_delta"] <= bound and compiled["largest_flip_margin"] < 2 * bound


def forced_tokens(engine: HFEngine, rows: int, steps: int, vocab: int, seed: int = 1) -> list[list[int]]:
    """`rows` x `steps` seeded ordinary token ids below `vocab`, none an end token (the teacher-forced text)."""
    generator = torch.Generator().manual_seed(seed)
    low = len(engine.tokenizer.all_special_ids)
    ids = torch.randint(low, vocab, (rows, steps), generator=generator).tolist()
    return [[t if t not in engine.eos_ids else low for t in row] for row in ids]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where `a` and `b` differ (one ending early counts), or None when equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def greedy(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens, stop=["</answer>"])


def engine_tokens(engine: HFEngine, prompts: torch.Tensor, args: argparse.Namespace) -> int:
    """Tokens `engine` generates for `prompts`, greedy."""
    return sum(len(c.token_ids) for c in engine.generate(prompts.tolist(), greedy(args)))


def rollout_questions(args: argparse.Namespace, world: World) -> list[Any]:
    """The questions of the rollout and context parts: `--batch` rows in groups of ROLLOUT_GROUP."""
    return world.train[: max(1, args.batch // ROLLOUT_GROUP)]


def rollout(args: argparse.Namespace, model_dir: Path, world: World, work: Path) -> dict[str, Any]:
    """Policy tokens/s inside a rollout of `--batch` trajectories (search time left out)."""
    model, tokenizer = load_policy(args, model_dir)
    engine = HFEngine(model, tokenizer, batch_size=args.batch)
    search = BM25SearchEngine.build(world.passages, show_progress=False)
    examples = rollout_questions(args, world)
    limits = RolloutConfig(template="search-r1", max_turns=2, max_obs_tokens=512, max_context_tokens=2048)
    settings = RolloutSettings(limits, top_k=3, rendering="search-r1")
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=0)
    kwargs = dict(policy=engine, tokenizer=tokenizer, search=search, settings=settings, group_size=ROLLOUT_GROUP)
    generate_trajectories(examples, sampling=SamplingParams(temperature=1.0, max_new_tokens=4), **kwargs)  # warm-up
    engine.stats = dict.fromkeys(engine.stats, 0)
    with profiled(args.profile, work / "rollout_profile.txt"):
        result = generate_trajectories(examples, sampling=sampling, **kwargs)
    decoded, generate_s = result.metrics["perf/decoded_tokens"], result.timings["time/generate_s"]
    return {
        "rollout_tokens_per_s": decoded / generate_s,
        "rollout_rows_per_decode_step": engine.stats["decoded_tokens"] / max(1, engine.stats["decode_steps"]),
        "rollout_ms_per_decode_step": 1000 * generate_s / max(1, engine.stats["decode_steps"]),
        "rollout_longest_context": max(len(t.prompt_ids) + len(t.response_ids) for t in result.trajectories),
        "rollout_generate_s": generate_s,
        "rollout_search_s": result.timings["time/search_s"],
    }


def context(args: argparse.Namespace, model_dir: Path, world: World) -> dict[str, Any]:
    """The engine alone on the rollout's first-turn prompts: ragged, equal, equal and longer (module docstring)."""
    model, tokenizer = load_policy(args, model_dir)
    engine = HFEngine(model, tokenizer, batch_size=args.batch, prefix_cache=False)
    questions = [example.question for example in rollout_questions(args, world)]
    ragged = [encode_prompt(question, template="search-r1", tokenizer=tokenizer) for question in questions]
    shortest = min(len(prompt) for prompt in ragged)
    even = [prompt[-shortest:] for prompt in ragged]
    long = [prompt * 3 for prompt in even]
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, n=ROLLOUT_GROUP, seed=0)
    engine.generate(ragged, replace(params, max_new_tokens=4))  # warm-up
    figures: dict[str, Any] = {
        "context_prompt_tokens": [shortest, max(len(prompt) for prompt in ragged)],
        "long_prompt_tokens": 3 * shortest,
    }

    def decoded(prompts: list[list[int]]) -> int:
        engine.stats = dict.fromkeys(engine.stats, 0)
        engine.generate(prompts, params)
        return engine.stats["decoded_tokens"]

    for name, prompts in (("ragged", ragged), ("even", even), ("long", long)):
        rate = best_rate(lambda prompts=prompts: decoded(prompts), repeats=1)
        figures[f"{name}_tokens_per_s"] = rate
        seconds = engine.stats["decoded_tokens"] / rate
        figures[f"{name}_ms_per_decode_step"] = 1000 * seconds / max(1, engine.stats["decode_steps"])
    figures["ragged_over_even"] = figures["ragged_tokens_per_s"] / figures["even_tokens_per_s"]
    return figures


@contextmanager
def profiled(on: bool, out: Path) -> Iterator[None]:
    """With `on`, torch.profiler over the block: its 25 costliest ops (device time first) printed and saved."""
    if not on:
        yield
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        yield
    synchronize()
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    table = profile.key_averages().table(sort_by=key, row_limit=25)
    out.write_text(table)
    print(table, flush=True)


def quickstart_rl(args: argparse.Namespace, world: World, data: dict[str, Path], work: Path) -> dict[str, Any]:
    """The quickstart's train.yaml and eval.yaml on `--device` (module docstring); step time and eval time."""
    root = work / "quickstart"
    if args.quickstart_run:
        done = Path(args.quickstart_run)
        base, simulator = done / "base", pipeline.final_model(done / "simulator")
        data = {name: done / "world" / f"{name}.jsonl" for name in ("corpus", "train", "test")}
    else:
        smoke = load_recipe(QuickstartRecipe, None, ["smoke=true", f"run_dir={root}"])
        base = simulator = root / "base"
        pipeline.pretrain_base(
            smoke, world, world.background or world.train, load_recipe(TrainRecipe, RECIPES / "train.yaml"), base
        )
    run, steps, on = root / "train", args.quickstart_steps, args.device
    stages.train(load_recipe(TrainRecipe, RECIPES / "train.yaml", [f"{key}={value}" for key, value in {
        "run_dir": run, "policy.model.path": base, "policy.model.device": on, "data.train": f"[{data['train']}]",
        "search.simulator.generation.model.path": simulator, "search.simulator.generation.model.device": on,
        "search.cache": root / "simulator.sqlite", "steps": steps, "save_every": steps, "threads": 0,
    }.items()]))  # fmt: skip
    rows = read_metrics(run)
    began = time.perf_counter()
    recipe = load_recipe(EvalRecipe, RECIPES / "eval.yaml", [f"{key}={value}" for key, value in {
        "run_dir": root / "eval", "policy.model.path": pipeline.final_model(run), "policy.model.device": on,
        "datasets": f"[{{name: heldout, path: {data['test']}, limit: {args.batch}}}]",
        "engines.simulator.simulator.generation.model.path": simulator,
        "engines.simulator.simulator.generation.model.device": on, "engines.bm25.corpus": data["corpus"],
        "engines.bm25.index_dir": root / "bm25", "training_run": "''", "baselines": "[]", "fidelity_size": 0,
        "threads": 0,
    }.items()])  # fmt: skip
    # BM25 and the simulator: the dense retriever's model is not a GPU question (nor on every GPU machine).
    recipe.engines = {name: recipe.engines[name] for name in ("simulator", "bm25")}
    stages.evaluate(recipe)
    return {
        "quickstart_rl_s_per_step": mean_step_s(run),
        "quickstart_searches_per_trajectory": statistics.fmean(row["search/calls_per_traj"] for row in rows),
        "quickstart_eval_s": time.perf_counter() - began,
    }


def vllm_generation(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    """The in-process vLLM engine on the generation benchmark's shape (GPU and vLLM only)."""
    from simsearch.config import GenerationConfig, ModelConfig
    from simsearch.factory.build import build_generation_engine

    cfg = GenerationConfig(kind="vllm", model=ModelConfig(path=str(model_dir), dtype="bfloat16", device=args.device),
                           gpu_memory_utilization=0.3)  # fmt: skip
    engine, tokenizer, _ = build_generation_engine(cfg)
    prompts = random_prompts(args, tokenizer, len(tokenizer)).tolist()
    rate = best_rate(lambda: sum(len(c.token_ids) for c in engine.generate(prompts, greedy(args))))
    return {"vllm_tokens_per_s": rate}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--shape", default="0.5b", choices=list(SHAPES), help="the random-weight policy's shape")
    parser.add_argument("--model", default="", help="a local model directory or hub name instead of a random one")
    parser.add_argument("--skip", nargs="*", default=[], choices=[*PARTS, "compiled"], help="parts not to run")
    parser.add_argument("--batch", type=int, default=64, help="rows decoded together (generation, rollout)")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256, help="per turn in training and rollouts")
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--quickstart-steps", type=int, default=20, help="RL steps of the quickstart part")
    parser.add_argument("--quickstart-run", default="", help="a finished quickstart run for the quickstart part")
    parser.add_argument("--work-dir", default="", help="where runs go (default: a temporary directory)")
    parser.add_argument("--profile", action="store_true", help="torch.profiler over the rollout part")
    parser.add_argument("--part-timeout-s", type=int, default=300, help="most seconds one ZeRO launch may take")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch.cuda.is_available() is False (a CPU-only torch build?)")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs every part not skipped; prints the environment, one line per part, and the JSON summary last."""
    began = time.perf_counter()
    args = parse(argv)
    print(environment(), flush=True)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="gpu-check-"))
    world = build_world(seed=0)
    data = world.write(work / "world")
    model = Path(args.model) if args.model else build_policy(SHAPES[args.shape], world, work / "policy")
    parts: dict[str, Callable[[], dict[str, Any]]] = {
        "generation": lambda: generation(args, model),
        "compiled": lambda: compiled(args, model),
        "rollout": lambda: rollout(args, model, world, work),
        "context": lambda: context(args, model, world),
        "train_hf": lambda: train_hf(args, model, data, work),
        "quickstart": lambda: quickstart_rl(args, world, data, work),
        "zero2": lambda: train_zero(2, args, model, data, work),
        "zero3": lambda: train_zero(3, args, model, data, work),
        "vllm": lambda: vllm_generation(args, model),
    }
    figures: dict[str, Any] = dict.fromkeys(FIGURES)
    skipped: dict[str, str] = {name: "--skip" for name in args.skip}
    if "vllm" not in args.skip and not _imports("vllm"):
        skipped["vllm"] = "vllm does not import here"
    failed: dict[str, str] = {}
    for name, part in parts.items():
        if name in skipped:
            continue
        start = time.perf_counter()
        try:
            found = part()
        except Exception as error:  # one part's failure must not cost the other parts' figures
            traceback.print_exc()
            failed[name] = f"{type(error).__name__}: {error}"[-2000:]
            print(f"gpu_check: {name} FAILED after {time.perf_counter() - start:.1f} s: {failed[name]}", flush=True)
            continue
        print(f"gpu_check: {name} in {time.perf_counter() - start:.1f} s: {json.dumps(found)}", flush=True)
        figures.update(found)
    for ratio, top, bottom in (
        ("rollout_over_engine", "rollout_tokens_per_s", "engine_tokens_per_s"),
        ("compiled_over_bare_loop", "compiled_tokens_per_s", "bare_loop_tokens_per_s"),
    ):
        if figures.get(top) is not None and figures.get(bottom) is not None:
            figures[ratio] = figures[top] / figures[bottom]
    figures["wall_s"] = time.perf_counter() - began
    summary = {**figures, "shape": args.model or args.shape, "device": args.device}
    summary.update(skipped=skipped, failed=failed)
    print(json.dumps(summary))
    return summary


def _imports(name: str) -> bool:
    try:
        __import__(name)
    except Exception:  # missing, or present but broken (vLLM against another torch): not usable here
        return False
    return True


if __name__ == "__main__":
    sys.exit(1 if main()["failed"] else 0)
