"""ZeroSearch's and SSRL's findings, measured in miniature: one RL policy per arm on the quickstart's world.

    python -m benchmarks.ablations                            # the full benchmark, worlds 0 1 2: docs/ablations.md
    python -m benchmarks.ablations --arms default ppo         # some arms only (the others stay "-")
    python -m benchmarks.ablations --smoke                    # every arm for two steps, in a temp dir
    python -m benchmarks.ablations --render docs/ablations/figures.json   # the page again from a record

For each seed: `simsearch quickstart` in its run directory first (a finished run is reused stage
by stage through its fingerprints, so an existing run costs nothing; `--quickstart-dir` points at
one), then on its world, base and simulator one RL run per arm with `recipes/quickstart/train.yaml`
plus the arm's overrides and the same budget (`--steps`, the quickstart's 8 questions x 16
rollouts a step), then `recipes/quickstart/eval.yaml` on the held-out questions for each policy
against the simulator, BM25 and dense retrieval. Every stage of this benchmark is fingerprinted as
the quickstart's are: a rerun skips what is finished and rebuilds what changed.

The arms (`ARMS`), each answering one of the five questions of `QUESTIONS`:

1. curriculum: `default` (ZeroSearch's exponential noise schedule, the quickstart's) vs
   `constant` (p_noise fixed at the exponential schedule's mean over the run's steps) vs
   `no_noise` (p_end 0);
2. what is in the loop: the fine-tuned simulator (`default`) vs real BM25 (`loop_bm25`, the
   upper bound) vs empty results (`loop_none`); real engines get no noise curriculum;
3. what the simulator is told and how its pairs are labelled: ZeroSearch's design differs from
   ours (`default`: the query only in the prompt, pairs labelled by what BM25 retrieved, contrast
   queries) in three ways, one arm each, each with its own simulator trained as the quickstart's
   but with overrides on its collect.yaml (`VARIANTS`, `train_simulator`):
   `told_prompt` (the question and gold answer in the simulator's prompt, at collection and in RL
   and evaluation), `outcome_labels` (ZeroSearch's Search Simulation Tuning: pairs labelled by
   the trajectory's outcome, which cannot label contrast queries, so none) and `no_contrast` (the
   default without contrast queries: `outcome_labels` against it isolates the labelling). Next to
   EM, each simulator's answer leakage on training questions (`answer_leakage`);
4. algorithm: REINFORCE (`reinforce`, no baseline, as ZeroSearch's) vs GRPO (`default`) vs PPO
   (`ppo`: GAE with gamma = lambda = 1; the critic, a copy of the base with a value head, at the
   actor's learning rate, as a tiny model learns nothing in a few dozen steps at ZeroSearch's
   1e-5);
5. self-search (SSRL): `ssrl`, trained with `rollout.template=self-search` and `search.kind=self`
   from a base that knows the training entities' facts (`train_knowing_base`), evaluated writing
   its own information (engine `self`) and with real BM25 (and dense, and the simulator) in its
   place (`simsearch eval` sends a self-search policy's searches to any engine not of kind self).
   Reward EM, as every other arm (SSRL's format reward asks for `<think>`, which no tiny base
   writes).

Where it departs from the papers: the tiny world and models of the quickstart; EM is strict
exact match on held-out entities (ZeroSearch reports substring match); far fewer RL steps than
either paper.

Each table also gives, for each arm, its paired difference against the default arm (`PAIRS`:
the same world per seed, arm minus default) with its 95% t-interval over seeds
(`benchlib.INTERVAL_METHOD`; none for one seed); an interval that holds 0 is written "no
measurable difference" (`benchlib.difference_cell`).

Output: `docs/ablations.md` (`--out`; its table blocks and the commit and machine it was measured
on are rewritten, the prose around them is kept), one PNG bar chart per table in
`docs/ablations/`, and as the last line one JSON object: the EM points on BM25, mean over seeds,
under `FIGURES`' keys; `leak_*` (answer leakage without the name, percent, `LEAK_FIGURES`);
`differences` (per pair and engine: mean, ci_low, ci_high) and `interval_method`; `wall_s`;
`provenance`; and the detail (`by_seed`, `leak_noisy_*`, `constant_p_noise`, `steps`, `seeds`,
`smoke`). `--smoke` runs on the quickstart's smoke pipeline, two steps an arm, and writes into its
run directory (a temporary one by default). `--render RECORD` runs nothing: from such a JSON object
saved in a file (docs/ablations/figures.json) it computes the differences and their intervals again
from the per-seed figures (`by_seed`), rewrites the doc's table blocks and charts (not its measured
and wall blocks) and the record's `differences`.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.benchlib import (
    INTERVAL_METHOD,
    NO_NOISE,
    RECIPES,
    arm_arguments,
    difference_cell,
    mean_sd,
    measured_at,
    provenance,
    replace_block,
    timed,
)
from benchmarks.benchlib import paired as paired_figures
from simsearch.config import QuickstartRecipe, TrainRecipe, load_recipe
from simsearch.curriculum.schedules import exponential
from simsearch.experiments import pipeline, quickstart, stages
from simsearch.factory.build import build_search_engine
from simsearch.fingerprints import claim_stage, digest, finish_stage, stage_fingerprint
from simsearch.models import load_model, save_tiny
from simsearch.retrieval.base import SearchEngine
from simsearch.retrieval.bm25 import BM25SearchEngine
from simsearch.simulator.sft_data import contains_answer
from simsearch.tinyworld.pretrain import pretrain
from simsearch.tinyworld.traces import make_traces
from simsearch.tinyworld.world import World
from simsearch.types import SearchRequest

ENGINES = ("simulator", "bm25", "dense")
SELF_ENGINES = ("self", *ENGINES)  # a self-search policy also writes its own information
STEPS = 60  # RL steps per arm (the quickstart runs 250), see docs/ablations.md
SEEDS = (0, 1, 2)  # the full run's worlds: reporting worlds (below 100), none tuned on
SELF_SEARCH_TOKENS = 160  # one self-search generation holds the query, ~3 written results and the answer
KNOWING_STEPS, KNOWING_BATCH, KNOWING_LR = 400, 32, 1e-3  # the SSRL arm's base: pretraining on facts
LEAK_QUESTIONS = 200  # training questions per leakage probe

# Smoke: every stage for a step or two, as the quickstart's smoke does.
SMOKE_TRAIN = ["prompts_per_step=2", "rollout.group_size=2", "eval_every=0"]
SMOKE_EVAL = ["chunk_size=8"]
# The smoke base rarely searches: 128 questions give outcome labels pairs on 2 questions at least (train
# and validation), where 32 gave one pair; they may hold no correct trajectory, hence no balance.
SMOKE_COLLECT = ["max_questions=128", "balance=false"]
SMOKE_SIMULATOR = ["steps=2", "eval_every=1", "batch_size=4"]
SMOKE_STEPS, SMOKE_KNOWING = 2, (2, 4)  # RL steps; knowing-base steps and batch
SMOKE_LIMIT, SMOKE_LEAK = 4, 4  # held-out questions per evaluation; questions per leakage probe


@dataclass(frozen=True)
class Variant:
    """A simulator built as the quickstart's, from the collect.yaml overrides that make it differ."""

    collect: tuple[str, ...]
    told: bool = False  # the question and gold answer in its prompt: at collection, in RL and in evaluation


