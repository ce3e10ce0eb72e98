"""The tiny-world pipeline of `simsearch quickstart`: its stages, their fingerprints, the released models.

Stage by stage, each returning its fingerprint (and the artifacts the next one reads): build a
fictional world and its indexes (`world_stage`); pretrain a tiny base LM on copy drills and on traces
about background entities only (`base_stage`, `pretrain_base`); collect simulator SFT data with it
and BM25 (`collect_stage`: `simulator collect`); fine-tune a tiny simulator (`simulator_stage`:
`simulator finetune`), or build the knowing one (`knowing_stages`), as `simulator_stages` chooses; RL
the policy against the simulator and without search (`rl_stages`: `train`); evaluate one policy
(`eval_stage`: `eval`). Stages 3-6 run `recipes/quickstart/` with their paths pointed into the run
directory (`Pipeline.stage`). `world_and_base` and `through_simulator` run stages 1-2 and 1-4 alone,
as the benchmarks do; `planned_fingerprints` computes stages 1-4's fingerprints without running anything.
The default world's base and simulator ship in `simsearch/tinyworld/release/` (`RELEASE`), installed where
a stage's fingerprint is theirs.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import PreTrainedTokenizerFast

from simsearch.commands import evaluate, simulator_collect, simulator_finetune, train
from simsearch.config import (
    CollectRecipe,
    EvalRecipe,
    FinetuneRecipe,
    QuickstartRecipe,
    SearchConfig,
    TrainRecipe,
    load_recipe,
    save_recipe,
)
from simsearch.data.chat import tool_call_messages
from simsearch.data.templates import render_prompt
from simsearch.errors import RecipeError
from simsearch.experiments import knowing
from simsearch.experiments.stages import SMOKE_STAGES, final_model, plan_stage, run_stage
from simsearch.factory.build import build_search_engine
from simsearch.fingerprints import STAGE_FILE, building, digest, stage_fingerprint
from simsearch.models import TINY_TOOL_TEMPLATE, TOOL_SPECIAL_TOKENS, build_tiny_model, save_tiny, train_tokenizer
from simsearch.retrieval.bm25 import BM25SearchEngine
from simsearch.simulator.prompts import render as render_simulator_prompt
from simsearch.tinyworld.pretrain import pretrain
from simsearch.tinyworld.recipe import TinyWorldConfig
from simsearch.tinyworld.traces import CALL_QUERY_PREFIX, Trace, make_copy_drills, make_traces, tiny_call
from simsearch.tinyworld.world import YEARS, World, build_world, write_corpus
from simsearch.types import Passage, QAExample

TOOL_CALL_EXTRA_TOKENS = 12
"""How many more tokens a Hermes call and its end-of-turn token take than `<search> … </search>` with
the tiny tokenizer: `protocol: tool-call` raises every stage's `sampling.max_new_tokens` by that much."""


