"""One runner for the studies on tiny worlds: a study says what one world runs, how the worlds sum up and
what its page shows; the runner does the rest the same way for every study.

    python -m benchmarks.NAME --seeds 0 1 2 --jobs 2 --threads 1   # each world in its own worker process
    python -m benchmarks.NAME --seeds 0 1 2 --aggregate             # run nothing: the finished worlds again
    python -m benchmarks.NAME --render RECORD                       # the page again from a run's printed JSON
    python -m benchmarks.NAME --smoke                               # every stage for a step or two, in a temp dir

Per world, a worker (`python -m benchmarks.NAME --one-world SEED` plus the command's own arguments) runs
`Study.world` and writes its record to RUN_DIR/world_SEED/NAME.json with the commit and machine it ran
on (`provenance`, taken before the world's work). A world's stages are fingerprinted, so a world run
again reuses what finished (resume). Then `Study.summary` turns the records into the figures (the JSON
printed as the last line), `Study.page` into the page's blocks: each is printed and rewritten in the
page (docs/NAME.md, or in the run directory with --smoke), a missing page or block started bare.

What the studies' worlds and pages share: `Run` (one world's seed, options, files and fingerprints; its RL
runs and evaluations), `Arm` (one RL run as edits of the quickstart's train.yaml), `means_table`,
`differences_table` and `bar_chart`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from benchmarks.benchlib import NO_NOISE, RECIPES, difference_cell, mean_sd, provenance, replace_block

Record = dict[str, Any]
"""One world's JSON record, as `Study.world` returns it (the runner adds `provenance`)."""

SMOKE_TRAIN = ("prompts_per_step=2", "rollout.group_size=2", "eval_every=0")  # an RL run's smoke overrides
SMOKE_EVAL = ("chunk_size=8",)  # an evaluation's


@dataclass(frozen=True)
class Of:
    """An edit's value that differs by world, by name: one of its files, indexes or models (`corpus`, `bm25`,
    `knowing`, ...) or a figure a study computes for it (`constant_p`, `lr`)."""

    name: str


@dataclass(frozen=True)
class Arm:
    """One RL run of a study: edits of the quickstart's train.yaml (a dotted key and its value as an override
    writes it, or `Of` a world's value), and the base and simulator it is trained from (the quickstart's, or one
    the study builds under that name)."""

    edits: Mapping[str, str | Of] = field(default_factory=dict)
    simulator: str = "simulator"
    base: str = "base"

    def overrides(self, values: Mapping[str, Any]) -> list[str]:
        """The edits as recipe overrides, in order, each `Of` filled in from `values`."""
        return [f"{key}={values[v.name] if isinstance(v, Of) else v}" for key, v in self.edits.items()]


def engine(kind: str, files: Sequence[str] = ("corpus", "bm25")) -> dict[str, str | Of]:
    """An arm's edits that put the engine `kind` in the RL loop, on the world's `files` (its corpus, its BM25 index),
    with no noise to schedule and no cache (`NO_NOISE`)."""
    keys = {"corpus": "search.corpus", "bm25": "search.index_dir"}
    return {"search.kind": kind, **{keys[name]: Of(name) for name in files}, **NO_NOISE}


def _no_options(parser: argparse.ArgumentParser) -> None:
    del parser


def _no_check(args: argparse.Namespace) -> str:
    del args
    return ""


def _done(record: Record) -> str:
    del record
    return "done"


