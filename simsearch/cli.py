"""`simsearch <command> RECIPE [key=value ...]` (and `simsearch view RUN_DIR`, `simsearch config COMMAND
RECIPE`, `simsearch --version`): a thin dispatcher to `simsearch.commands` (and, for `quickstart`, to
`simsearch.experiments.quickstart`).

Commands import their heavy dependencies (torch, transformers) only when they run, so
`simsearch --help` answers at once, and a recipe's keys, paths and what the machine must offer
(`commands.readiness`) are checked before they load; `--check` stops after the checks.

User errors end in one `simsearch: error: ...` line and exit status 2: `RecipeError`,
`SimsearchError` (data, services), and a missing model, adapter, QA file, corpus or index, which
the loaders report as a `FileNotFoundError` whose message names the path and the fix. A
`FileNotFoundError` raised by the operating system itself (it carries an errno) means simsearch
opened a path nothing checked first: that is a bug, and like every other exception it keeps its
traceback (exit status 1).
"""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
import traceback
import warnings
from collections.abc import Callable, Iterable
from dataclasses import fields
from importlib import metadata
from typing import Any

from simsearch.commands import preflight, readiness
from simsearch.commands.recipe_doc import COMMANDS
from simsearch.config import load_recipe
from simsearch.curriculum.schedules import SCHEDULE_KINDS
from simsearch.errors import RecipeError, SimsearchError
from simsearch.generation.recipe import GENERATION_KINDS
from simsearch.policy.recipe import RECIPE_TEMPLATES
from simsearch.retrieval.recipe import SEARCH_KINDS

EXAMPLES: dict[str, tuple[str, ...]] = {
    "quickstart": ("simsearch quickstart --smoke", "simsearch quickstart seed=1 run_dir=runs/quickstart_seed1"),
    "train": (
        "simsearch train recipes/train/tiny_cpu.yaml",
        "simsearch train recipes/train/tiny_cpu.yaml steps=10 optim.lr=1e-4 run_dir=runs/try threads=2",
    ),
    "eval": (
        "simsearch eval recipes/quickstart/eval.yaml",
        "simsearch eval recipes/quickstart/eval.yaml ~engines.dense chunk_size=16 run_dir=runs/eval_try",
    ),
    "serve": ("simsearch serve recipes/serve/bm25_wiki18.yaml port=8001 search.top_k=5",),
    "collect": (
        "simsearch simulator collect recipes/quickstart/collect.yaml max_questions=32 run_dir=runs/collect_try",
    ),
    "finetune": ("simsearch simulator finetune recipes/quickstart/simulator.yaml steps=2 run_dir=runs/sim_try",),
    "config": (
        "simsearch config train recipes/train/tiny_cpu.yaml --doc",
        "simsearch config eval recipes/quickstart/eval.yaml engines.dense=null",
    ),
}
"""The examples each command's --help shows; tests/test_first_contact.py runs every one's parse and recipe."""

_OVERRIDES = (
    "Overrides are dotted keys (optim.lr=1e-4, data.train=[a.jsonl,b.jsonl]); ~key or key=null removes an "
    "entry of a mapping or an optional section. Every key, its default and allowed values: simsearch config {} "
    "RECIPE --doc, or docs/recipes.md."
)


def _epilog(name: str, command: str, choices: str = "") -> str:
    examples = "\n".join(f"  {line}" for line in EXAMPLES[name])
    notes = [
        textwrap.fill(text, width=100, break_on_hyphens=False) for text in (_OVERRIDES.format(command), choices) if text
    ]
    return f"examples:\n{examples}\n\n" + "\n\n".join(notes)


def _choices(*keys: str) -> str:
    """`key a|b|c` for each key, from the tables the recipe checks read (no name retyped here)."""
    tables: dict[str, Iterable[str]] = {
        "policy.kind": GENERATION_KINDS,
        "search.kind": SEARCH_KINDS,
        "engines.NAME.kind": SEARCH_KINDS,
        "rollout.template": RECIPE_TEMPLATES,
        "curriculum.kind": SCHEDULE_KINDS,
    }
    return "Choices: " + "; ".join(f"{key} {'|'.join(tables[key])}" for key in keys) + "."


def _add_recipe_args(parser: argparse.ArgumentParser, *, required: bool = True, check: bool = True) -> None:
    parser.add_argument("recipe", nargs=None if required else "?", help="YAML recipe file")
    # default=[]: without it argparse calls the (optional) overrides required when RECIPE is missing
    parser.add_argument("overrides", nargs="*", default=[], help="key.sub=value overrides of the recipe")
    if check:
        parser.add_argument(
            "--check", action="store_true",
            help="check the recipe, its paths, backends, devices, models and servers, then stop (nothing is written)",
        )  # fmt: skip