@dataclass
class Pipeline:
    """What every stage reads: the recipe, the stage recipes, the run directory and its files."""

    recipe: QuickstartRecipe
    recipes: Path  # the stage recipes (collect.yaml, simulator.yaml, ...)
    run: Path
    paths: dict[str, str]  # corpus, train and test files, bm25 and dense index directories

    def stage(self, name: str, schema: type, command: Any, inputs: list[str], overrides: list[str]) -> str:
        """Runs one stage's command on its shipped recipe with the run's paths (`run_stage`); returns its
        fingerprint. One released under that fingerprint (`released_stage`) is installed instead of run."""

        def install(fingerprint: str, out: Path) -> bool:
            return install_released(self.recipe, name, fingerprint, out)

        return run_stage(schema, *self._stage_recipe(name, overrides), command, inputs, self._edit(name),
                         root=self.run, install=install)  # fmt: skip

    def plan(self, name: str, schema: type, inputs: list[str], overrides: list[str]) -> tuple[Any, str]:
        """One stage's recipe and the fingerprint it runs under (`plan_stage`), without running it."""
        return plan_stage(schema, *self._stage_recipe(name, overrides), inputs, self._edit(name), self.run)

    def _stage_recipe(self, name: str, overrides: list[str]) -> tuple[Path, list[str]]:
        """The stage's shipped recipe and its overrides: the run's paths, then the quickstart's settings."""
        smoke = SMOKE_STAGES.get(name.removesuffix("_nosearch"), []) if self.recipe.smoke else []
        # The quickstart's thread count, not the stage recipe's own: it changes the floats, so it is fingerprinted.
        threads = [f"threads={self.recipe.threads}"]
        protocol = [f"rollout.protocol={self.recipe.protocol}"] if self._tool_call(name) else []
        return self.recipes / f"{name}.yaml", [*overrides, *smoke, *threads, *protocol]

    def _tool_call(self, name: str) -> bool:
        # Every stage with a rollout; only when not the default, so tags runs keep their fingerprints.
        return self.recipe.protocol != "tags" and name != "simulator"

    def _edit(self, name: str) -> Callable[[Any], None] | None:
        """For tool calls: the same room for the query and the answer as a tag turn has, and RL's own rate."""
        if not self._tool_call(name):
            return None
        lr = self.recipe.tinyworld.tool_call_lr

        def edit(stage: Any) -> None:
            stage.sampling.max_new_tokens += TOOL_CALL_EXTRA_TOKENS
            if isinstance(stage, TrainRecipe):
                stage.optim.lr = lr

        return edit


RELEASED = "released.json"  # in a stage folder installed from the release: where its model was built
RELEASE = Path(__file__).resolve().parents[1] / "tinyworld" / "release"
"""The default world's models, shipped with the package: `release.json` gives each released stage (`base`,
`simulator`) the fingerprint it was built under, the folder here that holds it, and where it was built (`built`)."""


def released_stage(recipe: QuickstartRecipe, stage: str, fingerprint: str) -> Path | None:
    """The released folder of `stage` if it was built under `fingerprint` (and `recipe.released`), else None."""
    index = RELEASE / "release.json"
    if not recipe.released or not index.is_file():
        return None
    entry = json.loads(index.read_text())["stages"].get(stage)
    return RELEASE / entry["folder"] if entry and entry["fingerprint"] == fingerprint else None


def install_released(recipe: QuickstartRecipe, stage: str, fingerprint: str, out: Path) -> bool:
    """Copies the released `stage` built under `fingerprint` into the claimed folder `out`; False if none is."""
    source = released_stage(recipe, stage, fingerprint)
    if source is None:
        return False
    shutil.copytree(source, out, dirs_exist_ok=True)
    built = json.loads((RELEASE / "release.json").read_text())["stages"][stage]["built"]
    (out / RELEASED).write_text(json.dumps({"stage": stage, **built}, indent=2) + "\n")
    print(f"quickstart: {stage}: the default world's released model (built under this very fingerprint; "
          "released=false builds it here)", flush=True)  # fmt: skip
    return True


def world_and_base(recipe: QuickstartRecipe) -> tuple[World, dict[str, str], dict[str, str]]:
    """Stages 1-2 alone, as `quickstart.main` runs them: the world, its file and index paths, and fingerprints."""
    pipeline, _, world, world_fp, base_fp = first_stages(recipe)
    return world, {**pipeline.paths, "base": str(pipeline.run / "base")}, {"world": world_fp, "base": base_fp}


def through_simulator(recipe: QuickstartRecipe) -> tuple[World, dict[str, str], dict[str, str]]:
    """Stages 1-4 alone, as `quickstart.main` runs them: `world_and_base`'s, with the simulator's model and
    fingerprint."""
    pipeline, _, world, world_fp, base_fp = first_stages(recipe)
    simulator_fp = simulator_stages(pipeline, world, world_fp, base_fp)
    paths = {**pipeline.paths, "base": str(pipeline.run / "base"),
             "simulator": str(final_model(pipeline.run / "simulator"))}  # fmt: skip
    return world, paths, {"world": world_fp, "base": base_fp, "simulator": simulator_fp}


