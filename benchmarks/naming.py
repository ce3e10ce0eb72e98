"""Why a control arm's policy names the person in its queries: a probe of a `benchmarks.controls` run's policies,
with no page: it prints two tables per world (how to read them: docs/controls/naming/README.md).

    python -m benchmarks.naming --controls RUNS --seeds 0 1 2 3 4            # every policy RUNS holds
    python -m benchmarks.naming --controls RUNS --seeds 1 --reseed 1 11 12    # the noisy arm trained again
    python -m benchmarks.naming --controls RUNS --seeds 0 1 --aggregate       # the tables again, nothing run
    python -m benchmarks.naming --smoke --controls SMOKE_RUNS                 # on a `benchmarks.controls --smoke` run

Per world of the controls run (`--controls`, required): each policy there (the base, the simulator arm, each
control arm with a checkpoint) evaluated greedily on the training and held-out questions against `PROBES`'
engines (into CONTROLS/world_SEED/naming/POLICY), and each RL run's saved trajectories read by half;
`--reseed S ...` first trains `--arm` again with seed S (CONTROLS/world_SEED/train/ARM_seedS), saving every
trajectory. The last line is one JSON object: `by_world` (policy -> "ENGINE/SET" -> em, named_share, em_named,
em_unnamed; "training" -> RL run -> half -> samples, named_share, reward_named, reward_unnamed), `arm`, `reseed`,
`seeds`, `smoke`, `wall_s` and `provenance`.
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

PROBES = [f"{engine}/{dataset}" for engine in ("none", "noisy", "bm25") for dataset in ("train", "heldout")]


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
    world, (paths, fingerprints) = pipeline.recipe_world(qs), pipeline.finished_run(qs_dir)
    runs = {"simulator": qs_dir / "train"}
    runs.update({arm: root / "train" / arm for arm in ARMS if (root / "train" / arm / "checkpoints").is_dir()})
    for reseed in args.reseed:
        runs[f"{args.arm}_seed{reseed}"] = reseed_arm(root, args.arm, reseed)
    policies = {"base": (Path(paths["base"]), fingerprints["base"])}
    policies.update({name: (pipeline.final_model(run), stage_fingerprint(run)) for name, run in runs.items()})
    evaluated = {name: probe_policy(root / "naming" / name, qs.seed, policy, paths, fingerprints, args.smoke)
                 for name, policy in policies.items()}  # fmt: skip
    return {
        "policies": {
            name: {key: probes.naming_cells(out, world, *key.split("/")) for key in PROBES}
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


def probe_policy(
    out: Path, seed: int, policy: tuple[Path, str], paths: dict[str, str], fingerprints: dict[str, str], smoke: bool
) -> Path:
    """eval.yaml into `out` for one policy (model, its stage fingerprint) on the quickstart run's (`paths`,
    `fingerprints`: `pipeline.finished_run`) training and held-out questions against `none`, `noisy` (eval.yaml's
    simulator engine, noise on every search, answers redacted) and `bm25`; `out`."""
    model, fingerprint = policy
    overrides = [f"engines.simulator.simulator.generation.model.path={paths['simulator']}",
                 "engines.simulator.simulator.noisy_answers=redact", "noisy_share=1.0"]  # fmt: skip
    study.evaluate(
        out, model, seed=seed, datasets={"train": paths["train"], "heldout": paths["test"]},
        engines={"bm25": (paths["corpus"], paths["bm25"])}, keep={"none": "none", "noisy": "simulator", "bm25": "bm25"},
        inputs=[fingerprint, fingerprints["world"], fingerprints["simulator"]], overrides=overrides,
        limit=SMOKE_LIMIT if smoke else 0, smoke=smoke,
    )  # fmt: skip
    return out


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
    print("\n".join(study.table(["policy", *PROBES], policies)))
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
main = STUDY.main


if __name__ == "__main__":
    main()
