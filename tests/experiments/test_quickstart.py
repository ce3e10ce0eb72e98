"""`simsearch quickstart --smoke` runs every stage for a step or two and writes the report."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image
from transformers import AutoTokenizer

from simsearch.config import QuickstartRecipe, TrainRecipe, load_recipe, save_recipe
from simsearch.errors import RecipeError
from simsearch.experiments import pipeline, quickstart
from simsearch.experiments import release as release_command
from simsearch.fingerprints import claim_stage, stage_fingerprint
from simsearch.models import TINY_TOOL_TEMPLATE
from simsearch.tinyworld.diagnostics import QUERY_NAMING
from simsearch.tinyworld.traces import tiny_call

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "quickstart"
# What may differ between two runs of the same recipe: clocks and memory.
VOLATILE = {"wall_s", "stage_s", "peak_rss_gb"}


def _smoke(run_dir: Path, *overrides: str) -> dict:
    """The smoke quickstart with the fit simulator (the knowing one: tests/experiments/test_quickstart_knowing.py)."""
    settings = [f"run_dir={run_dir}", "smoke=true", "simulator=fit"]
    return quickstart.main(load_recipe(QuickstartRecipe, None, [*settings, *overrides]))


def _train_metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not _clock_reading(k)} for row in rows]


def _clock_reading(key: str) -> bool:
    """Metrics that time something: they differ between any two runs."""
    return key.startswith(("time/", "perf/")) or "/latency_" in key or key.endswith("/seconds")


def _mtimes(run_dir: Path) -> dict[str, int]:
    return {str(p.relative_to(run_dir)): p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> tuple[Path, dict]:
    run_dir = tmp_path_factory.mktemp("smoke")
    return run_dir, _smoke(run_dir)


@pytest.mark.slow
def test_smoke_runs_every_stage_and_writes_the_report(smoke_run) -> None:
    tmp_path, result = smoke_run
    report = json.loads((tmp_path / "report.json").read_text())
    assert report == result
    assert report["smoke"] is True and report["wall_s"] > 0 and 0 < report["peak_rss_gb"] < 4
    # The no-search policy is evaluated as it was trained, with no search engine; the others on every engine.
    assert {policy: set(scores) for policy, scores in report["em"].items()} == {
        "base": {"simulator", "bm25", "dense", "none"},
        "rl_search": {"simulator", "bm25", "dense", "none"},
        "rl_nosearch": {"none"},
    }
    # EM points over the smoke run's 8 held-out questions, one sample each: a whole count of 8 (a multiple of
    # 12.5), and the policy's own evaluation record on that engine.
    for policy, scores in report["em"].items():
        rows = json.loads((tmp_path / "eval" / policy / "summary.json").read_text())["rows"]
        for engine, em in scores.items():
            assert rows[engine]["average"]["questions"] == 8, (policy, engine)
            assert em == 100.0 * rows[engine]["average"]["em"] and em / 12.5 == round(em / 12.5), (policy, engine)
    nosearch_rows = (tmp_path / "eval" / "rl_nosearch" / "examples" / "none" / "heldout.jsonl").read_text()
    turns = [turn for line in nosearch_rows.splitlines() for turn in json.loads(line)["samples"][0]["turns"]]
    assert turns and all(turn["documents"] == [] for turn in turns)
    # Every stage left its output where the next one (and a user) looks for it.
    assert (tmp_path / "base" / "config.json").is_file()
    assert (tmp_path / "collect" / "train.jsonl").stat().st_size > 0
    assert (tmp_path / "simulator" / "checkpoints").is_dir()
    for run in ("train", "train_nosearch"):
        rows = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(r)["step"] for r in rows] == [1, 2]
    assert "| rl_search |" in (tmp_path / "report.md").read_text()
    assert set(report["stage_s"]) == {"world", "pretrain", "collect", "simulator_sft", "rl", "eval"}
    for policy in ("base", "rl_search", "rl_nosearch"):
        assert (tmp_path / "eval" / policy / "summary.json").is_file()
    page = (tmp_path / "eval" / "rl_search" / "view.html").read_text()
    assert "heldout" in page and "bm25" in page and "simulator" in page
    for plot in ("bars.png", "curves.png"):
        with Image.open(tmp_path / plot) as image:
            assert image.size[0] >= 800 and image.size[1] >= 400
    # What the numbers depend on besides the recipe, and what the base starts RL from.
    assert report["machine"]["threads"] >= 1 and report["machine"]["cpu"]
    assert report["machine"]["versions"]["torch"] == torch.__version__
    assert set(report["base_reading"]) == {"birth_city", "occupation", "founding_year", "all"}
    assert report["base_reading"]["all"]["questions"] == 300
    assert set(report["query_naming"]) == {"base", "rl_search"}
    for policy, kinds in report["query_naming"].items():
        assert set(kinds) == set(QUERY_NAMING)
        assert sum(kind["share"] for kind in kinds.values()) == pytest.approx(1.0)
        # the kinds split the 8 held-out BM25 rows: shares are counts of 8, and their EMs weighted by share
        # add up to the policy's BM25 EM
        assert all(kind["share"] * 8 == round(kind["share"] * 8) for kind in kinds.values())
        weighted = sum(kind["share"] * kind["em"] for kind in kinds.values())
        assert 100.0 * weighted == pytest.approx(report["em"][policy]["bm25"], abs=1e-9)
    assert "| rl_search | " in (tmp_path / "report.md").read_text().split("names the asked person")[1]


@pytest.mark.slow
def test_the_base_tokenizer_writes_cities_and_years_whole(smoke_run) -> None:
    run_dir, _ = smoke_run
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "base")
    corpus = (run_dir / "world" / "corpus.jsonl").read_text()
    city = re.search(r"Born in (\w+), \w+ became", corpus).group(1)
    year = re.search(r"founded [a-z ]+ in (\d{4})", corpus).group(1)
    for value in (city, year):
        assert len(tokenizer(value, add_special_tokens=False)["input_ids"]) == 1, value


def _names_in(text: str, names: set[str]) -> set[str]:
    return {word for word in re.findall(r"[A-Z][a-z]+", text) if word in names}


@pytest.mark.slow
def test_no_held_out_person_reaches_the_simulators_sft_pairs(smoke_run) -> None:
    run_dir, _ = smoke_run
    world = pipeline.build_world(seed=0, n_entities=300, n_train_entities=200, n_background_entities=900)
    pairs = [
        json.loads(line)
        for name in ("train.jsonl", "val.jsonl")
        for line in (run_dir / "collect" / name).read_text().splitlines()
    ]
    assert pairs
    text = "\n".join(pair["prompt"] + pair["response"] for pair in pairs)
    assert not _names_in(text, world.people("test"))
    # The check can see names: the pairs hold training people (the questions' own) and background ones.
    assert _names_in(text, world.people("train") | world.people("background"))
    # What collect searched: the corpus less exactly the held-out people's passages.
    known = [
        json.loads(line)["contents"] for line in (run_dir / "world" / "corpus_known.jsonl").read_text().splitlines()
    ]
    assert len(known) == len(world.passages) - 3 * len(world.people("test"))
    assert not _names_in("\n".join(known), world.people("test"))


@pytest.mark.slow
def test_rl_prompts_name_no_held_out_person_and_rl_searches_only_the_simulator(smoke_run) -> None:
    run_dir, _ = smoke_run
    world = pipeline.build_world(seed=0, n_entities=300, n_train_entities=200, n_background_entities=900)
    rows = [json.loads(line) for line in (run_dir / "train" / "trajectories.jsonl").read_text().splitlines()]
    assert rows and not _names_in("\n".join(row["question"] for row in rows), world.people("test"))
    assert _names_in("\n".join(row["question"] for row in rows), world.people("train"))
    engines = json.loads((run_dir / "train" / "cost.json").read_text())["engines"]
    assert [usage["kind"] for usage in engines.values()] == ["simulator"]


def test_no_pretraining_trace_names_anyone_rl_or_the_evaluation_asks_about() -> None:
    world = pipeline.build_world(seed=3, n_entities=40, n_train_entities=25, n_background_entities=60)
    recipe = load_recipe(QuickstartRecipe, None, ["tinyworld.pretrain_traces=400", "seed=3"])
    rl = load_recipe(TrainRecipe, RECIPES / "train.yaml")
    tokenizer = pipeline.base_tokenizer(recipe, world, rl)
    traces = pipeline.base_traces(recipe, world, world.background, tokenizer, rl)
    text = "\n".join(tokenizer.decode(trace.input_ids) for trace in traces)
    assert len(traces) == 400
    assert not _names_in(text, world.people("train") | world.people("test"))
    assert len(_names_in(text, world.people("background"))) > 30  # the check sees the names that are there
    # A name-less query over the whole corpus would have reached them: 3 x 40 of 300 passages are theirs.
    assert len(pipeline.trace_passages(world)) == len(world.passages) - 3 * 40


def test_call_tokens_write_the_calls_fixed_json_as_two_tokens() -> None:
    world = pipeline.build_world(seed=3, n_entities=40, n_train_entities=25, n_background_entities=60)
    rl = load_recipe(TrainRecipe, RECIPES / "train.yaml")
    call = tiny_call("Refo born")
    pieces = {}
    for flag in (False, True):
        recipe = load_recipe(QuickstartRecipe, None, ["protocol=tool-call", f"tinyworld.call_tokens={flag}"])
        tokenizer = pipeline.base_tokenizer(recipe, world, rl)
        ids = tokenizer(call, add_special_tokens=False)["input_ids"]
        pieces[flag] = [tokenizer.decode([i]) for i in ids]
        assert tokenizer.decode(ids) == call
    assert pieces[True][:2] == ["<tool_call>", '{"name": "search", "arguments": {"query": "']
    assert pieces[True][-2:] == ['"}}', "</tool_call>"]
    assert pieces[True][2:-2] == pieces[False][14:-3]  # the query keeps its pieces; 13 and 2 pieces became 1 each
    recipe = load_recipe(QuickstartRecipe, None, ["protocol=tool-call", "tinyworld.call_tokens=true"])
    settings = pipeline.base_settings(recipe, rl)
    off = pipeline.base_settings(load_recipe(QuickstartRecipe, None, ["protocol=tool-call"]), rl)
    assert settings == {**off, "call_tokens": True}


def test_the_tool_call_base_pretrains_for_its_factor_of_the_steps(monkeypatch, tmp_path: Path) -> None:
    world = pipeline.build_world(seed=3, n_entities=40, n_train_entities=25, n_background_entities=60)
    rl = load_recipe(TrainRecipe, RECIPES / "train.yaml")
    steps: list[int] = []
    monkeypatch.setattr(pipeline, "save_tiny", lambda *args: None)
    monkeypatch.setattr(pipeline, "pretrain", lambda model, traces, **kw: steps.append(kw["steps"]))
    for protocol in ("tags", "tool-call"):
        recipe = load_recipe(
            QuickstartRecipe, None,
            [f"protocol={protocol}", "tinyworld.pretrain_steps=30", "tinyworld.tool_call_pretrain_factor=2.5",
             "tinyworld.pretrain_traces=40", "tinyworld.drill_steps=2"],
        )  # fmt: skip
        steps.clear()
        pipeline.pretrain_base(recipe, world, world.background, rl, tmp_path)
        assert steps == [2, 30 if protocol == "tags" else 75]  # the drills, then the traces

    # The base's fingerprint follows the steps taken: a factor of 1 over as many steps is the same base.
    def settings(*overrides: str) -> dict:
        return pipeline.base_settings(load_recipe(QuickstartRecipe, None, list(overrides)), rl)

    doubled = settings("protocol=tool-call", "tinyworld.tool_call_pretrain_factor=2.0", "tinyworld.pretrain_steps=800")
    assert doubled == settings(
        "protocol=tool-call", "tinyworld.tool_call_pretrain_factor=1.0", "tinyworld.pretrain_steps=1600"
    )
    once = settings("protocol=tool-call", "tinyworld.tool_call_pretrain_factor=1.0", "tinyworld.pretrain_steps=800")
    assert doubled == {**once, "pretrain_steps": 1600}
    assert (
        settings("tinyworld.tool_call_pretrain_factor=2.0", "tinyworld.pretrain_steps=800")["pretrain_steps"] == 800
    )  # tags


@pytest.mark.parametrize("held_out", [True, False])
def test_the_simulator_validates_on_collects_held_out_pairs_only_when_there_are_some(
    held_out: bool, monkeypatch, capsys, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    (run / "collect").mkdir(parents=True)
    (run / "collect" / "train.jsonl").write_text('{"query": "q", "document": "d"}\n')
    (run / "collect" / "val.jsonl").write_text('{"query": "v", "document": "d"}\n' if held_out else "")
    seen = []
    monkeypatch.setattr(pipeline.simulator_finetune, "main", seen.append)
    stages = pipeline.Pipeline(load_recipe(QuickstartRecipe, None, []), RECIPES, run, {})
    pipeline.simulator_stage(stages, "collect-fingerprint")

    assert [stage.val_file for stage in seen] == [str(run / "collect" / "val.jsonl") if held_out else ""]
    assert ("without validation" in capsys.readouterr().out) is not held_out


@pytest.mark.slow
def test_the_same_recipe_gives_the_same_numbers(smoke_run, tmp_path: Path) -> None:
    """Same recipe, seed and threads on the same machine: every metric equal, not just close."""
    first_dir, first = smoke_run
    second = _smoke(tmp_path)
    assert {k: v for k, v in second.items() if k not in VOLATILE} == {
        k: v for k, v in first.items() if k not in VOLATILE
    }
    for run in ("train", "train_nosearch"):
        assert _train_metrics(tmp_path / run) == _train_metrics(first_dir / run)


class Built(Exception):
    """Raised by a stage's builder that must not run: its model was to be installed from the release."""