def first_stages(
    recipe: QuickstartRecipe, announce: Callable[[str, str], None] | None = None
) -> tuple[Pipeline, TrainRecipe, World, str, str]:
    """Threads, then (pipeline, RL recipe, world, world fingerprint, base fingerprint) of stages 1-2;
    `announce(key, banner)` as each of the two begins."""
    torch.set_num_threads(recipe.threads or torch.get_num_threads())
    pipeline = _pipeline(recipe)
    # The base LM is pretrained on prompts and results shown as RL will show them.
    rl_recipe = load_recipe(TrainRecipe, pipeline.recipes / "train.yaml")
    if announce is not None:
        announce("world", "1/6 world and search indexes")
    world, world_fp = world_stage(pipeline)
    if announce is not None:
        announce("pretrain", "2/6 base policy (copy drills, then reading and random-query traces)")
    base_fp = base_stage(pipeline, world, world_fp, rl_recipe)
    return pipeline, rl_recipe, world, world_fp, base_fp


def _pipeline(recipe: QuickstartRecipe, *, save: bool = True) -> Pipeline:
    """The run directory (its recipe saved, unless `save` is false) and the paths every stage reads."""
    run = Path(recipe.run_dir)
    if save:
        save_recipe(recipe, run)
    return Pipeline(recipe, recipes_dir(recipe), run, _world_paths(run))


def _world_paths(run: Path) -> dict[str, str]:
    paths = {name: str(run / "world" / f"{name}.jsonl") for name in ("corpus", "train", "test", "corpus_known")}
    paths.update({name: str(run / "index" / name) for name in ("bm25", "dense", "bm25_known")})
    return paths


def finished_run(run: Path) -> tuple[dict[str, str], dict[str, str]]:
    """A finished quickstart run's files by name (`Pipeline.paths`, `base` and the simulator's model `simulator`)
    and its stages' fingerprints (world, base, simulator, train): what a study builds on."""
    paths = {**_world_paths(run), "base": str(run / "base"), "simulator": str(final_model(run / "simulator"))}
    return paths, {stage: stage_fingerprint(run / stage) for stage in ("world", "base", "simulator", "train")}


def recipe_world(recipe: QuickstartRecipe) -> World:
    """The world `recipe` describes, built in memory (deterministic: the one its world stage wrote)."""
    tiny = recipe.tinyworld
    return build_world(
        seed=recipe.seed, n_entities=tiny.n_entities, n_train_entities=tiny.n_train_entities,
        n_background_entities=tiny.n_background_entities, two_hop_share=tiny.two_hop_share,
    )  # fmt: skip


def _world_fingerprint(recipe: QuickstartRecipe) -> str:
    tiny = recipe.tinyworld
    return digest(
        {
            "stage": "world",
            "seed": recipe.seed,
            "sizes": [tiny.n_entities, tiny.n_train_entities, tiny.n_background_entities],
            # Only when set, so a world without two-hop questions keeps the fingerprint it had before them.
            **({"two_hop_share": tiny.two_hop_share} if tiny.two_hop_share else {}),
            "collect_corpus": "without held-out people",
        }
    )


def world_stage(pipeline: Pipeline) -> tuple[World, str]:
    """The world (rebuilt in memory each time), its files and indexes."""
    recipe, run, paths = pipeline.recipe, pipeline.run, pipeline.paths
    world = recipe_world(recipe)
    world_fp = _world_fingerprint(recipe)
    with building(run / "world", world_fp) as world_todo, building(run / "index", world_fp) as index_todo:
        if world_todo or index_todo:
            world.write(run / "world")
            # What the simulator's SFT data is collected from: the corpus less the held-out people, whom
            # a name-less query would otherwise bring into its pairs.
            write_corpus(world.passages_without(world.people("test")), paths["corpus_known"])
            for kind, corpus, index in (
                ("bm25", "corpus", "bm25"),
                ("dense", "corpus", "dense"),
                ("bm25", "corpus_known", "bm25_known"),
            ):  # built once here: later stages only load them
                build_search_engine(SearchConfig(kind=kind, corpus=paths[corpus], index_dir=paths[index]))
    return world, world_fp


def _base_fingerprint(recipe: QuickstartRecipe, world_fp: str, rl_recipe: TrainRecipe) -> str:
    return digest({"stage": "base", "inputs": [world_fp], "recipe": base_settings(recipe, rl_recipe)})


