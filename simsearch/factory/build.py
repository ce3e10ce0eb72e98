"""Recipe sections → the objects they describe: generation engines, search engines, schedules.

`GENERATION_ENGINES` and `SEARCH_ENGINES` map each engine kind the recipe modules name
(`generation.recipe.GENERATION_KINDS`, `retrieval.recipe.SEARCH_KINDS`) to its builder; a test
keeps them equal. Everything is built at a command's setup, so a missing model, corpus or API
key fails before any work starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, cast

from simsearch.curriculum.recipe import CurriculumConfig
from simsearch.curriculum.schedules import NoiseSchedule, make_schedule
from simsearch.data.rendering import VERBATIM_STYLE
from simsearch.errors import RecipeError
from simsearch.fingerprints import digest, path_identity
from simsearch.generation.base import GenerationEngine
from simsearch.generation.recipe import GenerationConfig
from simsearch.retrieval.accounting import Ledger
from simsearch.retrieval.base import SearchEngine
from simsearch.simulator.recipe import SearchConfig


def build_generation_engine(
    cfg: GenerationConfig, *, tokenizer=None, seed: int = 0, distributed_executor_backend: str | None = None
) -> tuple[GenerationEngine, Any, Any]:
    """Build the engine a `GenerationConfig` names.

    Args:
        cfg: The engine's section of a recipe.
        tokenizer: `openai`: the tokenizer to use (default: the one at `cfg.model.path`).
        seed: `vllm`: the engine's seed.
        distributed_executor_backend: `vllm`: "external_launcher" when every process of a
            multi-process launch runs its own engine (see `VLLMEngine`); None otherwise.

    Returns:
        (engine, tokenizer, model): `model` is the in-process transformers model for `hf` (the
        trainer updates it in place, so the engine always generates with the latest weights),
        None for servers. `tokenizer` is the model's, or the one passed in for `openai`.
    """
    return GENERATION_ENGINES[cfg.kind](cfg, tokenizer, seed, distributed_executor_backend)


Built = tuple[GenerationEngine, Any, Any]  # engine, tokenizer (or None), the loaded model (or None)


def _hf_engine(cfg: GenerationConfig, tokenizer: Any, seed: int, backend: str | None) -> Built:
    from simsearch.generation.hf import HFEngine
    from simsearch.models import load_model

    model, tok = load_model(cfg.model.path, adapter=cfg.model.adapter, dtype=cfg.model.dtype, device=cfg.model.device)
    return HFEngine(model, tok, batch_size=cfg.batch_size, compile=cfg.compile), tok, model


def _openai_engine(cfg: GenerationConfig, tokenizer: Any, seed: int, backend: str | None) -> Built:
    from simsearch.generation.openai import OpenAIEngine

    if tokenizer is None and cfg.model.path:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    engine = OpenAIEngine(
        cfg.base_urls,
        cfg.served_model_name or cfg.model.path,
        tokenizer=tokenizer,
        api_key_env=cfg.api_key_env,
        timeout_s=cfg.timeout_s,
        max_retries=cfg.max_retries,
        backoff_s=cfg.backoff_s,
        max_concurrency=cfg.max_concurrency,
        chat=cfg.chat,
    )
    return engine, tokenizer, None


def _vllm_engine(cfg: GenerationConfig, tokenizer: Any, seed: int, backend: str | None) -> Built:
    from simsearch.generation.vllm import VLLMEngine

    engine = VLLMEngine(  # GPU-only and not yet verified on a GPU (docs/scaling.md)
        cfg.model.path,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        tensor_parallel_size=cfg.tensor_parallel_size,
        enable_sleep_mode=cfg.enable_sleep_mode,
        dtype=cfg.model.dtype,
        seed=seed,
        max_model_len=cfg.max_model_len or None,
        distributed_executor_backend=backend,
        max_num_batched_tokens=cfg.max_num_batched_tokens or None,
        max_num_seqs=cfg.max_num_seqs or None,
        sleep_level=cfg.sleep_level,
    )
    return engine, engine.tokenizer, None


GENERATION_ENGINES: dict[str, Callable[[GenerationConfig, object, int, str | None], Built]] = {
    "hf": _hf_engine,  # transformers, in process
    "openai": _openai_engine,  # an OpenAI-compatible server
    "vllm": _vllm_engine,  # vLLM, in process (GPU)
}
"""A builder for each of `GENERATION_KINDS`: kind -> (cfg, tokenizer, seed, executor backend) -> built."""


def build_schedule(cfg: CurriculumConfig, trainer_total_steps: int = 0) -> NoiseSchedule:
    """The noise schedule a recipe's `curriculum` section names.

    Args:
        cfg: The section; each schedule takes the fields its function names
            (`curriculum.schedules.make_schedule`).
        trainer_total_steps: The run's total training steps, used when `cfg.total_steps` is 0
            (the recipe's "as long as training" setting).

    Raises:
        ValueError: On an unknown kind or invalid parameters (the message names the field).
    """
    settings = asdict(cfg)
    settings["total_steps"] = cfg.total_steps or trainer_total_steps
    return make_schedule(cfg.kind, **settings)


PRICE_FIELDS = ("price_per_1k_queries", "gpu_hour_price")
"""SearchConfig fields that price an engine: they never change its answers."""


def search_fingerprint(cfg: SearchConfig) -> str:
    """A stable identity of what shapes an engine's answers, used as the cache namespace.

    Timeouts, retries, prices and the cache path do not change answers and are left out. Local files
    enter by identity (`fingerprints.path_identity`): a corpus or a simulator model rewritten at
    the same path (another world, a retrained simulator) gets a new namespace, so its cached
    results are never read back as this one's.
    """
    fields = asdict(cfg)
    for volatile in ("cache", "timeout_s", "max_retries", "backoff_s", "api_key_env", *PRICE_FIELDS):
        fields.pop(volatile)
    if cfg.kind != "simulator":
        fields.pop("simulator")
    if cfg.kind in ("bm25", "dense", "answerless"):
        fields["corpus_files"] = path_identity(cfg.corpus)
    if cfg.kind == "simulator":
        model = cfg.simulator.generation.model
        fields["simulator_files"] = [path_identity(model.path), path_identity(model.adapter)]
    return f"{cfg.kind}:{digest(fields)}"


def build_search_engine(cfg: SearchConfig, *, seed: int = 0) -> SearchEngine | None:
    """Build the search engine a `SearchConfig` names, behind the cache when `cfg.cache` is set.

    Returns None for `kind=self` (self-search: the policy writes its own information).
    """
    engine = _build_uncached(cfg, seed=seed)
    if engine is None or not cfg.cache:
        return engine
    from simsearch.retrieval.cache import CachedSearchEngine

    return CachedSearchEngine(engine, cfg.cache, namespace=search_fingerprint(cfg))


def meter_search_engine(
    engine: SearchEngine | None, cfg: SearchConfig, ledger: Ledger, name: str
) -> SearchEngine | None:
    """Puts the accounting wrappers of `retrieval.accounting` around a built engine.

    The outer `MeteredSearchEngine` counts searches, latency and cache hits; a `SentCounter`
    goes in front of the engine itself (behind the cache, so it counts what a web API bills);
    a `SimulatedSearchEngine`'s generator is wrapped in a `MeteredGenerator` (its tokens and
    seconds). The engine is registered in `ledger` under `name` with the recipe's prices, or
    the kind's documented defaults when they are null.

    Returns:
        The metered engine; None for None (`kind=self` has no engine to count).
    """
    if engine is None:
        return None
    from simsearch.retrieval.accounting import MeteredGenerator, MeteredSearchEngine, SentCounter, default_query_price
    from simsearch.retrieval.cache import CachedSearchEngine
    from simsearch.simulator.engine import SimulatedSearchEngine

    price = cfg.price_per_1k_queries if cfg.price_per_1k_queries is not None else default_query_price(cfg.kind)
    ledger.register(name, cfg.kind, price_per_1k_queries=price, gpu_hour_price=cfg.gpu_hour_price)
    cache = engine if isinstance(engine, CachedSearchEngine) else None
    inner = cache.engine if cache is not None else engine
    if isinstance(inner, SimulatedSearchEngine):
        # The generator's own tokenizer counts string prompts (chat prompts sent to a server).
        tokenizer = inner.tokenizer if inner.tokenizer is not None else getattr(inner.generator, "tokenizer", None)
        inner.generator = MeteredGenerator(inner.generator, ledger, name, tokenizer=tokenizer)
    if cache is not None:
        cache.engine = SentCounter(inner, ledger, name)
        return MeteredSearchEngine(cache, ledger, name, cache=cache)
    return MeteredSearchEngine(SentCounter(inner, ledger, name), ledger, name)


def unmetered(engine: SearchEngine | None) -> SearchEngine | None:
    """The engine inside `meter_search_engine`'s outer wrapper (its inner counters stay).

    For code that inspects the engine's type, as the fidelity measurement does for the
    simulator's parse statistics.
    """
    from simsearch.retrieval.accounting import MeteredSearchEngine, SentCounter

    if isinstance(engine, MeteredSearchEngine):
        engine = engine.engine
    return engine.engine if isinstance(engine, SentCounter) else engine


def _build_uncached(cfg: SearchConfig, *, seed: int) -> SearchEngine | None:
    return SEARCH_ENGINES[cfg.kind](cfg, seed)


def _no_engine(cfg: SearchConfig, seed: int) -> None:
    return None  # self-search: the policy writes its own information


def _empty_engine(cfg: SearchConfig, seed: int) -> SearchEngine:
    from simsearch.retrieval.empty import EmptySearchEngine

    return EmptySearchEngine()


def _random_engine(cfg: SearchConfig, seed: int) -> SearchEngine:
    from simsearch.data.corpus import JsonlCorpus
    from simsearch.retrieval.random_docs import RandomDocumentsEngine

    if not Path(cfg.corpus).is_file():
        raise RecipeError(f"corpus {cfg.corpus!r} not found: give a JSONL file of passages")
    return RandomDocumentsEngine(JsonlCorpus(cfg.corpus), seed=seed)


def _local_engine(cfg: SearchConfig, seed: int) -> SearchEngine:
    if not Path(cfg.corpus).is_file():
        raise RecipeError(f"corpus {cfg.corpus!r} not found: give a JSONL file of passages")
    return _build_local_index(cfg)


def _answerless_engine(cfg: SearchConfig, seed: int) -> SearchEngine:
    from simsearch.retrieval.answerless import AnswerlessSearchEngine

    bm25 = _local_engine(replace(cfg, kind="bm25"), seed)
    return AnswerlessSearchEngine(bm25, limit=len(getattr(bm25, "passages", ())) or None)


def _oracle_engine(cfg: SearchConfig, seed: int) -> SearchEngine:
    from simsearch.retrieval.oracle import OracleSearchEngine

    bm25 = _local_engine(replace(cfg, kind="bm25"), seed)
    return OracleSearchEngine(bm25, getattr(bm25, "passages", ()), seed=seed)


def _http_engine(cfg: SearchConfig, seed: int) -> SearchEngine:
    from simsearch.retrieval.http import HTTPSearchEngine

    return HTTPSearchEngine(
        cfg.url,
        timeout_s=cfg.timeout_s,
        max_retries=cfg.max_retries,
        backoff_s=cfg.backoff_s,
        api_key_env=cfg.api_key_env or None,  # bearer token of a guarded `simsearch serve`
    )


def _web_engine(cfg: SearchConfig, seed: int) -> SearchEngine:
    from simsearch.retrieval.web import SerpAPISearchEngine, SerperSearchEngine

    cls = SerperSearchEngine if cfg.kind == "serper" else SerpAPISearchEngine
    options: dict[str, Any] = {"timeout_s": cfg.timeout_s, "max_retries": cfg.max_retries, "backoff_s": cfg.backoff_s}
    if cfg.api_key_env:
        options["api_key_env"] = cfg.api_key_env
    if cfg.url:
        options["base_url"] = cfg.url
    return cls(**options)


def _simulator_engine(cfg: SearchConfig, seed: int) -> SearchEngine:
    return build_simulator(cfg, seed=seed)


SEARCH_ENGINES: dict[str, Callable[[SearchConfig, int], SearchEngine | None]] = {
    "bm25": _local_engine,
    "dense": _local_engine,
    "http": _http_engine,  # a Search-R1 /retrieve server
    "serper": _web_engine,
    "serpapi": _web_engine,
    "simulator": _simulator_engine,
    "self": _no_engine,
    "empty": _empty_engine,  # finds nothing
    "random": _random_engine,  # top_k corpus passages drawn at random, whatever the query
    "answerless": _answerless_engine,  # BM25's results less every passage holding a gold answer
    "oracle": _oracle_engine,  # the question's answer passage and random ones, whatever the query
}
"""A builder for each of `SEARCH_KINDS`: kind -> (cfg, seed) -> engine (None for self-search)."""


def _build_local_index(cfg: SearchConfig) -> SearchEngine:
    from simsearch.data.corpus import JsonlCorpus

    index_dir = Path(cfg.index_dir) if cfg.index_dir else None
    if cfg.kind == "bm25":
        from simsearch.retrieval import bm25

        if index_dir is not None and (index_dir / bm25.META_FILE).is_file():
            return bm25.BM25SearchEngine.load(index_dir, cfg.corpus)
        engine = bm25.BM25SearchEngine.build(JsonlCorpus(cfg.corpus))  # texts stay on disk
        if index_dir is not None:
            engine.save(index_dir)
        return engine
    from simsearch.retrieval import dense

    model = cfg.embedding_model or None
    if index_dir is not None and (index_dir / dense.META_FILE).is_file():
        return dense.DenseSearchEngine.load(index_dir, cfg.corpus, model=model, use_faiss=cfg.use_faiss)
    return dense.DenseSearchEngine.build(
        JsonlCorpus(cfg.corpus),
        index_dir,  # embeddings are written there while encoding
        model=model,
        query_prefix=cfg.query_prefix,
        passage_prefix=cfg.passage_prefix,
        use_faiss=cfg.use_faiss,
    )


def build_simulator(cfg: SearchConfig, *, seed: int = 0) -> SearchEngine:
    """The LLM simulator a `SearchConfig` with `kind=simulator` describes."""
    from simsearch.simulator.engine import NoisyAnswers, SimulatedSearchEngine
    from simsearch.simulator.prompts import PRESETS, Preset, PromptTemplates

    sim = cfg.simulator
    generation = sim.generation
    preset = PRESETS[sim.preset]  # checked by the recipe
    templates = PromptTemplates(sim.useful_template, sim.noisy_template) if preset.needs_templates else None
    generator, tokenizer, _ = build_generation_engine(generation)
    if generation.kind == "openai":
        # A served simulator applies its own chat template on /v1/chat/completions.
        tokenizer, chat = None, generation.chat
    else:
        chat = sim.chat
    return SimulatedSearchEngine(
        generator,
        preset=cast(Preset, sim.preset),  # checked by the recipe
        tokenizer=tokenizer,
        temperature=sim.temperature,
        max_new_tokens=sim.max_new_tokens,
        chat=chat,
        templates=templates,
        seed=seed,
        model_name=generation.served_model_name or generation.model.path,
        show_question=sim.show_question,
        show_answer=sim.show_answer,
        verbatim=cfg.rendering == VERBATIM_STYLE,  # the policy reads the simulator's own text
        noisy_answers=cast(NoisyAnswers, sim.noisy_answers),  # checked by the recipe
    )