def _refuse(*args, **kwargs):
    raise Built


@pytest.mark.slow
def test_a_released_base_and_simulator_are_installed_not_built(smoke_run, tmp_path: Path, monkeypatch) -> None:
    first_dir, first = smoke_run
    release = tmp_path / "release"
    index = release_command.ship(first_dir, release, commit="abc1234")
    assert {stage: entry["fingerprint"] for stage, entry in index["stages"].items()} == {
        stage: stage_fingerprint(first_dir / stage) for stage in ("base", "simulator")
    }
    assert json.loads((release / "release.json").read_text()) == index
    assert {entry["built"]["commit"] for entry in index["stages"].values()} == {"abc1234"}
    monkeypatch.setattr(pipeline, "RELEASE", release)
    monkeypatch.setattr(pipeline, "pretrain_base", _refuse)
    monkeypatch.setattr(pipeline.simulator_finetune, "main", _refuse)
    monkeypatch.setattr(pipeline.simulator_collect, "main", _refuse)  # a released simulator needs no SFT data
    second = _smoke(tmp_path / "run")
    assert not (tmp_path / "run" / "collect").exists()
    assert first["released"] == [] and second["released"] == ["base", "simulator"]
    volatile = {*VOLATILE, "released"}
    assert {k: v for k, v in second.items() if k not in volatile} == {
        k: v for k, v in first.items() if k not in volatile
    }
    for model in ("base/model.safetensors", "simulator/checkpoints/step_0000002/model/model.safetensors"):
        assert (tmp_path / "run" / model).read_bytes() == (first_dir / model).read_bytes()
    installed = json.loads((tmp_path / "run" / "base" / pipeline.RELEASED).read_text())
    assert installed == {"stage": "base", **index["stages"]["base"]["built"]}
    # Shipped again from the run that installed it, the base keeps the provenance of the machine that built it.
    again = release_command.ship(tmp_path / "run", tmp_path / "again", commit="def5678")
    assert again["stages"]["base"]["built"]["commit"] == "abc1234"
    # released=false builds the base here; another world's base fingerprint is not the released one.
    with pytest.raises(Built):
        _smoke(tmp_path / "built", "released=false")
    with pytest.raises(Built):
        _smoke(tmp_path / "other", "seed=1")