def base_stage(pipeline: Pipeline, world: World, world_fp: str, rl_recipe: TrainRecipe) -> str:
    """The pretrained base policy in run/base; returns its fingerprint."""
    base = pipeline.run / "base"
    base_fp = _base_fingerprint(pipeline.recipe, world_fp, rl_recipe)
    with building(base, base_fp) as todo:
        if todo and not install_released(pipeline.recipe, "base", base_fp, base):
            # The base LM learns from questions about the background entities, the simulator from
            # the training questions (the world RL asks about); test entities stay unseen by both.
            pretrain_base(pipeline.recipe, world, world.background or world.train, rl_recipe, base)
    return base_fp


def simulator_stages(
    pipeline: Pipeline, world: World, world_fp: str, base_fp: str, announce: Callable[[str, str], None] | None = None
) -> str:
    """Stages 3-4: the simulator RL searches, in run/simulator, as the recipe's `simulator` says: `fit`, fine-tuned
    on BM25's results for RL's own questions (`collect_stage`, `simulator_stage`), or `knowing`
    (`knowing_stages`). Installed from the release, with nothing before it built, where the release holds this very
    simulator. Its fingerprint; `announce(key, banner)` as fine-tuning begins."""
    if pipeline.recipe.simulator == "knowing":
        return knowing_stages(pipeline, world, world_fp, base_fp, announce)
    simulator_fp = released_simulator(pipeline, base_fp)  # its SFT data is then not needed here
    if simulator_fp is None:
        collect_fp = collect_stage(pipeline, base_fp)
        if announce is not None:
            announce("simulator_sft", "4/6 simulator fine-tuning")
        simulator_fp = simulator_stage(pipeline, collect_fp)
    return simulator_fp


@dataclass(frozen=True)
class _Knowing:
    """The knowing simulator's stages in a quickstart run: what they read and the fingerprints known up front."""

    reading: knowing.Reading
    out: Path  # run/knowing: the knowing base, the fit people's data, their pairs, the SFT file
    collect: list[str]  # collect.yaml's overrides
    collect_inputs: list[str]
    reading_fp: str
    sft_fp: str

    def finetune(self, run: Path, seed: int) -> list[str]:
        """simulator.yaml's overrides: the knowing base fine-tuned on the SFT file into run/simulator."""
        sft = knowing.sft_path(self.out, knowing.KNOWING_DESIGN)
        return knowing.finetune_overrides(run / "simulator", self.out / "base", sft, self.out / "collect" / "val.jsonl",
                                          seed)  # fmt: skip


def _planned_knowing(pipeline: Pipeline, plan: _Knowing) -> tuple[str, list[str], str]:
    """The knowing simulator's collect fingerprint, its SFT stage's inputs and fingerprint, without running them."""
    _, collect_fp = pipeline.plan("collect", CollectRecipe, plan.collect_inputs, plan.collect)
    inputs = [collect_fp, plan.reading_fp, plan.sft_fp]
    finetune = plan.finetune(pipeline.run, pipeline.recipe.seed)
    _, simulator_fp = pipeline.plan("simulator", FinetuneRecipe, inputs, finetune)
    return collect_fp, inputs, simulator_fp


def _knowing(pipeline: Pipeline, world_fp: str, base_fp: str) -> _Knowing:
    recipe, run = pipeline.recipe, pipeline.run
    design = knowing.KNOWING_DESIGNS[knowing.KNOWING_DESIGN]
    reading = knowing.SMOKE_READING if recipe.smoke else design.reading
    out = run / "knowing"
    return _Knowing(
        reading=reading,
        out=out,
        collect=knowing.collect_overrides(out, run / "base", knowing.fit_paths(out), recipe.seed),
        collect_inputs=[base_fp, world_fp],  # the policy's base collects, never the knowing base
        reading_fp=knowing.reading_fingerprint(base_fp, reading, recipe.threads),
        sft_fp=knowing.sft_fingerprint(knowing.KNOWING_DESIGN, reading, recipe.seed),
    )


