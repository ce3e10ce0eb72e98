"""IGPO's turn rewards and DAPO's dynamic sampling vs GRPO on two-hop questions, in miniature.

    python -m benchmarks.turn_rewards                  # worlds 0 1 2, the defaults: docs/turn_rewards.md
    python -m benchmarks.turn_rewards --steps 120      # a longer run (the budget: docs/turn_rewards.md)
    python -m benchmarks.turn_rewards --smoke          # every arm for two steps, world 0, in a temp dir
    python -m benchmarks.turn_rewards --render docs/turn_rewards/figures.json   # the table again from a record

Per world, in RUN_DIR/world_SEED: the quickstart's world with two-hop questions and its base
(`TWO_HOP_SHARE`, `TWO_SEARCH_SHARE`), one RL run per arm of `ARMS` against BM25 (`--steps` each), and each
policy's and the base's greedy held-out EM on BM25, one-hop and two-hop. The design: docs/turn_rewards.md.

Prints the page's `table`, `measured` and `wall` blocks and as its last line one JSON object: `grpo_em`,
`igpo_em`, `grpo_dynamic_em` (EM, mean over worlds), `grpo_flat_share`, `igpo_flat_share`,
`igpo_s_per_step_over_grpo`, `differences` (arm -> EM column -> mean, ci_low, ci_high against grpo),
`interval_method`, `provenance`, `by_world`, `steps`, `seeds`, `smoke` and `wall_s`. `--render RECORD`
rewrites the `table` block alone from such a JSON object, the differences recomputed from `by_world`.
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path
from typing import Any

from benchmarks import study
from benchmarks.benchlib import INTERVAL_METHOD, paired, rounded_mean, timed
from simsearch.data.qa import write_qa_jsonl
from simsearch.experiments import pipeline, probes
from simsearch.fingerprints import digest
from simsearch.tinyworld.world import TWO_HOP, World

LOOP = study.engine("bm25")  # what every arm's RL loop searches (with up to MAX_TURNS searches): real BM25, no noise
ARMS: dict[str, study.Arm] = {
    "grpo": study.Arm(LOOP),
    "igpo": study.Arm({**LOOP, "algorithm.estimator": "igpo"}),
    "grpo_dynamic": study.Arm({**LOOP, "algorithm.dynamic_sampling": "true"}),
}
SEEDS = (0, 1, 2)  # the full run's worlds: reporting worlds (below 100), none tuned on
REFERENCE = "grpo"  # the arm every other is compared with, paired by world
MAX_TURNS = 3  # searches before the final answer turn
TWO_HOP_SHARE = 1.0  # every person gets a two-hop question (world)
TWO_SEARCH_SHARE = 0.5  # pretraining traces that search twice (base)
DATASETS = ("one_hop", "two_hop")
EM_COLUMNS = ("all", *DATASETS)

# Smoke: every stage for a step or two, on the quickstart's smoke base in a small world (its dense index,
# which the quickstart's world stage builds, takes seconds instead of a minute).
SMOKE_WORLD = ["tinyworld.n_entities=24", "tinyworld.n_train_entities=16", "tinyworld.n_background_entities=48"]
SMOKE_LIMIT = 4  # held-out questions per dataset


# --------------------------------------------------------------------------- one world (a worker)


def run_world(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """World, base, data, every arm's RL and every policy's evaluation in RUN_DIR/world_SEED; the world's
    record: EM, RL metrics and stage times."""
    run, clock = study.Run(seed, args), {}
    with timed(clock, "world_and_base"):
        recipe = study.quickstart_recipe(
            run.root / "world_and_base", seed, args, f"tinyworld.two_hop_share={TWO_HOP_SHARE}",
            f"tinyworld.two_search_share={TWO_SEARCH_SHARE}", *(SMOKE_WORLD if args.smoke else []),
        )  # fmt: skip
        world, run.paths, run.fingerprints = pipeline.world_and_base(recipe)
    files, run.fingerprints["data"] = write_data(world, run.root / "data", seed, limit=SMOKE_LIMIT if args.smoke else 0)
    run.paths.update(files)
    with timed(clock, "eval_base"):
        em = {"base": evaluate_policy(run, "base", run.paths["base"], run.fingerprints["base"])}
    rl: dict[str, dict[str, float]] = {}
    for arm, spec in ARMS.items():
        with timed(clock, f"rl_{arm}"):
            overrides = [f"steps={args.steps}", "save_every=0", f"rollout.max_turns={MAX_TURNS}",
                         *spec.overrides(run.paths)]  # fmt: skip
            policy_fp = run.train(arm, [run.fingerprints["base"], run.fingerprints["data"]], overrides)
        rl[arm] = probes.rl_metrics(run.root / "train" / arm)
        with timed(clock, f"eval_{arm}"):
            em[arm] = evaluate_policy(run, arm, str(pipeline.final_model(run.root / "train" / arm)), policy_fp)
    return {"em": em, "rl": rl, "stage_s": {k: round(v, 1) for k, v in clock.items()}}


def _done(record: dict[str, Any]) -> str:
    return "held-out EM on BM25: " + ", ".join(f"{arm} {record['em'][arm]['all']:.1f}" for arm in ARMS)


def split_questions(world: World, seed: int) -> dict[str, list[Any]]:
    """Training questions (every two-hop one and as many one-hop ones) and held-out ones, by hop.

    The one-hop questions are a seeded draw of as many as there are two-hop ones, in world order,
    so each file is half two-hop (train) or as large as the other (held out).
    """
    rng = random.Random(seed)
    splits: dict[str, list[Any]] = {}
    for name, questions in (("train", world.train), ("test", world.test)):
        two = [q for q in questions if world.facts[q.id].relation == TWO_HOP]
        one = [q for q in questions if world.facts[q.id].relation != TWO_HOP]
        kept = set(rng.sample(range(len(one)), min(len(two), len(one))))
        one = [q for i, q in enumerate(one) if i in kept]
        if name == "train":
            splits["train"] = one + two
        else:
            splits["one_hop"], splits["two_hop"] = one, two
    return splits


def write_data(world: World, directory: Path, seed: int, *, limit: int) -> tuple[dict[str, str], str]:
    """The question files (`split_questions`; held-out ones cut to `limit` when > 0); their paths and digest."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, questions in split_questions(world, seed).items():
        files[name] = str(directory / f"{name}.jsonl")
        write_qa_jsonl(questions[:limit] if limit and name != "train" else questions, files[name])
    return files, digest({name: Path(path).read_text() for name, path in files.items()})


