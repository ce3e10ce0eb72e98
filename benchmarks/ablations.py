"""ZeroSearch's and SSRL's findings, measured in miniature: one RL policy per arm on the quickstart's world.

    python -m benchmarks.ablations --seeds 0 1 2 --jobs 3         # the full benchmark: docs/ablations.md
    python -m benchmarks.ablations --arms default ppo             # some arms only (the others stay "-")
    python -m benchmarks.ablations --smoke                        # every arm for two steps, in a temp dir
    python -m benchmarks.ablations --render docs/ablations/figures.json   # the page again from a record

Per world (seed), in RUN_DIR/world_SEED: `simsearch quickstart` (`--quickstart-dir`, default
RUN_DIR/world_{seed}/quickstart), the arms' own simulators (`VARIANTS`) and the SSRL arm's base
(`simsearch.experiments.variants`), one RL run per arm of `ARMS` with the quickstart's train.yaml, the arm's
edits and `--steps`, each policy's greedy held-out EM (`ENGINES`; `SELF_ENGINES` for self-search), and
the simulators' answer leakage. Why each arm: docs/ablations.md, one table per `QUESTIONS`.

Prints the page's blocks (`table:KEY` per question, `measured`, `wall`; a chart per question beside it)
and as its last line one JSON object: `FIGURES`' keys (EM on BM25, mean over worlds), `leak_*` and
`leak_noisy_*`, `differences` (pair -> engine -> mean, ci_low, ci_high), `interval_method`, `steps`,
`constant_p_noise`, `by_seed` (each world's record: `em`, `leak`, `stage_s`, `wall_s`, `steps`),
`wall_s` and `provenance`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import study
from benchmarks.benchlib import INTERVAL_METHOD, NO_NOISE, RECIPES, mean_sd, rounded_mean, timed
from benchmarks.benchlib import paired as paired_figures
from benchmarks.study import Arm, Of
from simsearch.config import TrainRecipe, load_recipe
from simsearch.curriculum.schedules import exponential
from simsearch.experiments import pipeline, quickstart, variants

ENGINES = ("simulator", "bm25", "dense")
SELF_ENGINES = ("self", *ENGINES)  # a self-search policy also writes its own information
SELF_SEARCH_TOKENS = 160  # one self-search generation holds the query, ~3 written results and the answer
LEAK_QUESTIONS, SMOKE_LEAK = 200, 4  # training questions per leakage probe
SMOKE_LIMIT = 4  # held-out questions per evaluation in smoke mode


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
    "loop_bm25": Arm(study.engine("bm25")),
    "loop_none": Arm(study.engine("empty", ())),
    **{name: Arm(simulator=name) for name in VARIANTS},  # the simulator alone differs
    "reinforce": Arm({"algorithm.estimator": "reinforce"}),
    "ppo": Arm({"algorithm.estimator": "ppo", "algorithm.critic_lr": Of("lr")}),
    "ssrl": Arm(  # from the self-search base (`variants.self_search_base`)
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
    (("query only, retrieved labels, contrast queries (quickstart)", "default"),
     ("question and gold answer in the prompt", "told_prompt"),
     ("outcome labels (ZeroSearch), no contrast queries", "outcome_labels"), ("no contrast queries", "no_contrast"),
     BASE),
    pairs=(("told_prompt", "default"), ("outcome_labels", "default"), ("no_contrast", "default"),
           ("outcome_labels", "no_contrast")),  # the last: the labelling alone
)  # fmt: skip
QUESTIONS = (
    Question(
        "curriculum",
        "1. Curriculum: exponential vs constant noise vs none",
        (("exponential, p_noise 0 to 0.25 (quickstart)", "default"), ("constant p_noise, the exponential's mean",
         "constant"), ("no noise", "no_noise"), BASE, ("reference: the quickstart's RL run", "quickstart_rl")),
        pairs=(("constant", "default"), ("no_noise", "default")),
    ),
    Question(
        "loop",
        "2. What is in the loop: simulator vs real BM25 vs no search",
        (("fine-tuned simulator", "default"), ("real BM25 (upper bound)", "loop_bm25"),
         ("no search (empty results)", "loop_none"), BASE),
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
)  # fmt: skip


def _probed(row: str) -> str:
    """The simulator a row of the simulator question trained on: the leakage table's row."""
    return "simulator" if row == "default" else row