def knowing_stages(
    pipeline: Pipeline, world: World, world_fp: str, base_fp: str, announce: Callable[[str, str], None] | None = None
) -> str:
    """Stages 3-4 for `simulator: knowing` (`experiments.knowing`, its design `KNOWING_DESIGN`): the policy's base
    reads the training and fit people's passages (run/knowing/base), SFT pairs are collected on the fit people
    (run/knowing/collect), and the knowing base is fine-tuned on them with reading mixed in (run/simulator). It is
    asked during RL about people it read of and was never fit on; no held-out person's fact is in what it read.
    Installed from the release, with nothing before it built, where the release holds it. Its fingerprint."""
    recipe, run = pipeline.recipe, pipeline.run
    plan = _knowing(pipeline, world_fp, base_fp)
    _, inputs, planned = _planned_knowing(pipeline, plan)
    if released_stage(recipe, "simulator", planned) is None:
        knowing.reading_stage(run / "base", plan.out / "base", base_fp, world, plan.reading, seed=recipe.seed,
                              threads=recipe.threads)  # fmt: skip
        knowing.fit_data(world, plan.out, world_fp)
        pipeline.stage("collect", CollectRecipe, simulator_collect.main, plan.collect_inputs, plan.collect)
        if announce is not None:
            announce("simulator_sft", "4/6 the knowing simulator's fine-tuning (its pairs, with reading mixed in)")
        knowing.write_sft_file(plan.out, world, knowing.KNOWING_DESIGN, reading=plan.reading, seed=recipe.seed)
    finetune = plan.finetune(run, recipe.seed)
    return pipeline.stage("simulator", FinetuneRecipe, simulator_finetune.main, inputs, finetune)


def collect_stage(pipeline: Pipeline, base_fp: str) -> str:
    return pipeline.stage("collect", CollectRecipe, simulator_collect.main, [base_fp], _collect_overrides(pipeline))


def _collect_overrides(pipeline: Pipeline) -> list[str]:
    run, paths = pipeline.run, pipeline.paths
    return [
        f"run_dir={run / 'collect'}",
        f"seed={pipeline.recipe.seed}",
        f"policy.model.path={run / 'base'}",
        f"data.train=[{paths['train']}]",
        f"search.corpus={paths['corpus_known']}",
        f"search.index_dir={paths['bm25_known']}",
    ]


def released_simulator(pipeline: Pipeline, base_fp: str) -> str | None:
    """The simulator stage installed from the release, with no collect stage, when the release holds the
    simulator this recipe would build (its planned fingerprint); its fingerprint, or None to build it."""
    collect_fp, planned = _planned_collect_and_simulator(pipeline, base_fp)
    if released_stage(pipeline.recipe, "simulator", planned) is None:
        return None
    overrides = _simulator_overrides(pipeline, True)
    return pipeline.stage("simulator", FinetuneRecipe, simulator_finetune.main, [collect_fp], overrides)


def _planned_collect_and_simulator(pipeline: Pipeline, base_fp: str) -> tuple[str, str]:
    """The fingerprints stages 3 and 4 run under on the base of `base_fp` (the simulator's as when collect holds
    out validation pairs, as it does for every world of the default size)."""
    _, collect_fp = pipeline.plan("collect", CollectRecipe, [base_fp], _collect_overrides(pipeline))
    _, simulator_fp = pipeline.plan("simulator", FinetuneRecipe, [collect_fp], _simulator_overrides(pipeline, True))
    return collect_fp, simulator_fp


def simulator_stage(pipeline: Pipeline, collect_fp: str) -> str:
    has_val = (pipeline.run / "collect" / "val.jsonl").stat().st_size > 0
    if not has_val:  # collect holds no question out when every pair came from one
        print("quickstart: collect held out no validation pairs (all came from one question); the simulator "
              "fine-tunes without validation")  # fmt: skip
    overrides = _simulator_overrides(pipeline, has_val)
    return pipeline.stage("simulator", FinetuneRecipe, simulator_finetune.main, [collect_fp], overrides)