@dataclass(frozen=True)
class Study:
    """What is particular to one study; `main` runs it."""

    name: str  # the module's name: benchmarks/NAME.py, runs/NAME, world_SEED/NAME.json, docs/NAME.md
    description: str  # the module's docstring: the command's --help
    title: str  # the page's title, when the page is started bare
    seeds: Sequence[int]  # the worlds run when --seeds is not given
    world: Callable[[int, argparse.Namespace], Record]  # one world's work and record (in a worker)
    summary: Callable[[dict[int, Record], argparse.Namespace], dict[str, Any]]  # the figures, JSON
    page: Callable[[dict[str, Any], argparse.Namespace], dict[str, str]]  # block name -> its Markdown
    options: Callable[[argparse.ArgumentParser], None] = _no_options  # the study's own options
    check: Callable[[argparse.Namespace], str] = _no_check  # what is wrong with the options, "" if nothing
    done: Callable[[Record], str] = _done  # a world's line when it finishes
    threads: int = 1  # torch threads per world by default (0: every core)
    smoke_seeds: Sequence[int] = (0,)
    arms: Mapping[str, Arm] = field(default_factory=dict)  # --arms chooses some of these (none: no such option)
    steps: int = 0  # RL steps an arm by default, set by --steps (0: the study has no such option)
    smoke_steps: int = 2  # the same with --smoke
    # draws the charts beside the page from the figures and the worlds' records (None with --render)
    charts: Callable[[dict[str, Any], Path, dict[int, Record] | None], None] | None = None

    def main(self, argv: Sequence[str] | None = None) -> dict[str, Any]:
        """`main` of this study: the command's entry point."""
        return main(self, argv)


def main(study: Study, argv: Sequence[str] | None = None, args: argparse.Namespace | None = None) -> dict[str, Any]:
    """Runs `study` on the command line `argv` (sys.argv's by default; `args`: it parsed already); returns the
    figures ({} in a worker)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = args or parse(study, argv)
    if args.one_world is not None:
        run_one_world(study, args.one_world, args)
        return {}
    worlds: dict[int, Record] | None = None
    if args.render:
        figures = json.loads(Path(args.render).read_text().strip().splitlines()[-1])
    else:
        began = time.perf_counter()
        worlds = run_worlds(study, args, argv)
        figures = {**study.summary(worlds, args), "seeds": args.seeds, "smoke": args.smoke}
        figures["wall_s"] = round(time.perf_counter() - began, 1)
        runner = {**where(worlds), "torch_threads": args.threads, "jobs": args.jobs}
        figures["provenance"] = {**runner, **figures.get("provenance", {})}  # the study's own phrases win
    blocks = study.page(figures, args)
    for block in blocks.values():
        print(block, flush=True)
    if blocks:
        write_page(args.out, study.title, blocks)
        if study.charts is not None:
            study.charts(figures, args.out, worlds)
        print(f"{study.name}: {args.out}", flush=True)
    print(json.dumps(figures))
    return figures


def parse(study: Study, argv: Sequence[str]) -> argparse.Namespace:
    """The options every study takes, and the study's own; defaults resolved, Paths for run_dir and out."""
    parser = argparse.ArgumentParser(
        prog=f"python -m benchmarks.{study.name}",
        description=study.description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    seeds = " ".join(map(str, study.seeds))
    parser.add_argument("--seeds", type=int, nargs="+", help=f"one world per seed (default {seeds})")
    parser.add_argument("--jobs", type=int, default=1, help="worlds run at once, each in its own process")
    parser.add_argument("--threads", type=int, default=study.threads, help="torch threads per world (0: every core)")
    parser.add_argument("--run-dir", default="", help=f"the worlds' runs (runs/{study.name}; smoke: a temp dir)")
    parser.add_argument("--out", default="", help=f"the page rewritten (docs/{study.name}.md)")
    parser.add_argument("--smoke", action="store_true", help="every stage for a step or two: a pipeline check")
    parser.add_argument("--aggregate", action="store_true", help="run nothing: sum up RUN_DIR's finished worlds")
    parser.add_argument("--render", default="", help="run nothing: the page again from a run's printed JSON")
    parser.add_argument("--one-world", type=int, default=None, help=argparse.SUPPRESS)  # a worker's seed
    if study.arms:
        arms = list(study.arms)
        parser.add_argument("--arms", nargs="+", choices=arms, default=arms, help="the arms run (default: all)")
    if study.steps:
        steps = f"RL steps an arm (default {study.steps}; smoke {study.smoke_steps})"
        parser.add_argument("--steps", type=int, default=0, help=steps)
    study.options(parser)
    args = parser.parse_args(argv)
    args.seeds = args.seeds or list(study.smoke_seeds if args.smoke else study.seeds)
    if study.steps:
        args.steps = args.steps or (study.smoke_steps if args.smoke else study.steps)
    problem = study.check(args)
    if problem:
        parser.error(problem)
    if args.render and not Path(args.render).is_file():
        parser.error(f"--render {args.render}: no such file; give the JSON a finished run printed last")
    smoke_dir = tempfile.mkdtemp(prefix=f"{study.name}-smoke-") if args.smoke and not args.run_dir else ""
    args.run_dir = Path(args.run_dir or smoke_dir or f"runs/{study.name}")
    args.out = Path(args.out or (args.run_dir / f"{study.name}.md" if args.smoke else f"docs/{study.name}.md"))
    return args


def run_one_world(study: Study, seed: int, args: argparse.Namespace) -> Record:
    """`study.world` for `seed`, its record written to RUN_DIR/world_SEED/NAME.json with its provenance."""
    here = provenance()  # the code this world runs, before anything can change it
    record = {**study.world(seed, args), "provenance": here}
    path = args.run_dir / f"world_{seed}" / f"{study.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def run_worlds(study: Study, args: argparse.Namespace, argv: Sequence[str]) -> dict[int, Record]:
    """Each of `args.seeds`' record, by seed: read with `args.aggregate`, else run by a worker process each,
    `args.jobs` at once, each appending its output to RUN_DIR/world_SEED/NAME.log (studies that share a run
    directory keep their own logs, a world run again keeps its earlier log).

    A worker is this command again (`argv`) for one world, with the run directory resolved here; it
    inherits the working directory and environment, so it finds the package and reads relative paths
    as this process does.
    """
    if args.aggregate:
        return {seed: finished_world(study.name, args.run_dir, seed) for seed in args.seeds}

    def one(seed: int) -> Record:
        log = args.run_dir / f"world_{seed}" / f"{study.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        print(f"world {seed}: running (log: {log})", flush=True)
        command = [sys.executable, "-m", f"benchmarks.{study.name}", *worker_arguments(seed, args, argv)]
        with log.open("a") as out:
            launch(command, out)
        record = finished_world(study.name, args.run_dir, seed)
        print(f"world {seed}: done, {study.done(record)}", flush=True)
        return record

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        return dict(zip(args.seeds, pool.map(one, args.seeds)))


def launch(command: list[str], log: IO[str]) -> None:
    """Runs a worker's `command` to its end, its output to `log`; `CalledProcessError` when it fails."""
    subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT)