def evaluate_policy(run: study.Run, name: str, model: str, policy_fp: str) -> dict[str, float]:
    """Greedy held-out EM (percent) on BM25: per dataset and `all` (their average: the sets are as large; cut to
    `SMOKE_LIMIT` questions by `write_data` with --smoke)."""
    row = run.evaluate(
        run.root / "eval" / name, model, [policy_fp, run.fingerprints["data"]], {d: run.paths[d] for d in DATASETS},
        {"bm25": (run.paths["corpus"], run.paths["bm25"])}, keep={"bm25": "bm25"},
        overrides=[f"rollout.max_turns={MAX_TURNS}"],
    )["bm25"]  # fmt: skip
    return {"all": 100.0 * row["average"]["em"], **{d: 100.0 * row["results"][d]["em"] for d in DATASETS}}


# --------------------------------------------------------------------------- over worlds, and the page

ROWS = (("base, no RL", "base"), ("GRPO", "grpo"), ("IGPO turn rewards", "igpo"),
        ("GRPO + dynamic sampling", "grpo_dynamic"))  # fmt: skip


def summarize(worlds: dict[int, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The JSON figures: EM points on BM25 and flat shares (means over worlds), igpo's step time over grpo's,
    the paired differences against REFERENCE, `steps` and `by_world` (the runner adds the rest)."""
    records = list(worlds.values())

    figures: dict[str, Any] = {f"{arm}_em": rounded_mean([r["em"][arm]["all"] for r in records], 4) for arm in ARMS}
    for arm in ("grpo", "igpo"):
        figures[f"{arm}_flat_share"] = rounded_mean([r["rl"][arm]["flat_share"] for r in records], 4)
    step_s = {arm: statistics.fmean(r["rl"][arm]["step_s"] for r in records) for arm in ("grpo", "igpo")}
    figures["igpo_s_per_step_over_grpo"] = round(step_s["igpo"] / step_s["grpo"], 4)
    figures["differences"] = {
        arm: {column: paired(study.paired_values(records, arm, REFERENCE, column)) for column in EM_COLUMNS}
        for arm in ARMS
        if arm != REFERENCE
    }
    figures.update(interval_method=INTERVAL_METHOD, steps=args.steps, by_world={str(s): r for s, r in worlds.items()})
    return figures


def table_lines(worlds: dict[Any, dict[str, Any]]) -> list[str]:
    """The markdown tables from the world records: held-out EM on BM25 (all, one-hop, two-hop) and the RL
    run's metrics, mean ± sd; then each arm's paired difference in EM against REFERENCE."""
    records = list(worlds.values())
    metrics = (("flat_share", 2), ("step_s", 2), ("prompts_per_step", 1), ("searches", 2))

    def cells(row: str) -> list[str]:
        em = [study.spread([r["em"][row][d] for r in records]) for d in EM_COLUMNS]
        if row not in ARMS:  # the base: no RL run
            return em + ["-"] * len(metrics)
        return em + [study.spread([r["rl"][row][key] for r in records], digits) for key, digits in metrics]

    header = ["policy", "EM all", "EM one-hop", "EM two-hop", "flat groups", "s / step", "prompts / step",
              "searches / traj"]  # fmt: skip
    pairs = [(label, row, REFERENCE) for label, row in ROWS if row in ARMS and row != REFERENCE]
    return [
        *study.table(header, ([label, *cells(row)] for label, row in ROWS)),
        "",
        f"Paired difference in held-out EM against {REFERENCE}, per seed on the same world (EM points): mean, and "
        f"{INTERVAL_METHOD}; an interval that holds 0 is no measurable difference:",
        "",
        *study.differences_table(
            [f"arm − {REFERENCE}", "EM all", "EM one-hop", "EM two-hop"], records, pairs, EM_COLUMNS
        ),
    ]


def page(figures: dict[str, Any], args: argparse.Namespace) -> dict[str, str]:
    """The page's blocks: `table` from `by_world`; with --render that alone, else `measured` (the commit and
    machine, worlds and steps) and `wall` (the run's minutes) too."""
    head = f"Held-out EM (%) on BM25, greedy, and the RL runs' means over steps; {study.over_seeds(figures)}."
    table = "\n".join([head, "", *table_lines(figures["by_world"])])
    if args.render:
        return {"table": table}
    return {"measured": study.measured_block(figures), "table": table, "wall": f"{figures['wall_s'] / 60:.1f} min"}


STUDY = study.Study(
    name="turn_rewards",
    description=__doc__ or "",
    title="Turn rewards: IGPO and dynamic sampling vs GRPO on two-hop questions",
    seeds=SEEDS,
    world=run_world,
    summary=summarize,
    page=page,
    done=_done,
    steps=60,  # RL steps per arm, see docs/turn_rewards.md
)
main = STUDY.main


if __name__ == "__main__":
    main()