def test_the_shipped_release_is_the_default_recipes_base_and_simulator(tmp_path: Path) -> None:
    """A change of the default recipe (or a stage recipe) that moves a fingerprint leaves the release unused: the
    quickstart would build both again. Rebuild and ship them: `python -m simsearch.experiments.release runs/release`."""
    index = json.loads((pipeline.RELEASE / "release.json").read_text())
    planned = pipeline.planned_fingerprints(load_recipe(QuickstartRecipe, None, [f"run_dir={tmp_path}"]))
    assert {stage: entry["fingerprint"] for stage, entry in index["stages"].items()} == {
        stage: planned[stage] for stage in ("base", "simulator")
    }
    assert not any(tmp_path.iterdir())  # planning writes nothing
    recipe = load_recipe(QuickstartRecipe, None, [f"run_dir={tmp_path}"])
    assert pipeline.released_stage(recipe, "base", planned["base"]) == pipeline.RELEASE / "base"
    assert pipeline.released_stage(recipe, "base", planned["simulator"]) is None
    recipe.released = False
    assert pipeline.released_stage(recipe, "base", planned["base"]) is None
    for entry in index["stages"].values():  # each model as `load_model` reads it
        folder = pipeline.RELEASE / entry["folder"]
        assert list(folder.rglob("model.safetensors")) and list(folder.rglob("tokenizer.json"))