def _simulator_overrides(pipeline: Pipeline, has_val: bool) -> list[str]:
    run = pipeline.run
    return [
        f"run_dir={run / 'simulator'}",
        f"seed={pipeline.recipe.seed}",
        f"model.path={run / 'base'}",
        f"train_file={run / 'collect' / 'train.jsonl'}",
        f"val_file={run / 'collect' / 'val.jsonl'}" if has_val else "val_file=''",
    ]


def planned_fingerprints(recipe: QuickstartRecipe) -> dict[str, str]:
    """The fingerprints stages 1-4 of `recipe` run under, computed without running anything (the simulator's as
    when collect holds out validation pairs, as it does for every world of the default size)."""
    pipeline = _pipeline(recipe, save=False)
    rl_recipe = load_recipe(TrainRecipe, pipeline.recipes / "train.yaml")
    world_fp = _world_fingerprint(recipe)
    base_fp = _base_fingerprint(recipe, world_fp, rl_recipe)
    if recipe.simulator == "knowing":
        collect_fp, _, simulator_fp = _planned_knowing(pipeline, _knowing(pipeline, world_fp, base_fp))
    else:
        collect_fp, simulator_fp = _planned_collect_and_simulator(pipeline, base_fp)
    return {"world": world_fp, "base": base_fp, "collect": collect_fp, "simulator": simulator_fp}


def saved_recipe(run_dir: Path) -> QuickstartRecipe:
    """The quickstart recipe a run directory saved (its recipe.yaml).

    One saved before the `tinyworld` section, with the tiny world's settings at its top, is read with them
    in the section when the world and the base in `run_dir` were built under the fingerprints it plans.

    Raises:
        RecipeError: The recipe does not load, or it has the old shape and the stages there are not its.
    """
    path = run_dir / "recipe.yaml"
    saved = yaml.safe_load(path.read_text()) if path.is_file() else None
    if not isinstance(saved, dict) or "tinyworld" in saved:
        return load_recipe(QuickstartRecipe, path, [])
    moved = {f.name for f in fields(TinyWorldConfig)} & set(saved)
    if not moved:
        return load_recipe(QuickstartRecipe, path, [])
    overrides = [f"{'tinyworld.' if key in moved else ''}{key}={json.dumps(value)}" for key, value in saved.items()]
    recipe = load_recipe(QuickstartRecipe, None, overrides)
    planned = planned_fingerprints(recipe)
    for stage in ("world", "base"):
        mark = run_dir / stage / STAGE_FILE
        if not mark.is_file() or stage_fingerprint(run_dir / stage) != planned[stage]:
            raise RecipeError(
                f"{path}: saved before the tinyworld section (its {sorted(moved)[0]} at the top), and "
                f"{run_dir / stage} was not built under it; move those keys under `tinyworld:` and rerun simsearch "
                "quickstart there"
            )
    print(f"quickstart: {path}: saved before the tinyworld section; read with its keys there (the world and "
          "base here were built under them)", flush=True)  # fmt: skip
    return recipe


def rl_stages(pipeline: Pipeline, base_fp: str, simulator_fp: str) -> dict[str, str]:
    """RL against the simulator (train/), then without search (train_nosearch/); their fingerprints."""
    run = pipeline.run
    with_simulator = [
        f"search.simulator.generation.model.path={_simulator(run)}",
        f"search.cache={run / 'cache' / 'simulator.sqlite'}",
    ]
    fingerprints = {}
    for name, policy, inputs, overrides in (
        ("train", "rl_search", [base_fp, simulator_fp], with_simulator),
        ("train_nosearch", "rl_nosearch", [base_fp], []),
    ):
        common = [
            f"seed={pipeline.recipe.seed}",
            f"policy.model.path={run / 'base'}",
            f"data.train=[{pipeline.paths['train']}]",
            f"run_dir={run / name}",
        ]
        fingerprints[policy] = pipeline.stage(name, TrainRecipe, train.main, inputs, [*common, *overrides])
    return fingerprints


