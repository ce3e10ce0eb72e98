"""ZeroSearch's and SSRL's findings, measured in miniature: one RL policy per arm on the quickstart's world.

    python -m benchmarks.ablations --seeds 0 1 2 --jobs 3         # the full benchmark: docs/ablations.md
    python -m benchmarks.ablations --arms default ppo             # some arms only (the others stay "-")
    python -m benchmarks.ablations --smoke                        # every arm for two steps, in a temp dir
    python -m benchmarks.ablations --render docs/ablations/figures.json   # the page again from a record

Per world (seed), in RUN_DIR/world_SEED: `simsearch quickstart` (reused through its fingerprints;
`--quickstart-dir`, default RUN_DIR/world_{seed}/quickstart), the arms' own simulators (`VARIANTS`) and
the SSRL arm's base, then one RL run per arm of `ARMS` (each answering a question of `QUESTIONS`) with
`recipes/quickstart/train.yaml`, its overrides and `--steps`, and `recipes/quickstart/eval.yaml` for each
policy on the held-out questions against `ENGINES` (`SELF_ENGINES` for self-search), then the simulators'
answer leakage. Every stage is fingerprinted. Why each arm, and the departures from the papers:
docs/ablations.md.

Output: each world's record, RUN_DIR/world_SEED/ablations.json (`em`, `leak`, `stage_s`, `wall_s`,
`steps`, `provenance`); the blocks of docs/ablations.md (`--out`): `table:KEY` per question (with the
paired differences of `Question.pairs`), `measured` and `wall`, and a PNG chart per question in
docs/ablations/; as the last line one JSON object: `FIGURES`' keys (EM on BM25, mean over seeds),
`leak_*` (`LEAK_FIGURES`), `differences` (pair -> engine -> mean, ci_low, ci_high), `interval_method`,
`wall_s`, `provenance` and the detail (`by_seed`, `leak_noisy_*`, `constant_p_noise`, `steps`, `seeds`,
`smoke`). `--render RECORD` runs nothing: it rewrites the blocks and charts from such a JSON object
(docs/ablations/figures.json), the differences recomputed from `by_seed`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import study
from benchmarks.benchlib import INTERVAL_METHOD, NO_NOISE, RECIPES, difference_cell, mean_sd, timed
from benchmarks.benchlib import paired as paired_figures
from benchmarks.study import Arm, Of
from simsearch.config import QuickstartRecipe, TrainRecipe, load_recipe
from simsearch.curriculum.schedules import exponential
from simsearch.experiments import pipeline, probes, quickstart, stages
from simsearch.factory.build import build_search_engine
from simsearch.fingerprints import claim_stage, digest, finish_stage, stage_fingerprint
from simsearch.models import load_model, save_tiny
from simsearch.retrieval.bm25 import BM25SearchEngine
from simsearch.tinyworld.pretrain import pretrain
from simsearch.tinyworld.traces import make_traces
from simsearch.tinyworld.world import World

ENGINES = ("simulator", "bm25", "dense")
SELF_ENGINES = ("self", *ENGINES)  # a self-search policy also writes its own information
STEPS = 60  # RL steps per arm (the quickstart runs 250), see docs/ablations.md
SELF_SEARCH_TOKENS = 160  # one self-search generation holds the query, ~3 written results and the answer
KNOWING_STEPS, KNOWING_BATCH, KNOWING_LR = 400, 32, 1e-3  # the SSRL arm's base: pretraining on facts
LEAK_QUESTIONS = 200  # training questions per leakage probe

# Smoke: every stage for a step or two, as the quickstart's smoke does.
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


ARMS: dict[str, Arm] = {
    "default": Arm(),  # the quickstart's recipe: exponential curriculum, simulator, query only, GRPO
    "constant": Arm({"curriculum.kind": "constant", "curriculum.p_start": Of("constant_p")}),
    "no_noise": Arm({"curriculum.p_end": "0.0"}),
    "loop_bm25": Arm({"search.kind": "bm25", "search.corpus": Of("corpus"), "search.index_dir": Of("bm25"),
                      **NO_NOISE}),
    "loop_none": Arm({"search.kind": "empty", **NO_NOISE}),
    # the simulator alone differs: a VARIANTS' (`train_simulator`, `simulator_told`)
    **{name: Arm(simulator=name) for name in VARIANTS},
    "reinforce": Arm({"algorithm.estimator": "reinforce"}),
    "ppo": Arm({"algorithm.estimator": "ppo", "algorithm.critic_lr": Of("lr")}),
    "ssrl": Arm(  # from the knowing base (`knowing_base_stage`)
        {"rollout.template": "self-search", "search.kind": "self", "sampling.max_new_tokens": str(SELF_SEARCH_TOKENS),
         **NO_NOISE},
        base="knowing",
    ),
}  # fmt: skip

# JSON key -> (row, engine): EM on BM25 of the arm that answers it.
FIGURES: dict[str, tuple[str, str]] = {
    "curriculum_exp": ("default", "bm25"), "curriculum_constant": ("constant", "bm25"),
    "curriculum_none": ("no_noise", "bm25"),
    "loop_simulator": ("default", "bm25"), "loop_bm25": ("loop_bm25", "bm25"), "loop_none": ("loop_none", "bm25"),
    "simulator_default": ("default", "bm25"), "simulator_told_prompt": ("told_prompt", "bm25"),
    "simulator_outcome_labels": ("outcome_labels", "bm25"), "simulator_no_contrast": ("no_contrast", "bm25"),
    "algo_reinforce": ("reinforce", "bm25"), "algo_grpo": ("default", "bm25"), "algo_ppo": ("ppo", "bm25"),
    "ssrl_selfsearch": ("ssrl", "self"), "ssrl_sim2real_bm25": ("ssrl", "bm25"),
}  # fmt: skip
# JSON key -> simulator probed; `leak_noisy_*` gives its noisy share under the same name.
LEAK_FIGURES = {"leak_default": "simulator", **{f"leak_{name}": name for name in VARIANTS}}


@dataclass(frozen=True)
class Question:
    """One table of the doc: its rows (label, row name), columns (engines) and paired differences."""

    key: str
    title: str
    rows: tuple[tuple[str, str], ...]
    engines: tuple[str, ...] = ENGINES
    pairs: tuple[tuple[str, str], ...] = ()  # (row, reference row): row minus reference, per seed


BASE = ("reference: base, no RL", "base")
TOLD = Question(
    "told",
    "3. The simulator: what it is told, how its pairs are labelled, contrast queries",
    (
        ("query only, retrieved labels, contrast queries (quickstart)", "default"),
        ("question and gold answer in the prompt", "told_prompt"),
        ("outcome labels (ZeroSearch), no contrast queries", "outcome_labels"),
        ("no contrast queries", "no_contrast"),
        BASE,
    ),
    pairs=(("told_prompt", "default"), ("outcome_labels", "default"), ("no_contrast", "default"),
           ("outcome_labels", "no_contrast")),  # the last: the labelling alone
)  # fmt: skip
QUESTIONS = (
    Question(
        "curriculum",
        "1. Curriculum: exponential vs constant noise vs none",
        (
            ("exponential, p_noise 0 to 0.25 (quickstart)", "default"),
            ("constant p_noise, the exponential's mean", "constant"),
            ("no noise", "no_noise"),
            BASE,
            ("reference: the quickstart's RL run", "quickstart_rl"),
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
            BASE,
        ),
        pairs=(("loop_bm25", "default"), ("loop_none", "default"), ("default", "base")),
    ),
    TOLD,
    Question(
        "algorithm",
        "4. Algorithm: REINFORCE vs GRPO vs PPO",
        (("REINFORCE", "reinforce"), ("GRPO", "default"), ("PPO", "ppo"), BASE),
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


def _probed(row: str) -> str:
    """The simulator a row of the simulator question trained on: the leakage table's row."""
    return "simulator" if row == "default" else row