VARIANTS: dict[str, Variant] = {
    "told_prompt": Variant(("show_question=true", "show_answer=true"), told=True),
    # ZeroSearch's labelling cannot label contrast queries (they belong to no trajectory): none.
    "outcome_labels": Variant(("target=trajectory", "contrast_queries=0")),
    "no_contrast": Variant(("contrast_queries=0",)),
}


@dataclass(frozen=True)
class Arm:
    """One RL run: overrides on the quickstart's train.yaml, and what it is trained from."""

    overrides: tuple[str, ...]
    simulator: str = "simulator"  # the quickstart's simulator, or one of VARIANTS (`train_simulator`)
    base: str = "base"  # the quickstart's base, or "knowing" (`train_knowing_base`)


ARMS: dict[str, Arm] = {
    "default": Arm(()),  # the quickstart's recipe: exponential curriculum, simulator, query only, GRPO
    "constant": Arm(("curriculum.kind=constant", "curriculum.p_start={constant_p}")),
    "no_noise": Arm(("curriculum.p_end=0.0",)),
    "loop_bm25": Arm(("search.kind=bm25", "search.corpus={corpus}", "search.index_dir={bm25}", *NO_NOISE)),
    "loop_none": Arm(("search.kind=empty", *NO_NOISE)),
    **{name: Arm((), simulator=name) for name in VARIANTS},  # the simulator alone differs (`simulator_told`)
    "reinforce": Arm(("algorithm.estimator=reinforce",)),
    "ppo": Arm(("algorithm.estimator=ppo", "algorithm.critic_lr={lr}")),
    "ssrl": Arm(
        (
            "rollout.template=self-search",
            "search.kind=self",
            f"sampling.max_new_tokens={SELF_SEARCH_TOKENS}",
            *NO_NOISE,
        ),
        base="knowing",
    ),
}

# JSON key -> (row, engine): EM on BM25 of the arm that answers it.
FIGURES: dict[str, tuple[str, str]] = {
    "curriculum_exp": ("default", "bm25"),
    "curriculum_constant": ("constant", "bm25"),
    "curriculum_none": ("no_noise", "bm25"),
    "loop_simulator": ("default", "bm25"),
    "loop_bm25": ("loop_bm25", "bm25"),
    "loop_none": ("loop_none", "bm25"),
    "simulator_default": ("default", "bm25"),
    "simulator_told_prompt": ("told_prompt", "bm25"),
    "simulator_outcome_labels": ("outcome_labels", "bm25"),
    "simulator_no_contrast": ("no_contrast", "bm25"),
    "algo_reinforce": ("reinforce", "bm25"),
    "algo_grpo": ("default", "bm25"),
    "algo_ppo": ("ppo", "bm25"),
    "ssrl_selfsearch": ("ssrl", "self"),
    "ssrl_sim2real_bm25": ("ssrl", "bm25"),
}
# JSON key -> simulator probed; `leak_noisy_*` gives its noisy share under the same name.
LEAK_FIGURES = {
    "leak_default": "simulator",
    "leak_told_prompt": "told_prompt",
    "leak_outcome_labels": "outcome_labels",
    "leak_no_contrast": "no_contrast",
}


@dataclass(frozen=True)
class Question:
    """One table of the doc: its rows (label, row name), columns (engines) and paired differences."""

    key: str
    title: str
    rows: tuple[tuple[str, str], ...]
    engines: tuple[str, ...] = ENGINES
    pairs: tuple[tuple[str, str], ...] = ()  # (row, reference row): row minus reference, per seed


