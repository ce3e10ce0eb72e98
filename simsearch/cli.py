"""`simsearch <command> RECIPE [key=value ...]` (and `simsearch view RUN_DIR`): a thin dispatcher to
`simsearch.commands`.

Commands import their heavy dependencies (torch, transformers) only when they run, so
`simsearch --help` answers at once.

User errors end in one `simsearch: error: ...` line and exit status 2: `RecipeError`,
`SimsearchError` (data, services), and a missing model, adapter, QA file, corpus or index, which
the loaders report as a `FileNotFoundError` whose message names the path and the fix. A
`FileNotFoundError` raised by the operating system itself (it carries an errno) means simsearch
opened a path nothing checked first: that is a bug, and like every other exception it keeps its
traceback (exit status 1).
"""

from __future__ import annotations

import argparse
import sys
import traceback

from simsearch.config import (
    RECIPE_TEMPLATES,
    CollectRecipe,
    EvalRecipe,
    FinetuneRecipe,
    QuickstartRecipe,
    ServeRecipe,
    TrainRecipe,
    load_recipe,
)
from simsearch.curriculum.schedules import SCHEDULE_KINDS
from simsearch.errors import RecipeError, SimsearchError
from simsearch.factory.build import GENERATION_ENGINES, SEARCH_ENGINES

_EPILOG = "Overrides are dotted keys, e.g. steps=10 policy.model.path=/models/qwen rollout.max_turns=3."
_CHOICES = (
    f"Choices: policy.kind {'|'.join(GENERATION_ENGINES)}; search.kind {'|'.join(SEARCH_ENGINES)}; "
    f"rollout.template {'|'.join(RECIPE_TEMPLATES)}."
)
_TRAIN_CHOICES = (
    f"{_CHOICES} curriculum.kind {'|'.join(SCHEDULE_KINDS)}; algorithm.estimator: a name in "
    "simsearch.policy.advantages.ESTIMATORS."
)


def _add_recipe_args(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument("recipe", nargs=None if required else "?", help="YAML recipe file")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides of the recipe")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-command per pipeline stage."""
    parser = argparse.ArgumentParser(
        prog="simsearch",
        description="Train LLM search agents with RL against a simulated search engine, and "
        "evaluate the transfer to real retrievers.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    quick = sub.add_parser(
        "quickstart",
        help="the whole pipeline on a tiny synthetic world, offline on CPU",
        description="Builds a tiny world, pretrains a tiny base policy, collects simulator SFT "
        "data with BM25, fine-tunes a tiny simulator, trains the policy with curriculum RL "
        "against the simulator only, and evaluates it against the simulator, BM25 and dense "
        "retrieval. Stage recipes: recipes/quickstart/.",
        epilog=_EPILOG,
    )
    quick.add_argument("--smoke", action="store_true", help="every stage for a step or two")
    _add_recipe_args(quick, required=False)

    train = sub.add_parser(
        "train",
        help="curriculum RL of a search agent (GRPO, PPO, REINFORCE++, RLOO, ...)",
        description="Trains a policy to search and answer against the engine the recipe names "
        "(simulator, self-search, or a real retriever). Examples: recipes/train/.",
        epilog=f"{_EPILOG} {_TRAIN_CHOICES}",
    )
    _add_recipe_args(train)

    evaluate = sub.add_parser(
        "eval",
        help="evaluate a policy against the simulator and real retrievers",
        description="Evaluates one policy on QA sets against several engines plus the direct "
        "and RAG baselines, and writes tables and plots. Examples: recipes/eval/.",
        epilog=f"{_EPILOG} {_CHOICES}",
    )
    _add_recipe_args(evaluate)

    serve = sub.add_parser(
        "serve",
        help="serve any engine over Search-R1's POST /retrieve",
        description="Serves a retriever or the simulator behind Search-R1's /retrieve protocol, "
        "so Search-R1, ZeroSearch and verl pipelines can use it. Examples: recipes/serve/.",
        epilog=_EPILOG,
    )
    _add_recipe_args(serve)

    view = sub.add_parser(
        "view",
        help="write a run's trajectories as one HTML page",
        description="Writes RUN_DIR/view.html: for an eval run every question with its trajectory per "
        "engine side by side, for a train run the sampled trajectories per step; filters by dataset "
        "or step, engine, correct / wrong and number of searches. Self-contained: no network.",
    )
    view.add_argument("run_dir", help="a `simsearch eval` or `simsearch train` run directory")
    view.add_argument("--out", default="", help="where to write the page (default RUN_DIR/view.html)")

    simulator = sub.add_parser("simulator", help="collect SFT data for, and fine-tune, the simulator")
    sim_sub = simulator.add_subparsers(dest="simulator_command", required=True, metavar="STEP")
    collect = sim_sub.add_parser(
        "collect",
        help="simulator SFT data from real-search trajectories",
        description="Runs a policy with a real retriever, labels each retrieved document set "
        "useful or noisy, and writes balanced SFT pairs. Examples: recipes/simulator/.",
        epilog=_EPILOG,
    )
    _add_recipe_args(collect)
    finetune = sim_sub.add_parser(
        "finetune",
        help="supervised fine-tuning of the simulator (full or LoRA, DeepSpeed)",
        description="Fine-tunes a causal LM on the collected pairs with loss on the response "
        "only. Examples: recipes/simulator/.",
        epilog=_EPILOG,
    )
    _add_recipe_args(finetune)
    return parser


def run(args: argparse.Namespace) -> None:
    """Load the recipe for the chosen command and run it."""
    if args.command == "quickstart":
        path, overrides = args.recipe, list(args.overrides)
        if path is not None and "=" in path and not path.endswith((".yaml", ".yml")):
            path, overrides = None, [path, *overrides]  # `quickstart key=value` has no recipe
        overrides += ["smoke=true"] if args.smoke else []
        from simsearch.commands import quickstart

        quickstart.main(load_recipe(QuickstartRecipe, path, overrides))
    elif args.command == "train":
        from simsearch.commands import train

        train.main(load_recipe(TrainRecipe, args.recipe, args.overrides))
    elif args.command == "eval":
        from simsearch.commands import evaluate

        evaluate.main(load_recipe(EvalRecipe, args.recipe, args.overrides))
    elif args.command == "serve":
        from simsearch.commands import serve

        serve.main(load_recipe(ServeRecipe, args.recipe, args.overrides))
    elif args.command == "view":
        from simsearch.commands import view

        view.main(args.run_dir, args.out)
    elif args.simulator_command == "collect":
        from simsearch.commands import simulator_collect

        simulator_collect.main(load_recipe(CollectRecipe, args.recipe, args.overrides))
    else:
        from simsearch.commands import simulator_finetune

        simulator_finetune.main(load_recipe(FinetuneRecipe, args.recipe, args.overrides))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `simsearch` console script."""
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except (RecipeError, SimsearchError) as err:
        print(f"simsearch: error: {err}", file=sys.stderr)
        return 2
    except FileNotFoundError as err:
        if err.errno is not None:  # the OS's own error on a path nothing checked: a bug
            traceback.print_exc()
            return 1
        print(f"simsearch: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("simsearch: interrupted; finished work is kept in the run directory", file=sys.stderr)
        return 130
    except Exception:  # an unexpected failure: show the whole traceback
        traceback.print_exc()
        return 1
    finally:
        _close_process_group()
    return 0


def _close_process_group() -> None:
    """Ends torch.distributed if the command started it (DeepSpeed runs): left alive at exit,
    gloo's threads can abort the process after its work is done."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