def worker_arguments(seed: int, args: argparse.Namespace, argv: Sequence[str]) -> list[str]:
    """`argv` for one world: `--one-world SEED` and the resolved run directory first (a later `--run-dir` in
    `argv` names the same one), so that arguments after a `--` stay last."""
    return ["--one-world", str(seed), "--run-dir", str(args.run_dir), *argv]


def finished_world(name: str, run_dir: Path, seed: int) -> Record:
    """World `seed`'s record in `run_dir`; `SystemExit` naming the command to run when there is none."""
    path = run_dir / f"world_{seed}" / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"{name}: world {seed} has no {path}; run it first (--seeds {seed})")
    return json.loads(path.read_text())


def where(worlds: dict[int, Record]) -> dict[str, str]:
    """The commit and the CPU (with its kernels' vector instructions) the worlds ran on, each as one phrase:
    "abc1234", or "abc1234 (worlds 0, 1), def5678 (world 2)"."""

    infos = {seed: world.get("provenance", {}) for seed, world in worlds.items()}
    return {
        "commit": by_world(infos, lambda info: info.get("commit", "not recorded")),
        "cpu": by_world(infos, cpu_phrase),
    }


def cpu_phrase(info: dict[str, Any]) -> str:
    """A machine's `cpu`, with its kernels' vector instructions (`cpu_capability`) where recorded."""
    kernels = f", {info['cpu_capability']} kernels" if info.get("cpu_capability") else ""
    return f"{info.get('cpu', 'a CPU not recorded')}{kernels}"