@pytest.mark.slow
def test_a_rerun_reuses_unchanged_stages_and_rebuilds_changed_ones(smoke_run, tmp_path: Path) -> None:
    first_dir, first = smoke_run  # the last test of the module to use it: it moves and changes the run
    before = _mtimes(first_dir)
    run_dir = tmp_path / "moved"  # a moved run directory keeps its stages too
    shutil.move(first_dir, run_dir)
    again = _smoke(run_dir)
    assert _mtimes(run_dir).keys() == before.keys()
    changed = {name for name, mtime in _mtimes(run_dir).items() if mtime != before[name]}
    assert changed <= {
        "recipe.yaml",
        "report.json",
        "report.md",
        "bars.png",
        "curves.png",
        "eval/rl_search/view.html",
    }, changed
    assert again["em"] == first["em"]

    # One value of the eval recipe changes: only the evaluations are rebuilt.
    recipes = tmp_path / "recipes"
    shutil.copytree(RECIPES, recipes)
    eval_yaml = recipes / "eval.yaml"
    eval_yaml.write_text(eval_yaml.read_text().replace("max_new_tokens: 32", "max_new_tokens: 31"))
    before = _mtimes(run_dir)
    _smoke(run_dir, f"recipes_dir={recipes}")
    after = _mtimes(run_dir)
    rebuilt = {name.split("/")[0] for name, mtime in after.items() if before.get(name) != mtime}
    assert rebuilt == {"eval", "recipe.yaml", "report.json", "report.md", "bars.png", "curves.png"}
    for name in before.keys() - after.keys():
        assert name.startswith("eval/")  # the old rows went with their directory

    # Another seed: another world, so nothing of the first may be reused.
    before = _mtimes(run_dir)
    _smoke(run_dir, f"recipes_dir={recipes}", "seed=1")
    after = _mtimes(run_dir)
    for stage in ("world", "index", "base", "collect", "simulator", "train", "train_nosearch", "eval"):
        kept = [n for n in after if n.startswith(f"{stage}/") and before.get(n) == after[n]]
        assert kept == [], (stage, kept)


