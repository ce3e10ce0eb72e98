"""Why a control arm's policy names the person in its queries: a probe of a controls run's policies. A study
of `benchmarks.study` (its options, workers, --aggregate and --render), with no page: it prints its tables.

    python -m benchmarks.naming --controls RUNS --seeds 0 1 2 3 4            # every policy RUNS holds
    python -m benchmarks.naming --controls RUNS --seeds 1 --reseed 1 11 12    # the noisy arm trained again
    python -m benchmarks.naming --controls RUNS --seeds 0 1 --aggregate       # the tables again, nothing run
    python -m benchmarks.naming --smoke --controls SMOKE_RUNS                 # on a `benchmarks.controls --smoke` run

Per world of the `benchmarks.controls` run CONTROLS (`--controls`, required): each policy there (the base,
the simulator arm, each control arm with a checkpoint) evaluated greedily on the training and held-out
questions against `PROBES`' engines (`probe_policy`, into CONTROLS/world_SEED/naming/POLICY), and each RL
run's saved trajectories read by half (`training_naming`); `--reseed S ...` first trains `--arm` (default
noisy) again with seed S into CONTROLS/world_SEED/train/ARM_seedS, saving every trajectory. Every stage is
fingerprinted. How to read the tables: docs/controls/naming/README.md.

A world's record is RUN_DIR/world_SEED/naming.json (RUN_DIR: runs/naming by default), its log beside it.
Prints two tables per world and, as its last line, one JSON object: `by_world` (policy -> "ENGINE/SET" ->
em, named_share, em_named, em_unnamed; "training" -> RL run -> half -> samples, named_share, reward_named,
reward_unnamed), `arm`, `reseed`, `seeds`, `smoke`, `wall_s` and `provenance`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from benchmarks import study
from benchmarks.controls import ARMS, SMOKE_LIMIT
from simsearch.config import TrainRecipe, load_recipe
from simsearch.experiments import pipeline, probes, stages
from simsearch.fingerprints import stage_fingerprint

PROBES = tuple((engine, dataset) for engine in ("none", "noisy", "bm25") for dataset in ("train", "heldout"))


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--controls", type=Path, help="the benchmarks.controls run directory probed (required)")
    parser.add_argument("--arm", choices=list(ARMS), default="noisy", help="the control arm --reseed trains again")
    parser.add_argument("--reseed", type=int, nargs="*", default=[], help="seeds to train --arm again with")


def _check(args: argparse.Namespace) -> str:
    """A missing controls run, in one line (nothing to check with --render or --aggregate)."""
    if args.render or args.aggregate:
        return ""
    if args.controls is None or not args.controls.is_dir():
        return f"--controls {args.controls or '(not given)'}: no such directory; name a benchmarks.controls run"
    for seed in args.seeds:
        if not (args.controls / f"world_{seed}" / "quickstart" / "recipe.yaml").is_file():
            return f"--controls {args.controls}: world {seed} holds no finished quickstart; run benchmarks.controls"
    return ""


def probe_world(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One world's probes: each policy's EM and naming per (engine, question set), and its RL runs' logs."""
    if args.threads:
        torch.set_num_threads(args.threads)
    root = args.controls / f"world_{seed}"
    qs_dir = root / "quickstart"
    qs = pipeline.saved_recipe(qs_dir)
    world = pipeline.recipe_world(qs)
    runs = {"simulator": qs_dir / "train"}
    runs.update({arm: root / "train" / arm for arm in ARMS if (root / "train" / arm / "checkpoints").is_dir()})
    for reseed in args.reseed:
        runs[f"{args.arm}_seed{reseed}"] = reseed_arm(root, args.arm, reseed)
    policies = {"base": (qs_dir / "base", stage_fingerprint(qs_dir / "base"))}
    policies.update({name: (pipeline.final_model(run), stage_fingerprint(run)) for name, run in runs.items()})
    evaluated = {name: probe_policy(root, qs_dir, qs.seed, name, p, args.smoke) for name, p in policies.items()}
    return {
        "policies": {
            name: {key: probes.naming_cells(out, world, *key.split("/")) for key in _keys()}
            for name, out in evaluated.items()
        },
        "training": {name: probes.training_naming(run, world) for name, run in runs.items()},
    }