def measured(info: dict[str, Any]) -> str:
    """One sentence for a page: the commit and machine of the figures' `provenance` (and the threads and jobs
    a run gave them)."""
    threads, jobs = info.get("torch_threads"), info.get("jobs")
    run = f" ({threads} torch thread(s) a world, {jobs} world(s) at once)" if jobs else ""
    return f"Measured at commit {info['commit']} on {info['cpu']}{run}."


def by_world(worlds: dict[int, Any], label: Callable[[Any], str]) -> str:
    """`label` of each world as one phrase: the label alone when all agree, else each with its worlds."""
    seeds_by_label: dict[str, list[int]] = {}
    for seed, world in worlds.items():
        seeds_by_label.setdefault(label(world), []).append(seed)
    if len(seeds_by_label) == 1:
        return next(iter(seeds_by_label))
    return ", ".join(
        f"{text} ({'worlds' if len(seeds) > 1 else 'world'} {', '.join(map(str, seeds))})"
        for text, seeds in seeds_by_label.items()
    )


def write_page(out: Path, title: str, blocks: dict[str, str]) -> None:
    """Rewrites each block of `out` (`<!-- NAME -->` ... `<!-- /NAME -->`), keeping the prose around them: a
    block of several lines between lines of its own, one line inline. A missing page is started as `title`
    and the blocks; a block the page lacks is added at its end."""
    text = out.read_text() if out.is_file() else f"# {title}\n"
    for name in blocks:
        if f"<!-- {name} -->" not in text or f"<!-- /{name} -->" not in text:
            text = text.rstrip("\n") + f"\n\n<!-- {name} -->\n<!-- /{name} -->\n"
    for name, content in blocks.items():
        content = content.strip("\n")
        text = replace_block(text, name, f"\n{content}\n" if "\n" in content else content)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table's lines: `header`, its rule and one line per row of cells (an empty cell as "| |")."""
    return [_row(header), "|" + "---|" * len(header), *(_row(cells) for cells in rows)]


def _row(cells: Sequence[str]) -> str:
    return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"


def spread(values: Sequence[float], digits: int = 1) -> str:
    """A table cell: the mean ± sample sd of `values` (sd 0 for one value), "-" for none."""
    if not values:
        return "-"
    mean, sd = mean_sd(list(values))
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


Value = Callable[[Record, str, str], float | None]
"""A world's figure for a table's (row, column), None where that world did not measure it."""


def em(record: Record, row: str, column: str) -> float | None:
    """record["em"][row][column] (None where absent): the studies' usual `Value`."""
    return record["em"].get(row, {}).get(column)


def paired_values(
    worlds: Iterable[Record], row: str, reference: str, column: str, value: Value = em, scale: float = 1.0
) -> list[float]:
    """`scale` x (row's value minus reference's) in `column`, for each world that measured both."""
    pairs = ((value(world, row, column), value(world, reference, column)) for world in worlds)
    return [scale * (mine - theirs) for mine, theirs in pairs if mine is not None and theirs is not None]


def means_table(
    header: Sequence[str], worlds: Sequence[Record], rows: Iterable[tuple[str, str]], columns: Sequence[str],
    value: Value = em, scale: float = 1.0,
) -> list[str]:  # fmt: skip
    """A table of each (label, row): `scale` x its value's mean ± sd per column over the worlds that measured it."""
    values = {
        (r, c): [scale * v for w in worlds if (v := value(w, r, c)) is not None] for _, r in rows for c in columns
    }
    return table(header, ([label, *(spread(values[row, c]) for c in columns)] for label, row in rows))