QUESTIONS = (
    Question(
        "curriculum",
        "1. Curriculum: exponential vs constant noise vs none",
        (
            ("exponential, p_noise 0 to 0.25 (quickstart)", "default"),
            ("constant p_noise, the exponential's mean", "constant"),
            ("no noise", "no_noise"),
            ("reference: base, no RL", "base"),
            ("reference: quickstart RL, 250 steps", "quickstart_rl"),
        ),
        pairs=(("constant", "default"), ("no_noise", "default")),
    ),
    Question(
        "loop",
        "2. What is in the loop: simulator vs real BM25 vs no search",
        (
            ("fine-tuned simulator", "default"),
            ("real BM25 (upper bound)", "loop_bm25"),
            ("no search (empty results)", "loop_none"),
            ("reference: base, no RL", "base"),
        ),
        pairs=(("loop_bm25", "default"), ("loop_none", "default"), ("default", "base")),
    ),
    Question(
        "told",
        "3. The simulator: what it is told, how its pairs are labelled, contrast queries",
        (
            ("query only, retrieved labels, contrast queries (quickstart)", "default"),
            ("question and gold answer in the prompt", "told_prompt"),
            ("outcome labels (ZeroSearch), no contrast queries", "outcome_labels"),
            ("no contrast queries", "no_contrast"),
            ("reference: base, no RL", "base"),
        ),
        pairs=(
            ("told_prompt", "default"),
            ("outcome_labels", "default"),
            ("no_contrast", "default"),
            ("outcome_labels", "no_contrast"),  # the labelling alone
        ),
    ),
    Question(
        "algorithm",
        "4. Algorithm: REINFORCE vs GRPO vs PPO",
        (("REINFORCE", "reinforce"), ("GRPO", "default"), ("PPO", "ppo"), ("reference: base, no RL", "base")),
        pairs=(("reinforce", "default"), ("ppo", "default")),
    ),
    Question(
        "ssrl",
        "5. Self-search (SSRL): its own information vs real engines in its place",
        (("self-search RL", "ssrl"), ("reference: knowing base, no RL", "knowing_base")),
        SELF_ENGINES,
        # the default arm was not evaluated with self-search ("-" there); its own start is the other reference
        pairs=(("ssrl", "default"), ("ssrl", "knowing_base")),
    ),
)
LEAK_ROWS = (
    ("query only, retrieved labels, contrast queries (quickstart)", "simulator"),
    ("question and gold answer in the prompt", "told_prompt"),
    ("outcome labels (ZeroSearch), no contrast queries", "outcome_labels"),
    ("no contrast queries", "no_contrast"),
    ("reference: real BM25", "bm25"),
)
LEAK_PAIRS = (
    ("told_prompt", "simulator"),
    ("outcome_labels", "simulator"),
    ("no_contrast", "simulator"),
    ("outcome_labels", "no_contrast"),  # the labelling alone
)
LEAK_PROBES = ("no_name", "noisy")


@dataclass
class Seed:
    """Where one seed's runs live and what they were built from."""

    seed: int
    smoke: bool
    steps: int
    root: Path  # this benchmark's stages
    quickstart: Path  # the quickstart run reused
    qs_recipe: QuickstartRecipe
    fingerprints: dict[str, str]  # stage -> fingerprint: world, base, simulator, VARIANTS', knowing
    paths: dict[str, str]  # corpus, train, test, bm25, dense, base, simulator, VARIANTS', knowing


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = _parse(argv)
    if args.render:
        return render(Path(args.render), args.out)
    began = time.perf_counter()
    run_dir, out, steps = args.run_dir, args.out, args.steps
    results = {seed: run_seed(seed, args, run_dir, steps) for seed in args.seeds}
    figures = summarize(results, args, steps, wall_s=time.perf_counter() - began)
    figures["provenance"] = provenance()  # after the quickstart set the process's torch threads
    write_doc(out, results, figures)
    print(f"ablations: {out}", flush=True)
    print(json.dumps(figures))
    return figures


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS), help="RL runs (default all)")
    parser.set_defaults(seeds=SEEDS)  # a tuple: a --seeds given on the command line parses to a list
    parser.add_argument(
        "--quickstart-dir", default="", help="the quickstart run of each seed, '{seed}' filled in "
        "(default RUN_DIR/seed_{seed}/quickstart); e.g. 'runs/bench_quickstart/seed_{seed}' reuses those runs",
    )  # fmt: skip
    parser.add_argument("--render", default="", help="run nothing: the doc's tables again from a saved JSON record")
    args = arm_arguments(
        argv, parser, "ablations", steps=STEPS, smoke_steps=SMOKE_STEPS,
        seeds_help="one world, base and simulators per seed (default 0 1 2; smoke 0)",
        smoke_help="every arm for two steps on the quickstart's smoke run",
    )  # fmt: skip
    if isinstance(args.seeds, tuple):  # not given
        args.seeds = [0] if args.smoke else list(SEEDS)
    return args


# --------------------------------------------------------------------------- one seed


