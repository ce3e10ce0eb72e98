"""The search sections of a recipe: which engine answers searches, the simulator's own section, the judge.

`SearchConfig` is declared here rather than beside the retrievers because it nests `SimulatorConfig`,
whose checks read this package's `PRESETS`, and `retrieval` sits below `simulator`. The names of the
engine kinds it picks from are `retrieval.recipe.SEARCH_KINDS`.
"""

from __future__ import annotations

from dataclasses import dataclass

from simsearch.checks import check_choice, check_positive, setting
from simsearch.data.rendering import RENDER_STYLES, VERBATIM_STYLE
from simsearch.errors import RecipeError
from simsearch.generation.recipe import GenerationConfig, SamplingConfig
from simsearch.retrieval.recipe import SEARCH_KINDS
from simsearch.simulator.engine import NOISY_ANSWERS
from simsearch.simulator.prompts import PRESETS


def check_shows(name: str, shown: bool, preset: str) -> None:
    """Refuses hiding the question or the answer (`shown` false) from a preset that always shows both."""
    if not shown and PRESETS[preset].always_shows_context:
        raise RecipeError(
            f"{name}=false: preset={preset} always shows the question and the answer; use preset=simsearch or custom"
        )


@dataclass
class SimulatorConfig:
    """An LLM that plays search engine (ZeroSearch)."""

    preset: str = setting("simsearch", "a name in simulator.prompts.PRESETS")
    useful_template: str = setting("", "presets that need templates (custom): {query} {question} {answers} {top_k}")
    noisy_template: str = setting("", "preset=custom: the noisy counterpart")
    generation: GenerationConfig = setting(default_factory=GenerationConfig, help="the simulator LLM and its engine")
    chat: bool = setting(False, "hf: send prompts through the simulator's chat template (openai: generation.chat)")
    temperature: float = setting(0.8, "ZeroSearch samples the simulator at 0.8")
    max_new_tokens: int = setting(600, "ZeroSearch's max_tokens for the simulator")
    show_question: bool = setting(
        True,
        "false: the prompt leaves out the question (simsearch, simsearch-brief, custom)",
    )
    show_answer: bool = setting(True, "false: not told the answer, it writes what it learned of the world (idem)")
    noisy_answers: str = setting(
        "keep",
        "keep: noisy documents as written (ZeroSearch) | redact: every gold answer in them replaced, so noise never "
        "shows the answer (simulator.engine.redact_answers); training only, where requests carry gold answers",
    )

    def check(self, key: str) -> None:
        check_choice(f"{key}.preset", self.preset, tuple(PRESETS))
        check_shows(f"{key}.show_question", self.show_question, self.preset)
        check_shows(f"{key}.show_answer", self.show_answer, self.preset)
        check_choice(f"{key}.noisy_answers", self.noisy_answers, NOISY_ANSWERS)
        if PRESETS[self.preset].needs_templates and not (self.useful_template and self.noisy_template):
            raise RecipeError(f"{key}.preset={self.preset} needs both {key}.useful_template and {key}.noisy_template")
        self.generation.check(f"{key}.generation")
        SamplingConfig.check_temperature(f"{key}.temperature", self.temperature)
        check_positive(f"{key}.max_new_tokens", self.max_new_tokens)
        if PRESETS[self.preset].needs_chat and not (self.chat or self.generation.chat):
            raise RecipeError(
                f"{key}.preset=zerosearch is sent through the simulator's chat template: set "
                f"{key}.chat=true (hf) or {key}.generation.chat=true (openai)"
            )


@dataclass
class SearchConfig:
    """A search engine: a real retriever, the simulator, or none (self-search)."""

    kind: str = setting("bm25", "a name in retrieval.recipe.SEARCH_KINDS (self: self-search, no engine)")
    top_k: int = setting(3, "documents per search")
    corpus: str = setting("", "bm25/dense/random: corpus JSONL ({id, contents} or {id, title, text})")
    index_dir: str = setting("", "bm25/dense: where the index is saved; built on first use when empty")
    embedding_model: str = setting("", 'dense: sentence-transformers model; "" = embedded all-MiniLM-L6-v2')
    query_prefix: str = setting("", 'dense: e.g. "query: " for e5 models')
    passage_prefix: str = setting("", 'dense: e.g. "passage: " for e5 models')
    use_faiss: bool = setting(False, "dense: FAISS flat inner product instead of numpy (needs [faiss])")
    url: str = setting("", "http: a Search-R1 /retrieve endpoint; serper/serpapi: override the API URL")
    api_key_env: str = setting("", 'serper/serpapi: variable with the key ("" = their default); http: bearer token')
    timeout_s: float = setting(30.0, "http/web: per-request timeout")
    max_retries: int = setting(3, "http/web: bounded retries before a clear error")
    backoff_s: float = setting(1.0, "http/web: first backoff, doubled each retry")
    cache: str = setting("", 'SQLite file caching results across runs ("" = no cache)')
    rendering: str = setting("search-r1", "how the policy reads documents: data.rendering.RENDER_STYLES (docs there)")
    simulator: SimulatorConfig = setting(default_factory=SimulatorConfig, help="kind=simulator")
    price_per_1k_queries: float | None = setting(
        None,
        "$ per 1,000 queries sent (cache hits are free); null = the kind's documented default "
        "(retrieval.accounting.QUERY_PRICES: 0 for local engines, unknown where none is documented).",
    )
    gpu_hour_price: float | None = setting(
        None,
        "simulator: $ per hour of the GPUs serving it (all of them); null = unknown",
    )

    def check(self, key: str) -> None:
        check_choice(f"{key}.kind", self.kind, SEARCH_KINDS)
        check_positive(f"{key}.top_k", self.top_k)
        for name in ("price_per_1k_queries", "gpu_hour_price"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise RecipeError(f"{key}.{name}={value} must be >= 0 (or null: unknown)")
        check_choice(f"{key}.rendering", self.rendering, RENDER_STYLES)
        if self.rendering == VERBATIM_STYLE and self.kind != "simulator":
            raise RecipeError(
                f"{key}.rendering={VERBATIM_STYLE} shows the simulator's own text and needs {key}.kind=simulator; "
                f"for {self.kind} results use search-r1, or zerosearch-google for serpapi/serper"
            )
        if self.kind in ("bm25", "dense", "random", "answerless", "oracle") and not self.corpus:
            raise RecipeError(f"{key}.kind={self.kind} needs {key}.corpus (a JSONL file of passages)")
        if self.kind == "http" and not self.url:
            raise RecipeError(f"{key}.kind=http needs {key}.url, e.g. http://127.0.0.1:8000/retrieve")
        if self.kind == "simulator":
            self.simulator.check(f"{key}.simulator")


@dataclass
class JudgeConfig:
    """Labels a retrieved document set useful or noisy."""

    kind: str = setting("rule", "rule: a normalized gold answer is contained | llm: ask a model")
    generation: GenerationConfig | None = setting(None, "kind=llm")

    def check(self, key: str) -> None:
        check_choice(f"{key}.kind", self.kind, ("rule", "llm"))
        if self.kind == "llm" and self.generation is None:
            raise RecipeError(f"{key}.kind=llm needs {key}.generation (the judge model)")
        if self.generation is not None:
            self.generation.check(f"{key}.generation")