def differences_table(
    header: Sequence[str], worlds: Sequence[Record], pairs: Iterable[tuple[str, str, str]], columns: Sequence[str],
    value: Value = em, scale: float = 1.0,
) -> list[str]:  # fmt: skip
    """A table of each (label, row, reference): the paired difference per column (`paired_values`, as a
    `difference_cell`) over the worlds that measured both."""
    return table(header, ([label, *(difference_cell(paired_values(worlds, row, ref, c, value, scale))
                                    for c in columns)] for label, row, ref in pairs))  # fmt: skip


def bm25_line(record: Record) -> str:
    """A world's line when it finishes (`Study.done`): each row's held-out EM on BM25."""
    return "BM25 EM: " + ", ".join(f"{row} {by['bm25']:.1f}" for row, by in record["em"].items() if "bm25" in by)


def over_seeds(figures: dict[str, Any]) -> str:
    """A page's phrase for the worlds and budget of the figures: "mean ± sd over seeds 0, 1, 2; 60 RL steps an arm"."""
    smoke = " (smoke: a pipeline check, not a result)" if figures["smoke"] else ""
    return f"mean ± sd over seeds {', '.join(map(str, figures['seeds']))}; {figures['steps']} RL steps an arm{smoke}"


def measured_block(figures: dict[str, Any]) -> str:
    """The `measured` block of a study with an RL budget: the commit and machine, then the seeds and steps."""
    seeds = ", ".join(map(str, figures["seeds"]))
    return f"{measured(figures['provenance'])}\nSeeds {seeds}; {figures['steps']} RL steps an arm."


