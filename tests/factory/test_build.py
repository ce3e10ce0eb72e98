"""Recipe sections build working engines; indexes are saved once and reopened after."""

from __future__ import annotations

from pathlib import Path

import pytest

from simsearch.curriculum.recipe import CurriculumConfig
from simsearch.errors import RecipeError
from simsearch.factory import build
from simsearch.factory.build import build_schedule, build_search_engine, search_fingerprint
from simsearch.simulator import engine, prompts
from simsearch.simulator.recipe import SearchConfig
from simsearch.tinyworld.world import build_world
from simsearch.types import SearchRequest


@pytest.fixture(scope="module")
def world_files(tmp_path_factory):
    world = build_world(seed=3, n_entities=20, n_train_entities=12, n_cities=5)
    return world, world.write(tmp_path_factory.mktemp("world"))


def _config(**fields) -> SearchConfig:
    cfg = SearchConfig(**fields)
    cfg.check("search")
    return cfg


@pytest.mark.parametrize("kind", ["bm25", "dense"])
def test_local_index_is_built_saved_and_reopened(kind: str, world_files, tmp_path: Path) -> None:
    world, files = world_files
    fact = next(iter(world.facts.values()))
    cfg = _config(kind=kind, corpus=str(files["corpus"]), index_dir=str(tmp_path / "index"), top_k=2)
    first = build_search_engine(cfg).search([SearchRequest(query=fact.entity, top_k=2)])
    assert any(p.is_file() for p in (tmp_path / "index").iterdir())
    again = build_search_engine(cfg).search([SearchRequest(query=fact.entity, top_k=2)])
    assert [d.id for d in first[0]] == [d.id for d in again[0]]
    assert fact.entity in first[0][0].title  # the entity's own passage ranks first


def test_cache_wraps_the_engine_and_namespaces_by_configuration(world_files, tmp_path: Path) -> None:
    _, files = world_files
    cfg = _config(kind="bm25", corpus=str(files["corpus"]), cache=str(tmp_path / "cache.sqlite"), top_k=2)
    engine = build_search_engine(cfg)
    engine.search([SearchRequest(query="Tesmar", top_k=2)])
    engine.search([SearchRequest(query="Tesmar", top_k=2)])
    assert engine.stats()["cache/hits"] == 1
    other = _config(kind="bm25", corpus=str(files["corpus"]), cache=cfg.cache, top_k=2, rendering="plain")
    assert search_fingerprint(other) != search_fingerprint(cfg)
    assert search_fingerprint(
        _config(kind="bm25", corpus=str(files["corpus"]), top_k=2, timeout_s=1)
    ) == search_fingerprint(_config(kind="bm25", corpus=str(files["corpus"]), top_k=2, timeout_s=9))