def reseed_arm(root: Path, arm: str, seed: int) -> Path:
    """`arm`'s RL run again from the recipe it saved, with `seed`, saving every trajectory; its run directory."""
    saved = root / "train" / arm / "recipe.yaml"
    if not saved.is_file():
        raise SystemExit(f"naming: {saved}: no such run; --reseed needs the arm trained in this run directory")
    recipe = load_recipe(TrainRecipe, saved, [])
    out = root / "train" / f"{arm}_seed{seed}"
    every = recipe.prompts_per_step * recipe.rollout.group_size
    overrides = [f"seed={seed}", f"run_dir={out}", f"trajectory_samples={every}", "trajectory_every=1"]
    stages.train_stage(saved, overrides, [stage_fingerprint(root / "train" / arm)])
    return out


def probe_policy(root: Path, qs_dir: Path, seed: int, name: str, policy: tuple[Path, str], smoke: bool) -> Path:
    """eval.yaml for one policy (model, its stage fingerprint) on the training and held-out questions against
    `none`, `noisy` (eval.yaml's simulator engine, noise on every search, answers redacted) and `bm25`; its
    run directory."""
    model, fingerprint = policy
    out, world_dir = root / "naming" / name, qs_dir / "world"
    overrides = [
        f"engines.simulator.simulator.generation.model.path={pipeline.final_model(qs_dir / 'simulator')}",
        "engines.simulator.simulator.noisy_answers=redact",
        "noisy_share=1.0",
    ]
    inputs = [fingerprint, stage_fingerprint(qs_dir / "world"), stage_fingerprint(qs_dir / "simulator")]
    datasets = {"train": str(world_dir / "train.jsonl"), "heldout": str(world_dir / "test.jsonl")}
    study.evaluate(
        out, model, seed=seed, datasets=datasets, limit=SMOKE_LIMIT if smoke else 0,
        engines={"bm25": (str(world_dir / "corpus.jsonl"), str(qs_dir / "index" / "bm25"))},
        keep={"none": "none", "noisy": "simulator", "bm25": "bm25"}, inputs=inputs, overrides=overrides, smoke=smoke,
    )  # fmt: skip
    return out


def _keys() -> list[str]:
    return [f"{engine}/{dataset}" for engine, dataset in PROBES]


def _summary(worlds: dict[int, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The figures: each world's probes as its record holds them (the provenance is the figures')."""
    by_world = {str(seed): {k: v for k, v in record.items() if k != "provenance"} for seed, record in worlds.items()}
    return {"by_world": by_world, "arm": args.arm, "reseed": args.reseed}


def page(figures: dict[str, Any], args: argparse.Namespace) -> dict[str, str]:
    """No page: each world's tables, printed."""
    del args
    for seed, result in figures["by_world"].items():
        print_world(seed, result)
    return {}


def print_world(seed: int | str, result: dict[str, Any]) -> None:
    """The world's two tables: the probes of each policy, and each RL run's saved trajectories."""

    def probe(c: dict[str, float]) -> str:
        return f"{c['em']:.1f} ({100 * c['named_share']:.0f}%; {c['em_named']:.2f} / {c['em_unnamed']:.2f})"

    def half(h: dict[str, float]) -> str:
        return f"{h['samples']}, {100 * h['named_share']:.0f}%, {h['reward_named']:.3f} / {h['reward_unnamed']:.3f}"

    policies = ([name, *map(probe, cells.values())] for name, cells in result["policies"].items())
    runs = ([name, *map(half, halves.values())] for name, halves in result["training"].items())
    print(f"\nWorld {seed}: EM % (share of first queries naming the person; EM of those / of the rest)\n")
    print("\n".join(study.table(["policy", *_keys()], policies)))
    print(f"\nWorld {seed}: each RL run's saved trajectories per half: samples, share naming, reward named / rest\n")
    print("\n".join(study.table(["RL run", *probes.HALVES], runs)))


STUDY = study.Study(
    name="naming",
    description=__doc__ or "",
    title="Query naming",
    seeds=(0,),
    world=probe_world,
    summary=_summary,
    page=page,
    options=_options,
    check=_check,
    done=lambda record: f"{len(record['policies'])} policies probed",
    threads=0,
)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return study.main(STUDY, argv)


if __name__ == "__main__":
    main()