def run_seed(seed: int, args: argparse.Namespace, run_dir: Path, steps: int) -> dict[str, Any]:
    """Every stage of one seed; returns its EM rows, leakage and stage times."""
    clock: dict[str, float] = {}
    with timed(clock, "quickstart"):
        ctx, report = prepare(seed, args, run_dir, steps)
    world = pipeline.recipe_world(ctx.qs_recipe)
    for variant in sorted({ARMS[name].simulator for name in args.arms} & set(VARIANTS)):
        with timed(clock, f"simulator_{variant}"):
            train_simulator(ctx, variant, VARIANTS[variant])
    if "ssrl" in args.arms:
        with timed(clock, "knowing_base"):
            knowing_base_stage(ctx, world)
    em = {"base": report["em"]["base"], "quickstart_rl": report["em"]["rl_search"]}
    for name in args.arms:
        with timed(clock, f"rl_{name}"):
            policy_fp = train_arm(ctx, name, ARMS[name])
        with timed(clock, f"eval_{name}"):
            em[name] = evaluate_policy(ctx, name, ARMS[name], policy_fp)
    if "ssrl" in args.arms:
        with timed(clock, "eval_knowing_base"):
            em["knowing_base"] = evaluate_policy(ctx, "knowing_base", ARMS["ssrl"], ctx.fingerprints["knowing"])
    with timed(clock, "leakage"):
        leak = measure_leakage(ctx, world, [v for v in VARIANTS if v in ctx.fingerprints])
    return {"em": em, "leak": leak, "stage_s": {k: round(v, 1) for k, v in clock.items()}}


def prepare(seed: int, args: argparse.Namespace, run_dir: Path, steps: int) -> tuple[Seed, dict[str, Any]]:
    """Runs (or reuses) the seed's quickstart; returns the paths and fingerprints the arms build on."""
    root = run_dir / f"seed_{seed}"
    qs_dir = Path(args.quickstart_dir.format(seed=seed)) if args.quickstart_dir else root / "quickstart"
    qs_recipe = load_recipe(
        QuickstartRecipe, None, [f"run_dir={qs_dir}", f"seed={seed}", f"smoke={args.smoke}", f"threads={args.threads}"]
    )  # the quickstart sets the process's torch threads
    report = quickstart.main(qs_recipe)
    paths = {name: str(qs_dir / "world" / f"{name}.jsonl") for name in ("corpus", "train", "test")}
    paths.update(bm25=str(qs_dir / "index" / "bm25"), dense=str(qs_dir / "index" / "dense"), base=str(qs_dir / "base"))
    paths.update(simulator=str(pipeline.final_model(qs_dir / "simulator")), knowing=str(root / "knowing_base"))
    # a variant's run directory until its model exists (train_simulator)
    paths.update({variant: str(root / f"simulator_{variant}") for variant in VARIANTS})
    fingerprints = {stage: stage_fingerprint(qs_dir / stage) for stage in ("world", "base", "simulator")}
    return Seed(seed, args.smoke, steps, root, qs_dir, qs_recipe, fingerprints, paths), report


# --------------------------------------------------------------------------- the arms' extra stages


def train_simulator(ctx: Seed, name: str, variant: Variant) -> None:
    """A simulator built as the quickstart's (collect.yaml with BM25, then simulator.yaml on the quickstart's
    base) with `variant`'s collect overrides; its model path and fingerprint go to ctx under `name`."""
    collect_dir = ctx.root / f"collect_{name}"
    collect_fp = stages.collect_stage(
        RECIPES / "collect.yaml",
        [
            f"run_dir={collect_dir}", f"seed={ctx.seed}", f"policy.model.path={ctx.paths['base']}",
            f"data.train=[{ctx.paths['train']}]", f"search.corpus={ctx.paths['corpus']}",
            f"search.index_dir={ctx.paths['bm25']}", *variant.collect, *(SMOKE_COLLECT if ctx.smoke else []),
        ],
        [ctx.fingerprints["base"]],
    )  # fmt: skip
    ctx.fingerprints[name] = stages.finetune_stage(
        RECIPES / "simulator.yaml",
        [
            f"run_dir={ctx.paths[name]}", f"seed={ctx.seed}", f"model.path={ctx.paths['base']}",
            f"train_file={collect_dir / 'train.jsonl'}", f"val_file={collect_dir / 'val.jsonl'}",
            *(SMOKE_SIMULATOR if ctx.smoke else []),
        ],
        [collect_fp],
    )  # fmt: skip
    ctx.paths[name] = str(pipeline.final_model(Path(ctx.paths[name])))


def knowing_base_stage(ctx: Seed, world: World) -> None:
    """The SSRL arm's base, built once per fingerprint into ctx.paths['knowing']."""
    steps, batch = SMOKE_KNOWING if ctx.smoke else (KNOWING_STEPS, KNOWING_BATCH)
    settings = {"steps": steps, "batch": batch, "lr": KNOWING_LR, "seed": ctx.seed}
    fingerprint = digest({"stage": "knowing_base", "inputs": [ctx.fingerprints["base"]], "settings": settings})
    out = Path(ctx.paths["knowing"])
    if not claim_stage(out, fingerprint):
        rl = load_recipe(TrainRecipe, RECIPES / "train.yaml", ["run_dir=unused"])
        train_knowing_base(
            ctx.paths["base"], world, out, steps=steps, batch_size=batch, lr=KNOWING_LR, seed=ctx.seed,
            typed_answer_share=ctx.qs_recipe.typed_answer_share, top_k=rl.search.top_k, rendering=rl.search.rendering,
        )  # fmt: skip
        finish_stage(out, fingerprint)
    ctx.fingerprints["knowing"] = fingerprint