# The simulator question's rows and pairs, by simulator, with real BM25 for reference.
LEAK_ROWS = (*((label, _probed(row)) for label, row in TOLD.rows[:-1]), ("reference: real BM25", "bm25"))
LEAK_PAIRS = tuple((_probed(row), _probed(against)) for row, against in TOLD.pairs)
LEAK_PROBES = ("no_name", "noisy")


@dataclass
class Seed:
    """Where one world's runs live and what they were built from."""

    seed: int
    smoke: bool
    steps: int
    root: Path  # this benchmark's stages: RUN_DIR/world_SEED
    qs_recipe: QuickstartRecipe
    fingerprints: dict[str, str]  # stage -> fingerprint: world, base, simulator, VARIANTS', knowing
    paths: dict[str, str]  # corpus, train, test, bm25, dense, base, simulator, VARIANTS', knowing


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=0, help=f"RL steps per arm (default {STEPS}; smoke {SMOKE_STEPS})")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS), help="RL runs (default all)")
    parser.add_argument(
        "--quickstart-dir", default="", help="the quickstart run of each world, '{seed}' filled in (default "
        "RUN_DIR/world_{seed}/quickstart); e.g. 'runs/controls/world_{seed}/quickstart' reuses those runs",
    )  # fmt: skip


# --------------------------------------------------------------------------- one world (a worker)