def bar_chart(
    path: Path, title: str, groups: Sequence[str], bars: Sequence[tuple[str, Sequence[tuple[float, float]]]]
) -> Path:
    """`path`: grouped bars of held-out EM (%), one group per `groups` entry and one bar per (label, (mean, sd)
    per group), the sd as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(12, 6), dpi=100)
    width = 0.8 / max(1, len(bars))
    for i, (label, stats) in enumerate(bars):
        offsets = [g - 0.4 + width * (i + 0.5) for g in range(len(groups))]
        drawn = ax.bar(offsets, [m for m, _ in stats], width, yerr=[s for _, s in stats], capsize=3, label=label)
        ax.bar_label(drawn, labels=[f"{m:.1f}" for m, _ in stats], fontsize="x-small", padding=2)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel("held-out EM (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title)
    if bars:
        ax.legend(fontsize="small", loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path


# --------------------------------------------------------------------------- the runs the studies share


def quickstart_recipe(run_dir: Path, seed: int, args: argparse.Namespace, *overrides: str) -> Any:
    """The quickstart's recipe of world `seed` run in `run_dir`, at `args`' smoke and threads, with the fit simulator
    (the one the studies were designed on, whatever the quickstart's default), plus `overrides`."""
    from simsearch.config import QuickstartRecipe, load_recipe

    settings = [f"run_dir={run_dir}", f"seed={seed}", f"smoke={args.smoke}", f"threads={args.threads}", "simulator=fit"]
    return load_recipe(QuickstartRecipe, None, [*settings, *overrides])


@dataclass
class Run:
    """One world of a study as its stages see it: its seed, the command's options (run_dir, smoke, threads, ...)
    and the files and stage fingerprints built so far, by name."""

    seed: int
    args: argparse.Namespace
    paths: dict[str, str] = field(default_factory=dict)
    fingerprints: dict[str, str] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        """RUN_DIR/world_SEED: the world's stages and record."""
        return Path(self.args.run_dir) / f"world_{self.seed}"

    def train(self, name: str, inputs: list[str], overrides: Sequence[str], base: str = "base") -> str:
        """`train` into ROOT/train/NAME from the model at paths[base] on the questions at paths["train"]."""
        return train(self.root / "train" / name, seed=self.seed, base=self.paths[base], questions=self.paths["train"],
                     inputs=inputs, overrides=overrides, smoke=self.args.smoke)  # fmt: skip

    def evaluate(
        self, out: Path, policy: str | Path, inputs: list[str], datasets: dict[str, str],
        engines: dict[str, tuple[str, str]], keep: dict[str, str] | None = None, overrides: Sequence[str] = (),
        smoke_limit: int = 0,
    ) -> dict[str, Any]:  # fmt: skip
        """`evaluate` at this world's seed, each dataset cut to `smoke_limit` questions with --smoke."""
        limit = smoke_limit if self.args.smoke else 0
        return evaluate(out, policy, seed=self.seed, datasets=datasets, engines=engines, inputs=inputs,
                        overrides=overrides, keep=keep, limit=limit, smoke=self.args.smoke)  # fmt: skip

    def heldout_em(
        self, out: Path, policy: str | Path, inputs: list[str], engines: Sequence[str], overrides: Sequence[str] = (),
        smoke_limit: int = 0,
    ) -> dict[str, float]:  # fmt: skip
        """Greedy held-out EM (percent) of the policy at `policy` (`evaluate` into `out`) per engine of `engines`,
        each a retriever over paths["corpus"] with its index at paths[engine]."""
        retrievers = {engine: (self.paths["corpus"], self.paths[engine]) for engine in engines}
        keep = {engine: engine for engine in engines}
        rows = self.evaluate(out, policy, inputs, {"heldout": self.paths["test"]}, retrievers, keep, overrides,
                             smoke_limit)  # fmt: skip
        return {engine: 100.0 * rows[engine]["average"]["em"] for engine in engines}


def train(
    out: Path,
    *,
    seed: int,
    base: str,
    questions: str,
    inputs: list[str],
    overrides: Sequence[str] = (),
    smoke: bool = False,
) -> str:
    """An RL run of the quickstart's train.yaml from the model at `base` on the question file `questions`, into
    `out`, `SMOKE_TRAIN` then `overrides` on top; its fingerprint (a run finished under it is not run again)."""
    from simsearch.experiments.stages import train_stage

    settings = [f"seed={seed}", f"run_dir={out}", f"policy.model.path={base}", f"data.train=[{questions}]"]
    return train_stage(RECIPES / "train.yaml", [*settings, *(SMOKE_TRAIN if smoke else ()), *overrides], inputs)


def evaluate(
    out: Path,
    policy: str | Path,
    *,
    seed: int,
    datasets: dict[str, str],
    engines: dict[str, tuple[str, str]],
    inputs: list[str],
    overrides: Sequence[str] = (),
    keep: dict[str, str] | None = None,
    limit: int = 0,
    smoke: bool = False,
) -> dict[str, Any]:
    """The quickstart's eval.yaml for the model at `policy` into `out`, greedy, no baselines: on
    `datasets` (name -> question file, each cut to `limit` questions when > 0) against its engines, `engines`
    giving a retriever's corpus and index (name -> (corpus, index_dir)) and `keep` the engines kept, each under
    a name (name -> the recipe's engine; None: every engine); `SMOKE_EVAL` then `overrides` on top. Its
    summary's rows (engine -> ...); a stage finished under the same fingerprint is not run again."""
    from simsearch.experiments.stages import eval_stage

    questions = ", ".join(f"{{name: {name}, path: {path}, limit: {limit}}}" for name, path in datasets.items())
    settings = [
        f"run_dir={out}", f"seed={seed}", f"policy.model.path={policy}", f"datasets=[{questions}]",
        *(f"engines.{name}.{key}={value}" for name, (corpus, index) in engines.items()
          for key, value in (("corpus", corpus), ("index_dir", index))),
        "training_run=''", "baselines=[]", "fidelity_size=0", *(SMOKE_EVAL if smoke else ()),
    ]  # fmt: skip

    def kept_engines(loaded: Any) -> None:
        if keep is not None:
            loaded.engines = {name: loaded.engines[engine] for name, engine in keep.items()}

    eval_stage(RECIPES / "eval.yaml", [*settings, *overrides], inputs, edit=kept_engines)
    return dict(json.loads((out / "summary.json").read_text())["rows"])