def eval_stage(pipeline: Pipeline, name: str, policy: Path, inputs: list[str]) -> None:
    """The eval stage for one policy into run/eval/{name} (eval_nosearch.yaml for the no-search policy)."""
    run, paths = pipeline.run, pipeline.paths
    common = [
        f"run_dir={run / 'eval' / name}",
        f"seed={pipeline.recipe.seed}",
        f"policy.model.path={policy}",
        f"datasets=[{{name: heldout, path: {paths['test']}, limit: {8 if pipeline.recipe.smoke else 0}}}]",
    ]
    if name == "rl_nosearch":
        pipeline.stage("eval_nosearch", EvalRecipe, evaluate.main, inputs, common)
        return
    overrides = [
        *common,
        f"engines.simulator.simulator.generation.model.path={_simulator(run)}",
        f"engines.bm25.corpus={paths['corpus']}",
        f"engines.bm25.index_dir={paths['bm25']}",
        f"engines.dense.corpus={paths['corpus']}",
        f"engines.dense.index_dir={paths['dense']}",
        # Only the RL policy's report shows training curves and the baselines and fidelity.
        *(
            [f"training_run={run / 'train'}"]
            if name == "rl_search"
            else ["training_run=''", "baselines=[]", "fidelity_size=0"]
        ),
    ]
    pipeline.stage("eval", EvalRecipe, evaluate.main, inputs, overrides)


def _simulator(run: Path) -> Path:
    return final_model(run / "simulator")


def recipes_dir(recipe: QuickstartRecipe) -> Path:
    folder = (
        Path(recipe.recipes_dir)
        if recipe.recipes_dir
        else Path(__file__).resolve().parents[2] / "recipes" / "quickstart"
    )
    if not (folder / "train.yaml").is_file():
        raise RecipeError(
            f"recipes_dir: no quickstart recipes in {folder}; run from a clone of the repository "
            "(pip install -e .) or set recipes_dir=path/to/recipes/quickstart"
        )
    return folder


def base_settings(recipe: QuickstartRecipe, rl: TrainRecipe) -> dict[str, Any]:
    """Everything the base model is built from besides the world (keyed by the names the settings had before
    the `tinyworld` section, so a base keeps its fingerprint)."""
    tiny = recipe.tinyworld
    fields = (
        "vocab_size",
        "drill_steps",
        "pretrain_batch_size",
        "pretrain_lr",
        "pretrain_traces",
        "copy_loss_weight",
        "typed_answer_share",
        "reading_share",
        "redraw_empty_searches",
        "year_tokens",
        "city_tokens",
    )
    settings: dict[str, Any] = {"seed": recipe.seed, "smoke": recipe.smoke}
    settings.update({name: getattr(tiny, name) for name in fields})
    settings["pretrain_steps"] = pretrain_steps(recipe)  # the steps taken, however the factor made them
    settings["query_mix"] = list(tiny.query_mix)
    if tiny.two_search_share:  # only when set: one-search bases keep the fingerprint they had before
        settings["two_search_share"] = tiny.two_search_share
    settings.update(template=rl.rollout.template, top_k=rl.search.top_k, rendering=rl.search.rendering)
    if recipe.protocol != "tags":
        settings["protocol"] = recipe.protocol
        settings["call_query_prefix"] = CALL_QUERY_PREFIX
        if tiny.call_tokens:  # only when set: bases built without keep their fingerprints
            settings["call_tokens"] = True
    settings["trace_corpus"] = "background people and cities"  # `trace_passages`
    return settings