def test_missing_stage_recipes_are_a_clear_error(tmp_path: Path) -> None:
    recipe = load_recipe(QuickstartRecipe, None, [f"run_dir={tmp_path}", f"recipes_dir={tmp_path}"])
    with pytest.raises(RecipeError, match="no quickstart recipes in"):
        quickstart.main(recipe)


def test_the_trace_settings_are_checked_and_fingerprinted() -> None:
    rl = load_recipe(TrainRecipe, pipeline.recipes_dir(QuickstartRecipe()) / "train.yaml")
    default = pipeline.base_settings(QuickstartRecipe(), rl)
    for override, key, value in (
        ("tinyworld.query_mix=[0.1,0.8,0.1]", "query_mix", [0.1, 0.8, 0.1]),
        ("tinyworld.reading_share=0.5", "reading_share", 0.5),
        ("tinyworld.redraw_empty_searches=true", "redraw_empty_searches", True),
    ):
        changed = pipeline.base_settings(load_recipe(QuickstartRecipe, None, [override]), rl)
        assert changed == {**default, key: value} != default, override
    for bad in ("[0.5,0.5,0.5]", "[0.5,0.5]", "[-0.1,0.6,0.5]"):
        with pytest.raises(RecipeError, match=re.escape("tinyworld.query_mix=") + ".*summing to 1"):
            load_recipe(QuickstartRecipe, None, [f"tinyworld.query_mix={bad}"])
    with pytest.raises(RecipeError, match="reading_share"):
        load_recipe(QuickstartRecipe, None, ["tinyworld.reading_share=1.5"])