def train_knowing_base(
    base: str,
    world: World,
    out: Path,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    typed_answer_share: float,
    top_k: int,
    rendering: str,
) -> None:
    """The quickstart's base, further pretrained so that it knows the training entities' facts.

    A real LLM knows Wikipedia; the quickstart's base knows no fact of the world (its traces'
    information blocks are out of the loss). This base continues on self-search traces
    (`make_traces` with the self-search template: the question, a random query, the BM25
    results for it, an answer copied from them) about the training entities only, with the
    information block IN the loss: it learns to write, for a query, what BM25 would return,
    so it memorizes the training entities' passages as far as `steps` allow. Held-out entities
    stay unseen, so writing their results it can only invent.
    """
    model, tokenizer = load_model(base)
    engine = BM25SearchEngine.build(world.passages, show_progress=False)
    traces = make_traces(
        world, engine, tokenizer, n=steps * batch_size, seed=seed, top_k=top_k, template="self-search",
        examples=world.train, typed_answer_share=typed_answer_share, rendering=rendering,
    )  # fmt: skip
    for trace in traces:
        first = trace.loss_mask.index(1)  # the search turn opens the generated part
        trace.loss_mask[first:] = [1] * (len(trace.loss_mask) - first)
    pretrain(model, traces, steps=steps, batch_size=batch_size, lr=lr, copy_loss_weight=0.0, seed=seed)
    save_tiny(model, tokenizer, out)


# --------------------------------------------------------------------------- RL and evaluation


def train_arm(ctx: Seed, name: str, arm: Arm) -> str:
    """One arm's RL run (train.yaml plus its overrides, same budget as every arm); its fingerprint."""
    rl = load_recipe(TrainRecipe, RECIPES / "train.yaml", ["run_dir=unused"])
    c = rl.curriculum
    values = {
        "constant_p": f"{constant_p_noise(c.p_start, c.p_end, c.base, ctx.steps):.6f}",
        "corpus": ctx.paths["corpus"],
        "bm25": ctx.paths["bm25"],
        "lr": f"{rl.optim.lr:g}",
    }
    overrides = [
        f"seed={ctx.seed}", f"run_dir={ctx.root / 'train' / name}", f"policy.model.path={ctx.paths[arm.base]}",
        f"data.train=[{ctx.paths['train']}]", f"steps={ctx.steps}", "save_every=0",
        f"search.simulator.generation.model.path={ctx.paths[arm.simulator]}",
        f"search.cache={ctx.root / 'cache' / arm.simulator}.sqlite",
        *(f"search.simulator.{shown}=true" for shown in simulator_told(arm.simulator)),
        *(SMOKE_TRAIN if ctx.smoke else []),
        *(o.format(**values) for o in arm.overrides),
    ]  # fmt: skip
    inputs = [ctx.fingerprints[arm.base], ctx.fingerprints[arm.simulator]]
    return stages.train_stage(RECIPES / "train.yaml", overrides, inputs)


def simulator_told(simulator: str) -> tuple[str, ...]:
    """The simulator settings to set true for a simulator as it was trained: both shows for a told variant."""
    told = simulator in VARIANTS and VARIANTS[simulator].told
    return ("show_question", "show_answer") if told else ()


def constant_p_noise(p_start: float, p_end: float, base: float, steps: int) -> float:
    """The mean of ZeroSearch's exponential schedule over a run's steps 0 .. steps - 1 (the constant arm's p)."""
    return statistics.fmean(exponential(i, p_start, p_end, steps, base) for i in range(steps))


def evaluate_policy(ctx: Seed, name: str, arm: Arm, policy_fp: str) -> dict[str, float]:
    """eval.yaml for one policy on the held-out questions; returns EM (percent) per engine."""
    model = ctx.paths["knowing"] if name == "knowing_base" else pipeline.final_model(ctx.root / "train" / name)
    self_search = arm.base == "knowing"
    overrides = [
        f"run_dir={ctx.root / 'eval' / name}", f"seed={ctx.seed}", f"policy.model.path={model}",
        f"datasets=[{{name: heldout, path: {ctx.paths['test']}, limit: {SMOKE_LIMIT if ctx.smoke else 0}}}]",
        f"engines.simulator.simulator.generation.model.path={ctx.paths[arm.simulator]}",
        f"engines.bm25.corpus={ctx.paths['corpus']}", f"engines.bm25.index_dir={ctx.paths['bm25']}",
        f"engines.dense.corpus={ctx.paths['corpus']}", f"engines.dense.index_dir={ctx.paths['dense']}",
        "training_run=''", "baselines=[]", "fidelity_size=0",
        *(f"engines.simulator.simulator.{shown}=true" for shown in simulator_told(arm.simulator)),
        *(["engines.self.kind=self", "rollout.template=self-search", f"sampling.max_new_tokens={SELF_SEARCH_TOKENS}"]
          if self_search else []),
        *(SMOKE_EVAL if ctx.smoke else []),
    ]  # fmt: skip
    inputs = [policy_fp, ctx.fingerprints[arm.simulator], ctx.fingerprints["world"]]
    stages.eval_stage(RECIPES / "eval.yaml", overrides, inputs)
    summary = json.loads((ctx.root / "eval" / name / "summary.json").read_text())
    return {engine: 100.0 * row["average"]["em"] for engine, row in summary["rows"].items()}