# The simulator question's rows and pairs, by simulator, with real BM25 for reference.
LEAK_ROWS = (*((label, _probed(row)) for label, row in TOLD.rows[:-1]), ("reference: real BM25", "bm25"))
LEAK_PAIRS = tuple((_probed(row), _probed(against)) for row, against in TOLD.pairs)
LEAK_PROBES = ("no_name", "noisy")


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quickstart-dir", default="", help="the quickstart run of each world, '{seed}' filled in (default "
        "RUN_DIR/world_{seed}/quickstart); e.g. 'runs/controls/world_{seed}/quickstart' reuses those runs",
    )  # fmt: skip


# --------------------------------------------------------------------------- one world (a worker)


def run_world(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Every stage of one world; its record: EM rows, leakage, stage and wall times, RL steps an arm."""
    began, clock = time.perf_counter(), {}
    root = args.run_dir / f"world_{seed}"
    qs_dir = Path(args.quickstart_dir.format(seed=seed)) if args.quickstart_dir else root / "quickstart"
    with timed(clock, "quickstart"):
        qs = study.quickstart_recipe(qs_dir, seed, args)  # the quickstart sets the process's torch threads
        report = quickstart.main(qs)
    paths, fingerprints = pipeline.finished_run(qs_dir)
    ctx = study.Run(seed, args, {**paths, "knowing": str(root / "knowing_base")}, fingerprints)
    world = pipeline.recipe_world(qs)
    for name in sorted({ARMS[arm].simulator for arm in args.arms} & set(VARIANTS)):
        with timed(clock, f"simulator_{name}"):
            ctx.fingerprints[name], ctx.paths[name] = variants.simulator_variant(
                root, name, RECIPES, seed=seed, paths=paths, base_fp=ctx.fingerprints["base"],
                collect=VARIANTS[name].collect, smoke=args.smoke,
            )  # fmt: skip
    if "ssrl" in args.arms:
        with timed(clock, "knowing_base"):
            ctx.fingerprints["knowing"] = variants.self_search_base(
                root / "knowing_base", paths["base"], ctx.fingerprints["base"], world, train_recipe(), seed=seed,
                typed=qs.tinyworld.typed_answer_share, smoke=args.smoke,
            )  # fmt: skip
    em = {"base": report["em"]["base"], "quickstart_rl": report["em"]["rl_search"]}
    for name in args.arms:
        with timed(clock, f"rl_{name}"):
            policy_fp = train_arm(ctx, name, ARMS[name])
        with timed(clock, f"eval_{name}"):
            em[name] = evaluate_policy(ctx, name, ARMS[name], policy_fp)
    if "ssrl" in args.arms:
        with timed(clock, "eval_knowing_base"):
            em["knowing_base"] = evaluate_policy(ctx, "knowing_base", ARMS["ssrl"], ctx.fingerprints["knowing"])
    simulators = {name: (ctx.paths[name], name in VARIANTS and VARIANTS[name].told)
                  for name in ("simulator", *VARIANTS) if name in ctx.fingerprints}  # fmt: skip
    with timed(clock, "leakage"):
        n = SMOKE_LEAK if args.smoke else LEAK_QUESTIONS
        leak = variants.leakage(RECIPES / "train.yaml", world, simulators, n=n, seed=seed)
    wall_s = round(time.perf_counter() - began, 1)
    return {"em": em, "leak": leak, "stage_s": {k: round(v, 1) for k, v in clock.items()}, "wall_s": wall_s,
            "steps": args.steps}  # fmt: skip


def train_arm(ctx: study.Run, name: str, arm: Arm) -> str:
    """One arm's RL run (train.yaml plus its edits, the same budget as every arm); its fingerprint."""
    rl = train_recipe()
    c = rl.curriculum
    values = {"constant_p": f"{constant_p_noise(c.p_start, c.p_end, c.base, ctx.args.steps):.6f}",
              "corpus": ctx.paths["corpus"], "bm25": ctx.paths["bm25"], "lr": f"{rl.optim.lr:g}"}  # fmt: skip
    overrides = [
        f"steps={ctx.args.steps}", "save_every=0", f"search.simulator.generation.model.path={ctx.paths[arm.simulator]}",
        f"search.cache={ctx.root / 'cache' / arm.simulator}.sqlite",
        *(f"search.simulator.{shown}=true" for shown in simulator_told(arm.simulator)), *arm.overrides(values),
    ]  # fmt: skip
    return ctx.train(name, [ctx.fingerprints[arm.base], ctx.fingerprints[arm.simulator]], overrides, base=arm.base)


def train_recipe() -> TrainRecipe:
    """The quickstart's RL recipe (its run directory unused)."""
    return load_recipe(TrainRecipe, RECIPES / "train.yaml", ["run_dir=unused"])


def simulator_told(simulator: str) -> tuple[str, ...]:
    """The simulator settings to set true for a simulator as it was trained: both shows for a told variant."""
    return variants.TOLD if simulator in VARIANTS and VARIANTS[simulator].told else ()


def constant_p_noise(p_start: float, p_end: float, base: float, steps: int) -> float:
    """The mean of ZeroSearch's exponential schedule over a run's steps 0 .. steps - 1 (the constant arm's p)."""
    return statistics.fmean(exponential(i, p_start, p_end, steps, base) for i in range(steps))


def evaluate_policy(ctx: study.Run, name: str, arm: Arm, policy_fp: str) -> dict[str, float]:
    """eval.yaml for one policy on the held-out questions; returns EM (percent) per engine."""
    model = ctx.paths["knowing"] if name == "knowing_base" else pipeline.final_model(ctx.root / "train" / name)
    overrides = [
        f"engines.simulator.simulator.generation.model.path={ctx.paths[arm.simulator]}",
        *(f"engines.simulator.simulator.{shown}=true" for shown in simulator_told(arm.simulator)),
        *(["engines.self.kind=self", "rollout.template=self-search", f"sampling.max_new_tokens={SELF_SEARCH_TOKENS}"]
          if arm.base == "knowing" else []),  # a self-search policy
    ]  # fmt: skip
    rows = ctx.evaluate(
        ctx.root / "eval" / name,
        model,
        [policy_fp, ctx.fingerprints[arm.simulator], ctx.fingerprints["world"]],
        {"heldout": ctx.paths["test"]},
        {e: (ctx.paths["corpus"], ctx.paths[e]) for e in ("bm25", "dense")},
        overrides=overrides,
        smoke_limit=SMOKE_LIMIT,
    )
    return {engine: 100.0 * row["average"]["em"] for engine, row in rows.items()}


# --------------------------------------------------------------------------- over worlds: figures and the page


def summarize(results: dict[int, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The JSON figures: FIGURES' keys (EM points, mean over worlds; None for an arm not run), leakage, the
    questions' paired differences, the RL steps and the worlds' records (`by_seed`)."""
    del args

    figures: dict[str, Any] = {}
    for key, (row, engine) in FIGURES.items():
        figures[key] = rounded_mean([r["em"][row][engine] for r in results.values() if row in r["em"]])
    for key, simulator in LEAK_FIGURES.items():
        for probe, prefix in (("no_name", "leak_"), ("noisy", "leak_noisy_")):
            values = [100.0 * r["leak"][simulator][probe] for r in results.values() if simulator in r["leak"]]
            figures[prefix + key.removeprefix("leak_")] = rounded_mean(values)
    budgets = {r["steps"] for r in results.values()}
    if len(budgets) != 1:
        raise SystemExit(f"ablations: the worlds ran different --steps ({sorted(budgets)}); sum up one budget")
    steps, rl = budgets.pop(), train_recipe().curriculum
    figures.update(
        differences=differences(results), interval_method=INTERVAL_METHOD, steps=steps,
        constant_p_noise=round(constant_p_noise(rl.p_start, rl.p_end, rl.base, steps), 6),
        by_seed={str(seed): r for seed, r in results.items()},
    )  # fmt: skip
    return figures


def differences(results: dict[int, dict[str, Any]]) -> dict[str, dict[str, dict[str, float | None]]]:
    """Each question's pairs: "row-reference" -> engine -> mean, ci_low, ci_high, where both were measured."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for question in QUESTIONS:
        for row, against in question.pairs:
            for engine in question.engines:
                diffs = study.paired_values(results.values(), row, against, engine)
                if diffs:
                    out.setdefault(f"{row}-{against}", {})[engine] = paired_figures(diffs)
    return out


def _records(figures: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(seed): r for seed, r in figures["by_seed"].items()}


def page(figures: dict[str, Any], args: argparse.Namespace) -> dict[str, str]:
    """The page's blocks from the figures alone: `measured`, `wall` and one `table:KEY` per question, each
    from the worlds' records (`by_seed`). Sets the figures' `differences` again from them, so that the JSON
    a render prints holds the intervals this code computes."""
    results = _records(figures)
    figures.update(differences=differences(results), interval_method=INTERVAL_METHOD)
    minutes = sorted(round(r["wall_s"] / 60) for r in results.values())
    blocks = {
        "measured": study.measured_block(figures),
        "wall": f"{minutes[0]}-{minutes[-1]} min" if minutes[0] != minutes[-1] else f"{minutes[0]} min",
    }
    for q in QUESTIONS:
        head = f"Held-out EM (%), greedy, {study.over_seeds(figures)}."
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
    worlds, pairs = list(results.values()), [(f"`{row}` − `{ref}`", row, ref) for row, ref in question.pairs]
    lines = [*study.means_table(["policy", *question.engines], worlds, question.rows, question.engines), "",
             DIFFERENCE_HEAD, "", *study.differences_table(["row − reference", *question.engines], worlds, pairs,
                                                           question.engines)]  # fmt: skip
    return lines + leakage_lines(results) if question.key == "told" else lines


def leakage_lines(results: dict[int, dict[str, Any]]) -> list[str]:
    """The leakage table (percent, mean ± sd over seeds) and each variant's paired difference against the
    quickstart's simulator."""

    def leak(record: dict[str, Any], row: str, probe: str) -> float | None:
        return record["leak"].get(row, {}).get(probe)

    worlds, pairs = list(results.values()), [(f"`{row}` − `{ref}`", row, ref) for row, ref in LEAK_PAIRS]
    means = ["simulator", "query without the name", "noisy results, query names the entity"]
    minus = ["simulator − reference", "query without the name", "noisy results"]
    return ["", "Answer leakage on training questions (% of result sets holding a gold answer; noisy results as the "
            "simulator writes them, before the RL recipe's redaction):", "",
            *study.means_table(means, worlds, LEAK_ROWS, LEAK_PROBES, leak, scale=100.0), "",
            DIFFERENCE_HEAD.replace("EM points", "percentage points"), "",
            *study.differences_table(minus, worlds, pairs, LEAK_PROBES, leak, scale=100.0)]  # fmt: skip


def charts(figures: dict[str, Any], out: Path, worlds: Any = None) -> None:
    """One bar chart per question, beside the page (docs/ablations/KEY.png for docs/ablations.md): engines as
    groups, the table's rows as bars, sd over seeds as error bars."""
    del worlds
    results = _records(figures).values()
    for q in QUESTIONS:
        rows = [(label, row) for label, row in q.rows if any(row in r["em"] for r in results)]
        bars = [(label, [mean_sd([r["em"][row][e] for r in results if row in r["em"]]) for e in q.engines])
                for label, row in rows]  # fmt: skip
        study.bar_chart(out.with_suffix("") / f"{q.key}.png", q.title, q.engines, bars)


STUDY = study.Study(
    name="ablations",
    description=__doc__ or "",
    title="Ablations: ZeroSearch's and SSRL's findings, measured in miniature",
    seeds=(0, 1, 2),  # reporting worlds (below 100), none tuned on
    world=run_world,
    summary=summarize,
    page=page,
    options=_options,
    done=study.bm25_line,
    charts=charts,
    arms=ARMS,
    steps=60,  # RL steps per arm (the quickstart runs 50), see docs/ablations.md
)
main = STUDY.main


if __name__ == "__main__":
    main()