def run_world(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Every stage of one world; its record: EM rows, leakage, stage and wall times, RL steps an arm."""
    began = time.perf_counter()
    steps = args.steps or (SMOKE_STEPS if args.smoke else STEPS)
    clock: dict[str, float] = {}
    with timed(clock, "quickstart"):
        ctx, report = prepare(seed, args, steps)
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
    stage_s = {k: round(v, 1) for k, v in clock.items()}
    return {"em": em, "leak": leak, "stage_s": stage_s, "wall_s": round(time.perf_counter() - began, 1), "steps": steps}


def prepare(seed: int, args: argparse.Namespace, steps: int) -> tuple[Seed, dict[str, Any]]:
    """Runs (or reuses) the world's quickstart; returns the paths and fingerprints the arms build on."""
    root = args.run_dir / f"world_{seed}"
    qs_dir = Path(args.quickstart_dir.format(seed=seed)) if args.quickstart_dir else root / "quickstart"
    qs_recipe = study.quickstart_recipe(qs_dir, seed, args)  # the quickstart sets the process's torch threads
    report = quickstart.main(qs_recipe)
    paths = {name: str(qs_dir / "world" / f"{name}.jsonl") for name in ("corpus", "train", "test")}
    paths.update(bm25=str(qs_dir / "index" / "bm25"), dense=str(qs_dir / "index" / "dense"), base=str(qs_dir / "base"))
    paths.update(simulator=str(pipeline.final_model(qs_dir / "simulator")), knowing=str(root / "knowing_base"))
    # a variant's run directory until its model exists (train_simulator)
    paths.update({variant: str(root / f"simulator_{variant}") for variant in VARIANTS})
    fingerprints = {stage: stage_fingerprint(qs_dir / stage) for stage in ("world", "base", "simulator")}
    return Seed(seed, args.smoke, steps, root, qs_recipe, fingerprints, paths), report


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
    """The SSRL arm's base, built once per fingerprint into ctx.paths['knowing']: the quickstart's base further
    pretrained on self-search traces (`make_traces`) about the training entities only, their information
    blocks in the loss, so that it knows those entities' facts (docs/ablations.md, question 5)."""
    steps, batch = SMOKE_KNOWING if ctx.smoke else (KNOWING_STEPS, KNOWING_BATCH)
    settings = {"steps": steps, "batch": batch, "lr": KNOWING_LR, "seed": ctx.seed}
    ctx.fingerprints["knowing"] = fingerprint = digest(
        {"stage": "knowing_base", "inputs": [ctx.fingerprints["base"]], "settings": settings}
    )
    out = Path(ctx.paths["knowing"])
    if claim_stage(out, fingerprint):
        return
    search = train_recipe().search
    model, tokenizer = load_model(ctx.paths["base"])
    engine = BM25SearchEngine.build(world.passages, show_progress=False)
    traces = make_traces(
        world, engine, tokenizer, n=steps * batch, seed=ctx.seed, top_k=search.top_k, template="self-search",
        examples=world.train, typed_answer_share=ctx.qs_recipe.tinyworld.typed_answer_share, rendering=search.rendering,
    )  # fmt: skip
    for trace in traces:
        first = trace.loss_mask.index(1)  # the search turn opens the generated part
        trace.loss_mask[first:] = [1] * (len(trace.loss_mask) - first)
    pretrain(model, traces, steps=steps, batch_size=batch, lr=KNOWING_LR, copy_loss_weight=0.0, seed=ctx.seed)
    save_tiny(model, tokenizer, out)
    finish_stage(out, fingerprint)


# --------------------------------------------------------------------------- RL and evaluation


def train_arm(ctx: Seed, name: str, arm: Arm) -> str:
    """One arm's RL run (train.yaml plus its overrides, same budget as every arm); its fingerprint."""
    rl = train_recipe()
    c = rl.curriculum
    values = {
        "constant_p": f"{constant_p_noise(c.p_start, c.p_end, c.base, ctx.steps):.6f}",
        "corpus": ctx.paths["corpus"],
        "bm25": ctx.paths["bm25"],
        "lr": f"{rl.optim.lr:g}",
    }
    overrides = [
        f"steps={ctx.steps}", "save_every=0", f"search.simulator.generation.model.path={ctx.paths[arm.simulator]}",
        f"search.cache={ctx.root / 'cache' / arm.simulator}.sqlite",
        *(f"search.simulator.{shown}=true" for shown in simulator_told(arm.simulator)),
        *arm.overrides(values),
    ]  # fmt: skip
    return study.train(
        ctx.root / "train" / name, seed=ctx.seed, base=ctx.paths[arm.base], questions=ctx.paths["train"],
        inputs=[ctx.fingerprints[arm.base], ctx.fingerprints[arm.simulator]], overrides=overrides, smoke=ctx.smoke,
    )  # fmt: skip


def train_recipe(*overrides: str) -> TrainRecipe:
    """The quickstart's RL recipe with `overrides` (its run directory unused)."""
    return load_recipe(TrainRecipe, RECIPES / "train.yaml", ["run_dir=unused", *overrides])


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
    overrides = [
        f"engines.simulator.simulator.generation.model.path={ctx.paths[arm.simulator]}",
        *(f"engines.simulator.simulator.{shown}=true" for shown in simulator_told(arm.simulator)),
        *(["engines.self.kind=self", "rollout.template=self-search", f"sampling.max_new_tokens={SELF_SEARCH_TOKENS}"]
          if arm.base == "knowing" else []),  # a self-search policy
    ]  # fmt: skip
    rows = study.evaluate(
        ctx.root / "eval" / name, model, seed=ctx.seed, datasets={"heldout": ctx.paths["test"]},
        limit=SMOKE_LIMIT if ctx.smoke else 0,
        engines={e: (ctx.paths["corpus"], ctx.paths[e]) for e in ("bm25", "dense")},
        inputs=[policy_fp, ctx.fingerprints[arm.simulator], ctx.fingerprints["world"]], overrides=overrides,
        smoke=ctx.smoke,
    )  # fmt: skip
    return {engine: 100.0 * row["average"]["em"] for engine, row in rows.items()}


# --------------------------------------------------------------------------- answer leakage


def measure_leakage(ctx: Seed, world: World, variants: list[str]) -> dict[str, dict[str, float]]:
    """Leakage of the quickstart's simulator and of the trained `variants`, as the RL runs configured them
    (uncached) but with the noisy documents' answers kept: what each simulator writes, which the RL
    recipe's `noisy_answers: redact` then takes out; and of BM25 for reference."""
    n = SMOKE_LEAK if ctx.smoke else LEAK_QUESTIONS
    rl = train_recipe()
    leak: dict[str, dict[str, float]] = {}
    for key in ("simulator", *variants):
        cfg = train_recipe(
            f"search.simulator.generation.model.path={ctx.paths[key]}", "search.cache=''",
            "search.simulator.noisy_answers=keep", *(f"search.simulator.{shown}=true" for shown in simulator_told(key)),
        ).search  # fmt: skip
        engine = build_search_engine(cfg, seed=ctx.seed)
        assert engine is not None  # kind=simulator
        leak[key] = probes.answer_leakage(engine, world, n=n, top_k=rl.search.top_k)
    bm25 = BM25SearchEngine.build(world.passages, show_progress=False)
    # A real engine has no noisy mode: only its no-name share is a reference.
    leak["bm25"] = {"no_name": probes.answer_leakage(bm25, world, n=n, top_k=rl.search.top_k)["no_name"]}
    return leak


# --------------------------------------------------------------------------- over worlds: figures and the page


def summarize(results: dict[int, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The JSON figures: FIGURES' keys (EM points, mean over worlds; None for an arm not run), leakage, the
    questions' paired differences, the RL steps and the worlds' records (`by_seed`)."""
    del args
    figures: dict[str, Any] = {}
    for key, (row, engine) in FIGURES.items():
        figures[key] = _mean([r["em"][row][engine] for r in results.values() if row in r["em"]])
    for key, simulator in LEAK_FIGURES.items():
        for probe, prefix in (("no_name", "leak_"), ("noisy", "leak_noisy_")):
            values = [100.0 * r["leak"][simulator][probe] for r in results.values() if simulator in r["leak"]]
            figures[prefix + key.removeprefix("leak_")] = _mean(values)
    budgets = {r["steps"] for r in results.values()}
    if len(budgets) != 1:
        raise SystemExit(f"ablations: the worlds ran different --steps ({sorted(budgets)}); sum up one budget")
    steps = budgets.pop()
    rl = train_recipe().curriculum
    figures.update(
        differences=differences(results),
        interval_method=INTERVAL_METHOD,
        steps=steps,
        constant_p_noise=round(constant_p_noise(rl.p_start, rl.p_end, rl.base, steps), 6),
        by_seed={str(seed): r for seed, r in results.items()},
    )
    return figures


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 2) if values else None


def differences(results: dict[int, dict[str, Any]]) -> dict[str, dict[str, dict[str, float | None]]]:
    """Each question's pairs: "row-reference" -> engine -> mean, ci_low, ci_high, where both were measured."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for question in QUESTIONS:
        for row, against in question.pairs:
            for engine in question.engines:
                diffs = paired(results, "em", row, against, engine)
                if diffs:
                    out.setdefault(f"{row}-{against}", {})[engine] = paired_figures(diffs)
    return out


def paired(
    results: dict[int, dict[str, Any]], section: str, row: str, against: str, column: str, scale: float = 1.0
) -> list[float]:
    """`scale` x (row minus against) in results[seed][section][...][column], for each seed that measured both."""
    return [
        scale * (r[section][row][column] - r[section][against][column])
        for r in results.values()
        if column in r[section].get(row, {}) and column in r[section].get(against, {})
    ]


def _records(figures: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(seed): r for seed, r in figures["by_seed"].items()}


def page(figures: dict[str, Any], args: argparse.Namespace) -> dict[str, str]:
    """The page's blocks from the figures alone: `measured`, `wall` and one `table:KEY` per question, each
    from the worlds' records (`by_seed`). Sets the figures' `differences` again from them, so that the JSON
    a render prints holds the intervals this code computes."""
    results = _records(figures)
    figures.update(differences=differences(results), interval_method=INTERVAL_METHOD)
    seeds = ", ".join(str(s) for s in figures["seeds"])
    budget = f"{figures['steps']} RL steps an arm"
    smoke = " (smoke: a pipeline check, not a result)" if figures["smoke"] else ""
    minutes = sorted(round(r["wall_s"] / 60) for r in results.values())
    blocks = {
        # two lines: the runner keeps a block of several lines on lines of its own
        "measured": f"{study.measured(figures['provenance'])}\nSeeds {seeds}; {budget}.",
        "wall": f"{minutes[0]}-{minutes[-1]} min" if minutes[0] != minutes[-1] else f"{minutes[0]} min",
    }
    for q in QUESTIONS:
        head = f"Held-out EM (%), greedy, mean ± sd over seeds {seeds}; {budget}{smoke}."
        chart = f"![{q.title}]({args.out.with_suffix('').name}/{q.key}.png)"
        blocks[f"table:{q.key}"] = "\n".join([head, "", *table_lines(q, results), "", chart])
    return blocks


DIFFERENCE_HEAD = (
    f"Paired difference, row minus reference, per seed on the same world (EM points): mean, and {INTERVAL_METHOD}; "
    "an interval that holds 0 is no measurable difference:"
)


def table_lines(question: Question, results: dict[int, dict[str, Any]]) -> list[str]:
    """The markdown tables of one question: EM (%) per engine, mean ± sd over seeds; the paired differences of
    `question.pairs`; for the simulator question, answer leakage and its differences."""
    heads = (["policy", *question.engines], DIFFERENCE_HEAD, ["row − reference", *question.engines])
    lines = _tables(results, "em", question.rows, question.pairs, question.engines, heads)
    return lines + leakage_lines(results) if question.key == "told" else lines


def leakage_lines(results: dict[int, dict[str, Any]]) -> list[str]:
    """The leakage table (percent, mean ± sd over seeds) and each variant's paired difference against the
    quickstart's simulator."""
    heads = (["simulator", "query without the name", "noisy results, query names the entity"],
             DIFFERENCE_HEAD.replace("EM points", "percentage points"),
             ["simulator − reference", "query without the name", "noisy results"])  # fmt: skip
    return ["", "Answer leakage on training questions (% of result sets holding a gold answer; noisy results as the "
            "simulator writes them, before the RL recipe's redaction):", "",
            *_tables(results, "leak", LEAK_ROWS, LEAK_PAIRS, LEAK_PROBES, heads, scale=100.0)]  # fmt: skip


def _tables(
    results: dict[int, dict[str, Any]],
    section: str,
    rows: Sequence[tuple[str, str]],
    pairs: Sequence[tuple[str, str]],
    columns: Sequence[str],
    heads: tuple[list[str], str, list[str]],
    scale: float = 1.0,
) -> list[str]:
    """Two tables of `scale` x results[seed][section][row][column]: each (label, row)'s mean ± sd over seeds, "-"
    where none measured it, then each (row, reference)'s paired difference (`difference_cell`). `heads`: the
    first table's header, the line introducing the second and its header."""
    means = ([label, *(study.spread([scale * r[section][row][c] for r in results.values()
                                     if c in r[section].get(row, {})]) for c in columns)]
             for label, row in rows)  # fmt: skip
    differences = ([f"`{row}` − `{against}`", *(difference_cell(paired(results, section, row, against, c, scale))
                                                for c in columns)] for row, against in pairs)  # fmt: skip
    return [*study.table(heads[0], means), "", heads[1], "", *study.table(heads[2], differences)]


def charts(figures: dict[str, Any], out: Path, worlds: Any = None) -> None:
    """One bar chart per question, beside the page (docs/ablations/KEY.png for docs/ablations.md), from the
    figures."""
    del worlds
    for question in QUESTIONS:
        plot_question(question, _records(figures), out.with_suffix("") / f"{question.key}.png")


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


def _done(record: dict[str, Any]) -> str:
    return "BM25 EM: " + ", ".join(f"{name} {em['bm25']:.1f}" for name, em in record["em"].items() if "bm25" in em)


STUDY = study.Study(
    name="ablations",
    description=__doc__ or "",
    title="Ablations: ZeroSearch's and SSRL's findings, measured in miniature",
    seeds=(0, 1, 2),  # reporting worlds (below 100), none tuned on
    world=run_world,
    summary=summarize,
    page=page,
    options=_options,
    done=_done,
    charts=charts,
)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return study.main(STUDY, argv)


if __name__ == "__main__":
    main()