# --------------------------------------------------------------------------- answer leakage


def question_without_name(question: str, name: str) -> str:
    """The question's words without the entity's name: a query that names no one."""
    return " ".join(w for w in re.findall(r"[A-Za-z0-9]+", question) if w != name)


def answer_leakage(engine: SearchEngine, world: World, *, n: int, top_k: int) -> dict[str, float]:
    """Shares of result sets holding a gold answer (`contains_answer`) on the first `n` training questions.

    - `no_name`: useful results (num_noisy 0) for the question's words without the entity's
      name; a real engine finds the answer with such a query only by chance;
    - `noisy`: noisy results (num_noisy = top_k) for the question itself, which names the entity;
      the curriculum counts on them not holding the answer.

    One `search` call with every request; the requests carry the question and gold answers, which
    a simulator shows only when told to. Returns fractions in [0, 1].
    """
    examples = world.train[:n]

    def request(query: str, example: Any, num_noisy: int) -> SearchRequest:
        return SearchRequest(
            query=query, top_k=top_k, question=example.question, golden_answers=list(example.golden_answers),
            num_noisy=num_noisy,
        )  # fmt: skip

    requests = [request(question_without_name(e.question, world.facts[e.id].entity), e, 0) for e in examples]
    requests += [request(e.question, e, top_k) for e in examples]
    results = engine.search(requests)
    hits = [contains_answer(docs, r.golden_answers) for docs, r in zip(results, requests)]
    return {"no_name": statistics.fmean(hits[:n]), "noisy": statistics.fmean(hits[n:])}


def measure_leakage(ctx: Seed, world: World, variants: list[str]) -> dict[str, dict[str, float]]:
    """Leakage of the quickstart's simulator and of the trained `variants`, as the RL runs configured them
    (uncached) but with the noisy documents' answers kept: what each simulator writes, which the RL
    recipe's `noisy_answers: redact` then takes out; and of BM25 for reference."""
    n = SMOKE_LEAK if ctx.smoke else LEAK_QUESTIONS
    rl = load_recipe(TrainRecipe, RECIPES / "train.yaml", ["run_dir=unused"])
    leak: dict[str, dict[str, float]] = {}
    for key in ("simulator", *variants):
        cfg = load_recipe(
            TrainRecipe, RECIPES / "train.yaml",
            ["run_dir=unused", f"search.simulator.generation.model.path={ctx.paths[key]}", "search.cache=''",
             "search.simulator.noisy_answers=keep",
             *(f"search.simulator.{shown}=true" for shown in simulator_told(key))],
        ).search  # fmt: skip
        engine = build_search_engine(cfg, seed=ctx.seed)
        assert engine is not None  # kind=simulator
        leak[key] = answer_leakage(engine, world, n=n, top_k=rl.search.top_k)
    bm25 = BM25SearchEngine.build(world.passages, show_progress=False)
    # A real engine has no noisy mode: only its no-name share is a reference.
    leak["bm25"] = {"no_name": answer_leakage(bm25, world, n=n, top_k=rl.search.top_k)["no_name"]}
    return leak


# --------------------------------------------------------------------------- figures and the doc


def summarize(
    results: dict[int, dict[str, Any]], args: argparse.Namespace, steps: int, *, wall_s: float
) -> dict[str, Any]:
    """The JSON figures: FIGURES' keys (EM points, mean over seeds; None for an arm not run), leakage, the
    questions' paired differences (`differences`: "row-reference" -> engine -> mean, ci_low, ci_high), detail."""
    figures: dict[str, Any] = {}
    for key, (row, engine) in FIGURES.items():
        values = [r["em"][row][engine] for r in results.values() if row in r["em"]]
        figures[key] = round(statistics.fmean(values), 2) if values else None
    for key, simulator in LEAK_FIGURES.items():
        for probe, prefix in (("no_name", "leak_"), ("noisy", "leak_noisy_")):
            values = [100.0 * r["leak"][simulator][probe] for r in results.values() if simulator in r["leak"]]
            figures[prefix + key.removeprefix("leak_")] = round(statistics.fmean(values), 2) if values else None
    differences: dict[str, dict[str, dict[str, float | None]]] = {}
    for question in QUESTIONS:
        for row, against in question.pairs:
            for engine in question.engines:
                diffs = paired(results, "em", row, against, engine)
                if diffs:
                    differences.setdefault(f"{row}-{against}", {})[engine] = paired_figures(diffs)
    rl = load_recipe(TrainRecipe, RECIPES / "train.yaml", ["run_dir=unused"]).curriculum
    figures.update(
        differences=differences,
        interval_method=INTERVAL_METHOD,
        wall_s=round(wall_s, 1),
        steps=steps,
        seeds=list(results),
        smoke=args.smoke,
        constant_p_noise=round(constant_p_noise(rl.p_start, rl.p_end, rl.base, steps), 6),
        by_seed={str(seed): r for seed, r in results.items()},
    )
    return figures


def paired(
    results: dict[int, dict[str, Any]], section: str, row: str, against: str, column: str, scale: float = 1.0
) -> list[float]:
    """`scale` x (row minus against) in results[seed][section][...][column], for each seed that measured both."""
    return [
        scale * (r[section][row][column] - r[section][against][column])
        for r in results.values()
        if column in r[section].get(row, {}) and column in r[section].get(against, {})
    ]


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    mean, sd = mean_sd(values)
    return f"{mean:.1f} ± {sd:.1f}"