def _parser(sub: Any, name: str, *, help: str, description: str, epilog: str) -> argparse.ArgumentParser:
    return sub.add_parser(
        name, help=help, description=description, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-command per pipeline stage."""
    parser = argparse.ArgumentParser(
        prog="simsearch",
        description="Train LLM search agents with RL against a simulated search engine, and "
        "evaluate the transfer to real retrievers.",
    )
    parser.add_argument("--version", action="version", version=f"simsearch {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _pipeline_parsers(sub)
    _tool_parsers(sub)
    return parser


def _pipeline_parsers(sub: Any) -> None:
    quick = _parser(
        sub, "quickstart", help="the whole pipeline on a tiny synthetic world, offline on CPU",
        description="Builds a tiny world, pretrains a tiny base policy, collects simulator SFT data with BM25, "
        "fine-tunes a tiny simulator, trains the policy with curriculum RL against the simulator only, and "
        "evaluates it against the simulator, BM25 and dense retrieval. Stage recipes: recipes/quickstart/.",
        epilog=_epilog("quickstart", "quickstart"),
    )  # fmt: skip
    quick.add_argument("--smoke", action="store_true", help="every stage for a step or two")
    _add_recipe_args(quick, required=False)
    train = _parser(
        sub, "train", help="curriculum RL of a search agent (GRPO, PPO, REINFORCE++, RLOO, ...)",
        description="Trains a policy to search and answer against the engine the recipe names (simulator, "
        "self-search, or a real retriever). Recipes: recipes/train/ (tiny_cpu.yaml runs on a CPU after "
        "`simsearch quickstart --smoke`). Ends with a line naming the final checkpoint.",
        epilog=_epilog("train", "train", _choices("policy.kind", "search.kind", "rollout.template", "curriculum.kind")),
    )  # fmt: skip
    _add_recipe_args(train)
    evaluate = _parser(
        sub, "eval", help="evaluate a policy against the simulator and real retrievers",
        description="Evaluates one policy on QA sets against several engines plus the direct and RAG "
        "baselines, and writes tables, plots and view.html. Recipes: recipes/eval/, recipes/quickstart/eval.yaml.",
        epilog=_epilog("eval", "eval", _choices("policy.kind", "engines.NAME.kind", "rollout.template")),
    )  # fmt: skip
    _add_recipe_args(evaluate)
    serve = _parser(
        sub, "serve", help="serve any engine over Search-R1's POST /retrieve",
        description="Serves a retriever or the simulator behind Search-R1's /retrieve protocol, so Search-R1, "
        "ZeroSearch and verl pipelines can use it. Recipes: recipes/serve/.",
        epilog=_epilog("serve", "serve", _choices("search.kind")),
    )  # fmt: skip
    _add_recipe_args(serve)
    simulator = sub.add_parser("simulator", help="collect SFT data for, and fine-tune, the simulator")
    sim_sub = simulator.add_subparsers(dest="simulator_command", required=True, metavar="STEP")
    collect = _parser(
        sim_sub, "collect", help="simulator SFT data from real-search trajectories",
        description="Runs a policy with a real retriever, labels each retrieved document set useful or noisy, "
        "and writes balanced SFT pairs. Recipe: recipes/quickstart/collect.yaml.",
        epilog=_epilog("collect", "simulator-collect", _choices("policy.kind", "search.kind", "rollout.template")),
    )  # fmt: skip
    _add_recipe_args(collect)
    finetune = _parser(
        sim_sub, "finetune", help="supervised fine-tuning of the simulator (full or LoRA, DeepSpeed)",
        description="Fine-tunes a causal LM on the collected pairs with loss on the response only. Recipe: "
        "recipes/quickstart/simulator.yaml; recipes/serve/finetuned_simulator.yaml serves the result.",
        epilog=_epilog("finetune", "simulator-finetune"),
    )  # fmt: skip
    _add_recipe_args(finetune)


def _tool_parsers(sub: Any) -> None:
    view = sub.add_parser(
        "view",
        help="write a run's trajectories as one HTML page",
        description="Writes RUN_DIR/view.html: for an eval run every question with its trajectory per "
        "engine side by side, for a train run the sampled trajectories per step; filters by dataset "
        "or step, engine, correct / wrong and number of searches. Self-contained: no network.",
    )
    view.add_argument("run_dir", help="a `simsearch eval` or `simsearch train` run directory")
    view.add_argument("--out", default="", help="where to write the page (default RUN_DIR/view.html)")
    show = _parser(
        sub, "config", help="print a command's recipe resolved, with every default",
        description="Prints the recipe COMMAND would run, resolved: the file, the overrides and every default "
        "(without RECIPE: the defaults, required values as ???). --doc adds each key's description and "
        "allowed values.",
        epilog=_epilog("config", "COMMAND"),
    )  # fmt: skip
    show.add_argument("for_command", metavar="COMMAND", choices=list(COMMANDS),
                      help=" | ".join(COMMANDS))  # fmt: skip
    show.add_argument("--doc", action="store_true", help="annotate each key with its description and allowed values")
    _add_recipe_args(show, required=False, check=False)


def _version() -> str:
    try:
        return metadata.version("simsearch")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _recipe_and_overrides(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """RECIPE and the overrides; a first argument that is an override (`quickstart seed=1`) is one."""
    path, overrides = args.recipe, list(args.overrides)
    if path is not None and ("=" in path or path.startswith("~")) and not path.endswith((".yaml", ".yml")):
        path, overrides = None, [path, *overrides]
    return path, overrides


def run(args: argparse.Namespace) -> None:
    """Load the recipe for the chosen command, check its paths, and run it."""
    if args.command == "view":
        from simsearch.commands import view

        view.main(args.run_dir, args.out)
        return
    if args.command == "config":
        from simsearch.commands import recipe_doc

        path, overrides = _recipe_and_overrides(args)
        _check_recipe_command(args.for_command, path)
        recipe_doc.main(args.for_command, path, overrides, doc=args.doc)
        return
    name = args.command if args.command != "simulator" else f"simulator-{args.simulator_command}"
    path, overrides = _recipe_and_overrides(args) if name == "quickstart" else (args.recipe, list(args.overrides))
    _check_recipe_command(name, path)
    if name == "quickstart":
        _check_quickstart_overrides(overrides)
    overrides += ["smoke=true"] if name == "quickstart" and args.smoke else []
    recipe: Any = load_recipe(COMMANDS[name], path, overrides)
    readiness.check_machine(recipe)  # backends, devices, API keys
    preflight.check_paths(recipe)  # before the command's module imports torch
    readiness.check_inputs(recipe)  # indexes, the hub, servers: before any model loads
    if args.check:
        print(f"simsearch {name.replace('-', ' ')}: {path or 'the default recipe'} can run here (checked; nothing run)")
        return
    _quiet_stderr()
    _command_main(name)(recipe)


def recipe_command(path: str) -> str | None:
    """The command a recipe's first line names (`# simsearch simulator collect ...` -> simulator-collect), if any."""
    try:
        with open(path, encoding="utf-8") as f:
            words = f.readline().lstrip("# ").split()
    except (OSError, UnicodeDecodeError):  # load_recipe names a missing or unreadable file
        return None
    if len(words) < 2 or words[0] != "simsearch":
        return None
    named = "-".join(words[1:3]) if words[1] == "simulator" else words[1]
    return named if named in COMMANDS else None


def _check_recipe_command(name: str, path: str | None) -> None:
    """Refuses a recipe whose first line names another command (an eval recipe given to train)."""
    named = recipe_command(path) if path else None
    if named is not None and named != name:
        said, asked = named.replace("-", " "), name.replace("-", " ")
        raise RecipeError(
            f"{path} is a recipe for `simsearch {said}` (its first line), not for `simsearch {asked}`: "
            f"run simsearch {said} {path}"
        )


def _check_quickstart_overrides(overrides: list[str]) -> None:
    """Refuses an override that sets a key of a quickstart stage's recipe, naming the stage recipe that takes it."""
    own = {f.name for f in fields(COMMANDS["quickstart"])}
    stages = {"train": "train.yaml", "simulator-finetune": "simulator.yaml", "eval": "eval.yaml",
              "simulator-collect": "collect.yaml"}  # fmt: skip
    for override in overrides:
        key = override.lstrip("~").partition("=")[0].split(".")[0]
        stage = next((c for c in stages if key not in own and key in {f.name for f in fields(COMMANDS[c])}), None)
        if stage is not None:
            raise RecipeError(
                f"override {override}: {key} is a key of the quickstart's stage recipes, not of the quickstart "
                f"(its keys: simsearch config quickstart --doc); --smoke already runs each stage for a step or "
                f"two, and one stage runs alone as simsearch {stage.replace('-', ' ')} "
                f"recipes/quickstart/{stages[stage]} {override}"
            )


def _quiet_stderr() -> None:
    """Keeps a run's stderr to its progress bars and errors: libraries' FutureWarnings and DeepSpeed's
    accelerator line say nothing a user can act on."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("DeepSpeed").addFilter(
        lambda record: not record.getMessage().startswith("Setting ds_accelerator")
    )


def _command_main(name: str) -> Callable[[Any], Any]:
    """The command's `main`, imported only now: torch loads with it."""
    if name == "quickstart":
        from simsearch.experiments import quickstart

        return quickstart.main
    if name == "train":
        from simsearch.commands import train

        return train.main
    if name == "eval":
        from simsearch.commands import evaluate

        return evaluate.main
    if name == "serve":
        from simsearch.commands import serve

        return serve.main
    if name == "simulator-collect":
        from simsearch.commands import simulator_collect

        return simulator_collect.main
    from simsearch.commands import simulator_finetune

    return simulator_finetune.main


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `simsearch` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["config", "simulator"] and argv[2:3] in (["collect"], ["finetune"]):
        argv[1:3] = [f"simulator-{argv[2]}"]  # `config simulator collect`, as the command is typed
    args = build_parser().parse_args(argv)
    try:
        run(args)
        _close_process_group(wait_for_peers=True)
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
        _close_process_group(wait_for_peers=False)
    return 0


def _close_process_group(*, wait_for_peers: bool) -> None:
    """Ends torch.distributed if the command started it (DeepSpeed runs): left alive at exit,
    gloo's threads can abort the process after its work is done, and so can a group torn down while
    a peer still works (rank 0 writing the model shards). After a finished command every process
    waits for the others first; after a failure none does, as a failed peer would never arrive."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        if wait_for_peers:
            dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