def pretrain_base(
    recipe: QuickstartRecipe, world: World, questions: list[QAExample], rl: TrainRecipe, out: Path
) -> None:
    """The base policy of `recipe`: its tokenizer, copy drills, then traces of `questions`; saved to `out`."""
    tokenizer = base_tokenizer(recipe, world, rl)
    model = build_tiny_model(tokenizer, hidden=128, layers=4, heads=4, kv_heads=2, ffn=384, seed=recipe.seed)
    # Smoke: just enough (40 x 16 traces at a high rate; four times that for Hermes calls, twice the tokens
    # of a tag search) that the base emits searches.
    tiny = recipe.tinyworld
    drill_steps, steps, batch_size, lr = (
        (2, 160 if recipe.protocol == "tool-call" else 40, 16, 5e-3)
        if recipe.smoke
        else (tiny.drill_steps, pretrain_steps(recipe), tiny.pretrain_batch_size, tiny.pretrain_lr)
    )
    if drill_steps:
        drills = make_copy_drills(tokenizer, n=64 * drill_steps, seed=recipe.seed)
        pretrain(model, drills, steps=drill_steps, batch_size=64, lr=lr, copy_loss_weight=0.0, seed=recipe.seed)
    traces = base_traces(recipe, world, questions, tokenizer, rl, n=steps * batch_size if recipe.smoke else 0)
    pretrain(
        model,
        traces,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        copy_loss_weight=tiny.copy_loss_weight,
        seed=recipe.seed,
    )
    save_tiny(model, tokenizer, out)


def pretrain_steps(recipe: QuickstartRecipe) -> int:
    """The base's pretraining steps on traces (not smoke): `tool_call_pretrain_factor` applied to tool calls."""
    tiny = recipe.tinyworld
    factor = tiny.tool_call_pretrain_factor if recipe.protocol == "tool-call" else 1.0
    return max(1, round(tiny.pretrain_steps * factor))


def base_tokenizer(recipe: QuickstartRecipe, world: World, rl: TrainRecipe) -> PreTrainedTokenizerFast:
    """The base's tokenizer: English from the prompts, world-like names in pieces, years and cities whole."""
    # The tokenizer learns English from the policy prompt and the simulator's instructions (a
    # real LM's tokenizer knows English words); world names stay unseen by it and split into pieces.
    simulator_prompt = render_simulator_prompt(
        "simsearch", query="", question="", golden_answers=[""], noisy=False, top_k=3
    )
    tiny = recipe.tinyworld
    if recipe.protocol == "tool-call":  # the user message and the call's JSON, as the rollout writes them
        policy_texts = [tool_call_messages("", rl.rollout.template)[0]["content"], tiny_call("")]
        texts = world.texts_for_tokenizer() + [*policy_texts, simulator_prompt] * 100
        tokenizer = train_tokenizer(texts, tiny.vocab_size, TOOL_SPECIAL_TOKENS, TINY_TOOL_TEMPLATE)
    else:
        texts = world.texts_for_tokenizer() + [render_prompt("", template=rl.rollout.template), simulator_prompt] * 100
        tokenizer = train_tokenizer(texts, vocab_size=tiny.vocab_size)
    tokenizer.add_tokens([*(YEARS if tiny.year_tokens else ()), *(world.cities if tiny.city_tokens else ())])
    if recipe.protocol == "tool-call" and tiny.call_tokens:
        # what tiny_call writes around a query, less the special tokens that open and close it
        call = tiny_call("QUERY").removeprefix("<tool_call>").removesuffix("</tool_call>")
        tokenizer.add_tokens(call.split(CALL_QUERY_PREFIX + "QUERY"))
    return tokenizer


def base_traces(
    recipe: QuickstartRecipe,
    world: World,
    questions: list[QAExample],
    tokenizer: PreTrainedTokenizerFast,
    rl: TrainRecipe,
    *,
    n: int = 0,
) -> list[Trace]:
    """The base's pretraining traces about `questions`, searching `trace_passages` only."""
    engine = BM25SearchEngine.build(trace_passages(world), show_progress=False)
    tiny = recipe.tinyworld
    return make_traces(
        world,
        engine,
        tokenizer,
        n=n or tiny.pretrain_traces,
        seed=recipe.seed,
        top_k=rl.search.top_k,
        template=rl.rollout.template,
        examples=questions,
        typed_answer_share=tiny.typed_answer_share,
        reading_share=tiny.reading_share,
        redraw_empty=tiny.redraw_empty_searches,
        rendering=rl.search.rendering,
        two_search_share=tiny.two_search_share,
        query_mix=tiny.query_mix,
        protocol=recipe.protocol,
    )


def trace_passages(world: World) -> list[Passage]:
    """The corpus less the train and test people: what the base's pretraining traces search."""
    return world.passages_without(world.people("train") | world.people("test"))