DIFFERENCE_HEAD = (
    f"Paired difference, row minus reference, per seed on the same world (EM points): mean, and {INTERVAL_METHOD}; "
    "an interval that holds 0 is no measurable difference:"
)


def table_lines(question: Question, results: dict[int, dict[str, Any]]) -> list[str]:
    """The markdown tables of one question: EM (%) per engine, mean ± sd over seeds; the paired differences of
    `question.pairs`; for the simulator question, answer leakage and its differences."""
    head = "| policy | " + " | ".join(question.engines) + " |"
    lines = [head, "|---|" + "---|" * len(question.engines)]
    for label, row in question.rows:
        cells = [_cell([r["em"][row][e] for r in results.values() if row in r["em"]]) for e in question.engines]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", DIFFERENCE_HEAD, "", "| row − reference | " + " | ".join(question.engines) + " |"]
    lines.append("|---|" + "---|" * len(question.engines))
    for row, against in question.pairs:
        cells = [difference_cell(paired(results, "em", row, against, e)) for e in question.engines]
        lines.append(f"| `{row}` − `{against}` | " + " | ".join(cells) + " |")
    if question.key == "told":
        lines += leakage_lines(results)
    return lines


def leakage_lines(results: dict[int, dict[str, Any]]) -> list[str]:
    """The leakage table (percent, mean ± sd over seeds) and each variant's paired difference against the
    quickstart's simulator."""
    lines = ["", "Answer leakage on training questions (% of result sets holding a gold answer; noisy results as the "
             "simulator writes them, before the RL recipe's redaction):", ""]  # fmt: skip
    lines += ["| simulator | query without the name | noisy results, query names the entity |", "|---|---|---|"]
    for label, sim in LEAK_ROWS:
        cells = [
            _cell([100.0 * r["leak"][sim][p] for r in results.values() if p in r["leak"].get(sim, {})])
            for p in LEAK_PROBES
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", DIFFERENCE_HEAD.replace("EM points", "percentage points"), ""]
    lines += ["| simulator − reference | query without the name | noisy results |", "|---|---|---|"]
    for sim, against in LEAK_PAIRS:
        cells = [difference_cell(paired(results, "leak", sim, against, p, scale=100.0)) for p in LEAK_PROBES]
        lines.append(f"| `{sim}` − `{against}` | " + " | ".join(cells) + " |")
    return lines


def plot_question(question: Question, results: dict[int, dict[str, Any]], path: Path) -> Path:
    """Grouped bars: engines as groups, the table's rows as bars, sd over seeds as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(12, 6), dpi=100)
    rows = [(label, row) for label, row in question.rows if any(row in r["em"] for r in results.values())]
    width = 0.8 / max(1, len(rows))
    for i, (label, row) in enumerate(rows):
        stats = [mean_sd([r["em"][row][e] for r in results.values() if row in r["em"]]) for e in question.engines]
        offsets = [g - 0.4 + width * (i + 0.5) for g in range(len(question.engines))]
        bars = ax.bar(offsets, [m for m, _ in stats], width, yerr=[s for _, s in stats], capsize=3, label=label)
        ax.bar_label(bars, labels=[f"{m:.1f}" for m, _ in stats], fontsize="x-small", padding=2)
    ax.set_xticks(range(len(question.engines)), question.engines)
    ax.set_ylabel("held-out EM (%)")
    ax.set_ylim(0, 100)
    ax.set_title(question.title)
    if rows:
        ax.legend(fontsize="small", loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path


def render(record: Path, out: Path) -> dict[str, Any]:
    """The doc's tables from a saved record (the JSON object a run prints) without running anything: the
    differences and their intervals computed again from its per-seed figures, the table blocks and charts of
    `out` rewritten (its measured and wall blocks kept), the record's figures updated. Returns them."""
    figures = json.loads(record.read_text())
    results = {int(seed): r for seed, r in figures["by_seed"].items()}
    fresh = summarize(results, argparse.Namespace(smoke=figures["smoke"]), figures["steps"], wall_s=figures["wall_s"])
    figures.update(differences=fresh["differences"], interval_method=fresh["interval_method"])
    write_doc(out, results, figures, tables_only=True)
    record.write_text(json.dumps(figures, indent=1) + "\n")
    print(f"ablations: {out} from {record}", flush=True)
    return figures


def write_doc(
    out: Path, results: dict[int, dict[str, Any]], figures: dict[str, Any], *, tables_only: bool = False
) -> None:
    """Fills each question's block of `out` (`<!-- table:KEY -->` ... `<!-- /table:KEY -->`), the commit and
    machine (`<!-- measured -->`) and the wall time (not with `tables_only`), keeping the prose.

    A missing doc, or one without the blocks, is started from `SKELETON`. Charts go to the
    folder named like the doc without its suffix (docs/ablations/KEY.png).
    """
    text = out.read_text() if out.is_file() else SKELETON
    names = ["measured", "wall", *(f"table:{q.key}" for q in QUESTIONS)]
    if not all(f"<!-- {n} -->" in text and f"<!-- /{n} -->" in text for n in names):
        text = SKELETON
    charts = out.with_suffix("")
    seeds = ", ".join(str(s) for s in figures["seeds"])
    for question in QUESTIONS:
        chart = plot_question(question, results, charts / f"{question.key}.png")
        block = [
            f"Held-out EM (%), greedy, mean ± sd over seeds {seeds}; {figures['steps']} RL steps an arm"
            + (" (smoke: a pipeline check, not a result)" if figures["smoke"] else "")
            + ".",
            "",
            *table_lines(question, results),
            "",
            f"![{question.title}]({charts.name}/{chart.name})",
        ]
        text = replace_block(text, f"table:{question.key}", "\n".join(["", *block, ""]))
    if not tables_only:
        text = replace_block(text, "wall", f"{figures['wall_s'] / 60:.1f} min")
        measured = measured_at(figures["provenance"]) + f" Seeds {seeds}; {figures['steps']} RL steps an arm."
        text = replace_block(text, "measured", "\n" + measured + "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)


def _skeleton() -> str:
    blocks = {q.key: f"<!-- table:{q.key} -->\nNot measured yet.\n<!-- /table:{q.key} -->" for q in QUESTIONS}
    return SKELETON_TEXT.format(**blocks, steps=STEPS)


SKELETON_TEXT = """# Ablations: ZeroSearch's and SSRL's findings, measured in miniature

    python -m benchmarks.ablations --seeds 0 1 2

<!-- measured -->
Not measured yet.
<!-- /measured -->

On the quickstart's tiny world, base and simulator (reused from a quickstart run of the same seed
when its stages' fingerprints match), one RL policy per arm, each with the quickstart's RL recipe
(`recipes/quickstart/train.yaml`) plus the arm's overrides and the same budget: {steps} steps of 8
questions x 16 rollouts (the quickstart runs 250), so the numbers here sit below the quickstart's.
Each policy is evaluated greedily on the held-out entities' questions against the simulator, BM25
and dense retrieval (`recipes/quickstart/eval.yaml`). EM is strict exact match. Each table gives
each arm's paired difference against the default arm (the same world per seed) with its 95%
t-interval over seeds (Student's t, n - 1 degrees of freedom); an interval that holds 0 is written
"no measurable difference". One seed gives the mean alone. Wall time of the last full run:
<!-- wall -->not measured yet<!-- /wall -->. The arms and how each is built: the docstring of
`benchmarks/ablations.py`. The tables below are rewritten by each run; the text around them is not.

## Budget

An estimate per seed, from the quickstart's stage times (docs/quickstart.md) and an RL step of
about 0.9 s against the simulator, not a measurement:

| stage | estimate |
|---|---|
| quickstart (world, base, collect, simulator SFT, its own RL and evaluation) | 12.5 min |
| three simulator variants: collect and SFT each, as the quickstart's | 9 min |
| knowing base for self-search: 400 steps of 32 traces | 2 min |
| RL, {steps} steps of 11 arms: 7 on a simulator (0.9 s), BM25 (0.7), empty (0.6), PPO (1.3), self-search (2) | 11 min |
| evaluation: 12 policies, 10-15 s each; leakage probes of four simulators | 4 min |

About 40 minutes a seed, two hours for the default three, on an idle 2-core machine. With the
quickstart runs already there (`--quickstart-dir 'runs/bench_quickstart/seed_{{seed}}'` reuses the
quickstart benchmark's), a seed costs about 27 minutes. Torch threads contend badly with any
other process on a 2-core machine (tiny models run 10-100x slower): run it on an idle machine.

## 1. Curriculum

ZeroSearch raises the share of noisy searches along an exponential curve and reports it ahead of
a schedule without that easy-to-hard order. Here: the quickstart's exponential schedule (p_noise
0 to 0.25), a constant p_noise equal to that schedule's mean over the run, and no noise.

{curriculum}

## 2. What is in the loop

ZeroSearch reports its fine-tuned 14B simulator ahead of real Google search in the loop (34.47 vs
32.81, Qwen-2.5-3B-base). Here: the fine-tuned tiny simulator, real BM25 (an upper bound: the
engine the policy is evaluated on) and no search at all (empty results).

{loop}

## 3. The simulator: what it is told, how its pairs are labelled, contrast queries

ZeroSearch's simulator differs from ours in three ways; each arm changes one, against the default
(the quickstart's simulator: the query alone in its prompt, pairs labelled by what BM25
retrieved, one contrast query per search). `told_prompt`: the question and gold answer in the
simulator's prompt (collected and fine-tuned so, and told them in RL and evaluation).
`outcome_labels`: ZeroSearch's Search Simulation Tuning, pairs labelled by the trajectory's
outcome; contrast queries belong to no trajectory, so that simulator has none, and `no_contrast`
(the default without contrast queries) is its reference for the labelling alone. Leakage: the
share of result sets that hold the answer when the query does not name the entity, and of noisy
results.

{told}

## 4. Algorithm

ZeroSearch recommends REINFORCE (GRPO sometimes collapsed for them) and also reports PPO. Same
budget, same batches; PPO's critic learns at the actor's learning rate.

{algorithm}

## 5. Self-search (SSRL)

SSRL trains a policy that writes its own search results, then evaluates it with real search in
their place and reports large gains (Qwen2.5-7B-Instruct 30.2 with self-search, about 47 with real
search). Self-search needs a base that knows facts: this arm's base is the quickstart's base
further pretrained on self-search traces about the training entities with the information block in
the loss (`train_knowing_base`), so it knows some of their facts, as a real LLM knows Wikipedia,
and none of the held-out entities'.

{ssrl}
"""
SKELETON = _skeleton()


if __name__ == "__main__":
    main()