def _old_shape(recipe: QuickstartRecipe, run: Path) -> Path:
    """`recipe` saved in `run` as the quickstart saved it before its `tinyworld` section: every key at the top."""
    saved = dataclasses.asdict(recipe)
    saved.update(saved.pop("tinyworld"))
    (run / "recipe.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    return run / "recipe.yaml"


def test_a_run_directory_saved_before_the_tinyworld_section_is_read_when_its_stages_agree(
    tmp_path: Path, capsys
) -> None:
    recipe = load_recipe(QuickstartRecipe, None, [f"run_dir={tmp_path}", "seed=4", "tinyworld.pretrain_steps=800"])
    path = _old_shape(recipe, tmp_path)
    with pytest.raises(RecipeError, match=re.escape("key n_entities: QuickstartRecipe has no n_entities of its own; "
                                                    "it is tinyworld.n_entities")):  # fmt: skip
        load_recipe(QuickstartRecipe, path, [])
    planned = pipeline.planned_fingerprints(recipe)
    for stage in ("world", "base"):
        claim_stage(tmp_path / stage, planned[stage])
    assert pipeline.saved_recipe(tmp_path) == recipe
    assert "saved before the tinyworld section" in capsys.readouterr().out
    # A directory whose base was built from other settings is refused, its recipe not guessed at.
    claim_stage(tmp_path / "base", "0123456789abcdef")
    with pytest.raises(RecipeError, match=f"{tmp_path / 'base'} was not built under it"):
        pipeline.saved_recipe(tmp_path)
    save_recipe(recipe, tmp_path)  # the new shape loads as any recipe
    assert pipeline.saved_recipe(tmp_path) == recipe


def test_every_stage_runs_at_the_quickstarts_thread_count(tmp_path: Path) -> None:
    recipe = load_recipe(QuickstartRecipe, None, [f"run_dir={tmp_path}", "threads=3"])
    stages = pipeline.Pipeline(recipe, RECIPES, tmp_path, {})
    seen: list = []
    stages.stage("train", TrainRecipe, seen.append, [], [f"run_dir={tmp_path / 'train'}"])
    assert [stage.threads for stage in seen] == [3]  # train.yaml's own default is 1


def test_the_tool_call_protocol_trains_at_its_own_learning_rate(tmp_path: Path) -> None:
    shipped = load_recipe(TrainRecipe, RECIPES / "train.yaml")
    for protocol, lr, extra in (("tags", shipped.optim.lr, 0), ("tool-call", 2e-5, pipeline.TOOL_CALL_EXTRA_TOKENS)):
        recipe = load_recipe(
            QuickstartRecipe, None, [f"run_dir={tmp_path}", f"protocol={protocol}", "tinyworld.tool_call_lr=2e-5"]
        )
        stages = pipeline.Pipeline(recipe, RECIPES, tmp_path, {})
        seen: list = []
        for name in ("train", "train_nosearch"):
            stages.stage(name, TrainRecipe, seen.append, [], [f"run_dir={tmp_path / protocol / name}"])
        assert [stage.optim.lr for stage in seen] == [lr, lr], protocol
        assert seen[0].sampling.max_new_tokens == shipped.sampling.max_new_tokens + extra, protocol


@pytest.mark.slow
@pytest.mark.timeout(900)  # a whole pipeline for a step or two: minutes on a busy 2-core machine
def test_the_tool_call_quickstart_searches_with_tool_calls_in_every_stage(tmp_path: Path) -> None:
    # protocol=tool-call: a base whose template offers tools, pretrained on Hermes calls; collect,
    # RL and evaluation run the tool-call rollout with the call's extra tokens; the report is whole.
    result = _smoke(tmp_path, "protocol=tool-call")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "base")
    assert tokenizer.chat_template == TINY_TOOL_TEMPLATE and tokenizer.eos_token == "<|im_end|>"
    for stage in ("collect", "train", "train_nosearch", "eval/rl_search"):
        recipe = (tmp_path / stage / "recipe.yaml").read_text()
        assert "protocol: tool-call" in recipe, stage
    train = load_recipe(TrainRecipe, tmp_path / "train" / "recipe.yaml")
    shipped = load_recipe(TrainRecipe, RECIPES / "train.yaml")
    assert train.sampling.max_new_tokens == shipped.sampling.max_new_tokens + pipeline.TOOL_CALL_EXTRA_TOKENS
    assert json.loads((tmp_path / "collect" / "stats.json").read_text())["collect/records"] > 0
    rows = [json.loads(line) for line in (tmp_path / "train" / "trajectories.jsonl").read_text().splitlines()]
    calls = [q for row in rows for turn in row["turns"] for q in turn.get("call_queries", [])]
    assert calls and all("<search>" not in row["response"] for row in rows)
    assert set(result["em"]["rl_search"]) == {"simulator", "bm25", "dense", "none"}