def test_a_corpus_or_simulator_rewritten_in_place_gets_a_new_cache_namespace(tmp_path: Path) -> None:
    """Another world or a retrained simulator at the same path must never hit the old cache."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "0", "contents": "a"}\n')
    bm25 = _config(kind="bm25", corpus=str(corpus))
    before = search_fingerprint(bm25)
    assert search_fingerprint(bm25) == before  # stable while nothing changes
    corpus.write_text('{"id": "0", "contents": "b"}\n')  # same size, another world
    assert search_fingerprint(bm25) != before

    model = tmp_path / "simulator"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights one")
    simulator = SearchConfig(kind="simulator")
    simulator.simulator.generation.model.path = str(model)
    before = search_fingerprint(simulator)
    (model / "model.safetensors").write_bytes(b"weights two")
    assert search_fingerprint(simulator) != before


def test_missing_corpus_is_a_recipe_error(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"corpus .*nope\.jsonl.* not found"):
        build_search_engine(_config(kind="bm25", corpus=str(tmp_path / "nope.jsonl")))


def test_self_search_has_no_engine() -> None:
    assert build_search_engine(_config(kind="self")) is None


# --- the curriculum ------------------------------------------------------------------------------


def _curriculum(**overrides: object) -> CurriculumConfig:
    """The recipe section with test defaults: the exponential example and a small adaptive rule."""
    fields: dict[str, object] = dict(
        kind="exponential", p_start=0.0, p_end=0.5, base=4.0, total_steps=100,
        target_reward=0.6, collapse_reward=0.2, delta=0.1, window=2, p_min=0.1, p_max=0.4,
    )  # fmt: skip
    fields.update(overrides)
    return CurriculumConfig(**fields)  # type: ignore[arg-type]


def test_build_schedule_each_kind() -> None:
    assert build_schedule(_curriculum(kind="exponential"))(50) == pytest.approx(1 / 6, abs=1e-12)
    assert build_schedule(_curriculum(kind="exponential", base=16.0))(50) == pytest.approx(0.1, abs=1e-12)
    assert build_schedule(_curriculum(kind="linear"))(50) == pytest.approx(0.25, abs=1e-12)
    assert build_schedule(_curriculum(kind="cosine"))(50) == pytest.approx(0.25, abs=1e-12)
    step = build_schedule(_curriculum(kind="step", p_start=0.05, milestones=[10], values=[0.5]))
    assert (step(9), step(10)) == (0.05, 0.5)
    assert build_schedule(_curriculum(kind="constant", p_start=0.3))(99) == 0.3
    adaptive = build_schedule(_curriculum(kind="adaptive", p_start=0.2))
    adaptive.observe({"reward/mean": 0.9})
    adaptive.observe({"reward/mean": 0.9})
    assert adaptive(0) == pytest.approx(0.3, abs=1e-12)


def test_build_schedule_total_steps_zero_means_the_trainers() -> None:
    # linear over the trainer's 200 steps: 0.5 * 50/200
    cfg = _curriculum(kind="linear", total_steps=0)
    assert build_schedule(cfg, trainer_total_steps=200)(50) == pytest.approx(0.125, abs=1e-12)
    # an explicit total_steps wins: 0.5 * 50/100
    assert build_schedule(_curriculum(kind="linear"), trainer_total_steps=200)(50) == pytest.approx(0.25, abs=1e-12)
    with pytest.raises(ValueError, match=r"curriculum.total_steps"):
        build_schedule(cfg)


def test_build_schedule_errors() -> None:
    with pytest.raises(ValueError, match=r"curriculum.kind 'exp'"):
        build_schedule(_curriculum(kind="exp"))
    with pytest.raises(ValueError, match="base"):
        build_schedule(_curriculum(kind="exponential", base=1.0))


def test_the_builder_tables_cover_exactly_the_engine_kinds_the_recipe_modules_declare() -> None:
    """Adding an engine kind is its name in the recipe module and its builder here: neither alone."""
    from simsearch.factory.build import GENERATION_ENGINES, SEARCH_ENGINES
    from simsearch.generation.recipe import GENERATION_KINDS, GenerationConfig
    from simsearch.retrieval.recipe import SEARCH_KINDS

    assert set(GENERATION_ENGINES) == set(GENERATION_KINDS)
    assert set(SEARCH_ENGINES) == set(SEARCH_KINDS)
    assert GENERATION_KINDS == ("hf", "openai", "vllm")
    engines = ("bm25", "dense", "http", "serper", "serpapi", "simulator", "self")
    controls = ("empty", "random", "answerless", "oracle")  # the controls' engines
    assert engines + controls == SEARCH_KINDS
    with pytest.raises(RecipeError, match=r"policy.kind='tgi' is not one of hf, openai, vllm"):
        GenerationConfig(kind="tgi").check("policy")
    with pytest.raises(RecipeError, match=r"search.kind='google' is not one of bm25, dense, http"):
        SearchConfig(kind="google").check("search")
    assert build_search_engine(_config(kind="self")) is None


def test_the_simulator_gets_the_recipe_templates_when_its_preset_table_entry_asks(monkeypatch) -> None:
    """Whether templates are passed is the preset's `needs_templates`, not its name."""
    templated = prompts.PresetSpec(prompts.PRESETS["custom"].render, needs_templates=True)
    monkeypatch.setitem(prompts.PRESETS, "my-templated", templated)
    monkeypatch.setattr(build, "build_generation_engine", lambda generation: (object(), None, None))
    built: list[dict] = []
    monkeypatch.setattr(engine, "SimulatedSearchEngine", lambda generator, **options: built.append(options))
    cfg = SearchConfig(kind="simulator")
    cfg.simulator.useful_template, cfg.simulator.noisy_template = "U {query}", "N {query}"
    for preset in ("my-templated", "custom", "simsearch"):
        cfg.simulator.preset = preset
        build.build_simulator(cfg)
    templates = prompts.PromptTemplates("U {query}", "N {query}")
    assert [options["templates"] for options in built] == [templates, templates, None]
    cfg.simulator.noisy_answers = "redact"
    build.build_simulator(cfg)
    assert [options["noisy_answers"] for options in built] == ["keep", "keep", "keep", "redact"]
