"""What a run needs besides its paths, checked before any model loads: each failure one `RecipeError`.

In order: the backends a recipe names are installed (vLLM, FAISS, Weights & Biases), the devices
it names exist, API keys it reads from the environment are set, an index agrees with the corpus it
is opened over, hub models are in the local cache or the hub answers (one probe, no retries, so
that no run compiles kernels or retries downloads first), and every served endpoint answers (a
search server's `/health`, an OpenAI-compatible server's `/v1/models`). `cli.run` calls
`check_machine`, then `preflight.check_paths`, then `check_inputs`; `simsearch COMMAND RECIPE --check`
stops there.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from simsearch.commands.preflight import recipe_paths
from simsearch.config import CollectRecipe, EvalRecipe, FinetuneRecipe, ServeRecipe, TrainRecipe
from simsearch.errors import DataError, RecipeError
from simsearch.generation.recipe import GenerationConfig, ModelConfig
from simsearch.simulator.recipe import SearchConfig

PROBE_TIMEOUT_S = 5.0
"""Seconds one reachability probe may take (hub, servers): a probe is never retried."""
WEB_KEY_ENV = {"serper": "SERPER_API_KEY", "serpapi": "SERPAPI_API_KEY"}
"""The environment variable each web engine reads its key from when `api_key_env` is empty."""
OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


@dataclass(frozen=True)
class Backend:
    """An optional package a recipe setting needs."""

    module: str  # what `import` names
    install: str  # the pip line that provides it


VLLM = Backend("vllm", "pip install 'simsearch[vllm]' on a CUDA machine")
FAISS = Backend("faiss", "pip install 'simsearch[faiss]' (or faiss-cpu)")
WANDB = Backend("wandb", "pip install 'simsearch[wandb]'")


def check_machine(recipe: Any) -> None:
    """Refuses, with one `RecipeError` naming the key and the fix, a recipe this machine cannot run.

    What it checks: the backends the recipe names are installed, its devices exist, its API keys are set.
    """
    generations = generation_sections(recipe)
    searches = search_sections(recipe)
    _check_backends(recipe, generations, searches)
    _check_devices(recipe, generations)
    _check_keys(generations, searches)


def check_inputs(recipe: Any) -> None:
    """Refuses, with one `RecipeError` naming the key and the fix, inputs the run could not open.

    What it checks: an index agrees with its corpus, a hub model is cached or the hub answers, every
    server answers. Call it after `preflight.check_paths` (a missing local path is named there).
    """
    generations = generation_sections(recipe)
    for key, cfg in search_sections(recipe):
        _check_index(key, cfg)
    _check_hub(recipe)
    for key, gen in generations:
        if gen.kind == "openai":
            _check_served_models(key, gen)
    for key, cfg in search_sections(recipe):
        if cfg.kind == "http":
            _check_search_server(key, cfg)


def generation_sections(recipe: Any) -> list[tuple[str, GenerationConfig]]:
    """(key, section) for every generation engine the recipe builds: policy, simulators, judge."""
    out: list[tuple[str, GenerationConfig]] = []
    if isinstance(recipe, TrainRecipe | CollectRecipe | EvalRecipe):
        out.append(("policy", recipe.policy))
    if isinstance(recipe, CollectRecipe) and recipe.judge.generation is not None:
        out.append(("judge.generation", recipe.judge.generation))
    for key, cfg in search_sections(recipe):
        if cfg.kind == "simulator":
            out.append((f"{key}.simulator.generation", cfg.simulator.generation))
    return out


def search_sections(recipe: Any) -> list[tuple[str, SearchConfig]]:
    """(key, section) for every search engine the recipe builds."""
    out: list[tuple[str, SearchConfig]] = []
    if isinstance(recipe, TrainRecipe | CollectRecipe | ServeRecipe):
        out.append(("search", recipe.search))
    if isinstance(recipe, TrainRecipe) and recipe.val_search is not None:
        out.append(("val_search", recipe.val_search))
    if isinstance(recipe, EvalRecipe):
        out += [(f"engines.{name}", cfg) for name, cfg in recipe.engines.items()]
    return out


# --------------------------------------------------------------------------- backends, devices, keys


def installed(module: str) -> bool:
    """Whether `module` can be imported here (found, not imported)."""
    return importlib.util.find_spec(module) is not None


def _check_backends(
    recipe: Any, generations: list[tuple[str, GenerationConfig]], searches: list[tuple[str, SearchConfig]]
) -> None:
    needs = [(f"{key}.kind=vllm", VLLM, f"or set {key}.kind=hf (transformers, any device)")
             for key, gen in generations if gen.kind == "vllm"]  # fmt: skip
    needs += [(f"{key}.use_faiss=true", FAISS, f"or set {key}.use_faiss=false (numpy's search, exact too)")
              for key, cfg in searches if cfg.kind == "dense" and cfg.use_faiss]  # fmt: skip
    if isinstance(recipe, TrainRecipe) and recipe.wandb_project:
        needs.append((f"wandb_project={recipe.wandb_project!r}", WANDB, "or set wandb_project=''"))
    for setting, backend, other in needs:
        if not installed(backend.module):
            raise RecipeError(
                f"{setting} needs {backend.module}, which is not installed here: {backend.install}, {other}"
            )


def _models(recipe: Any, generations: list[tuple[str, GenerationConfig]]) -> list[tuple[str, ModelConfig]]:
    out = [(f"{key}.model", gen.model) for key, gen in generations if gen.kind != "openai"]
    return out + ([("model", recipe.model)] if isinstance(recipe, FinetuneRecipe) else [])


def _check_devices(recipe: Any, generations: list[tuple[str, GenerationConfig]]) -> None:
    for key, model in _models(recipe, generations):
        device = model.device
        if not device.startswith("cuda"):
            continue
        import torch  # only for a recipe that names a GPU

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(device.partition(":")[2] or 0) if device.partition(":")[2].isdigit() else 0
        if index >= count:
            have = f"{count} CUDA device(s)" if count else "no CUDA device (torch.cuda.is_available() is false)"
            raise RecipeError(
                f"{key}.device={device!r}: this machine has {have}; set {key}.device=cpu (slow beyond tiny "
                "models), or run on a machine with the GPU"
            )


def _check_keys(generations: list[tuple[str, GenerationConfig]], searches: list[tuple[str, SearchConfig]]) -> None:
    variables = [(f"{key}.api_key_env", cfg.api_key_env or WEB_KEY_ENV[cfg.kind], f"{cfg.kind}'s API key")
                 for key, cfg in searches if cfg.kind in WEB_KEY_ENV]  # fmt: skip
    variables += [(f"{key}.api_key_env", gen.api_key_env, "the server's API key")
                  for key, gen in generations if gen.kind == "openai" and gen.api_key_env]  # fmt: skip
    for key, variable, what in variables:
        if not os.environ.get(variable):
            raise RecipeError(
                f"{key}: environment variable {variable} is not set; export {what} in it (keys are never read "
                f"from recipes), or name another variable with {key}="
            )


# --------------------------------------------------------------------------- indexes


def _check_index(key: str, cfg: SearchConfig) -> None:
    """An index saved in `index_dir` must have been built from `corpus` (its fingerprint)."""
    if cfg.kind not in ("bm25", "dense") or not cfg.index_dir:
        return
    from simsearch.retrieval.base import check_index_corpus

    try:
        check_index_corpus(Path(cfg.index_dir), cfg.corpus)
    except DataError as err:
        raise RecipeError(f"{key}.index_dir={cfg.index_dir!r}: {err}") from None


# --------------------------------------------------------------------------- the hub


def _check_hub(recipe: Any) -> None:
    """Hub names (model paths that are no local folder) must be cached, or the hub must answer."""
    for key, path, kind in recipe_paths(recipe):
        if kind != "model" or Path(path).expanduser().exists() or _hub_cached(path):
            continue
        offline = [name for name in OFFLINE_ENV if os.environ.get(name, "").lower() in ("1", "true", "yes", "on")]
        reason = f"{offline[0]}={os.environ[offline[0]]}" if offline else _unreachable(_hub_url())
        if reason:
            raise RecipeError(
                f"{key}={path!r} is a hub name that is not in the local cache, and the hub cannot be reached "
                f"({reason}); download it where there is a network (huggingface-cli download {path}) and "
                f"set {key} to its folder, or copy the cache (HF_HOME) here"
            )


def _hub_url() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def _hub_cached(name: str) -> bool:
    """Whether the hub cache holds a snapshot of `name` (a model, an adapter or a sentence encoder)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return any(
            isinstance(try_to_load_from_cache(name, filename), str)
            for filename in ("config.json", "adapter_config.json")
        )
    except ValueError:  # not a valid repository id: the loader names it
        return True


def _unreachable(url: str) -> str:
    """'' when a TCP connection to `url`'s host opens within PROBE_TIMEOUT_S, else why not."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=PROBE_TIMEOUT_S):
            return ""
    except OSError as err:
        return f"{parts.hostname}:{port}: {err.strerror or type(err).__name__}"


# --------------------------------------------------------------------------- served endpoints


def _answer(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any] | str:
    """(status, JSON body or None) of one GET to `url`, or why no server answered; never retried."""
    import httpx

    try:
        response = httpx.get(url, headers=headers, timeout=PROBE_TIMEOUT_S, trust_env=False)
    except httpx.HTTPError as err:
        return f"{type(err).__name__}: {str(err) or 'no answer'}"
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, None


def _check_served_models(key: str, gen: GenerationConfig) -> None:
    """Each server answers `/v1/models`, and serves `served_model_name` when it lists its models."""
    token = os.environ.get(gen.api_key_env or "", "")
    for i, base in enumerate(gen.base_urls):
        root = base.rstrip("/").removesuffix("/v1")
        answer = _answer(f"{root}/v1/models", {"Authorization": f"Bearer {token}"} if token else None)
        if isinstance(answer, str):
            raise RecipeError(
                f"{key}.base_urls[{i}]={base!r}: no server answers {root}/v1/models ({answer}); start it "
                "(vllm serve MODEL, or the recipe's command) or fix the URL"
            )
        status, body = answer
        served = [m.get("id") for m in body.get("data", [])] if status == 200 and isinstance(body, dict) else []
        if served and gen.served_model_name and gen.served_model_name not in served:
            raise RecipeError(
                f"{key}.served_model_name={gen.served_model_name!r}: {base} serves {', '.join(map(str, served))}; "
                f"set {key}.served_model_name to one of them"
            )


def _check_search_server(key: str, cfg: SearchConfig) -> None:
    """A Search-R1 `/retrieve` server answers on its host (our `/health`; any HTTP answer counts)."""
    parts = urlsplit(cfg.url)
    health = f"{parts.scheme}://{parts.netloc}/health"
    answer = _answer(health)
    if isinstance(answer, str):
        raise RecipeError(
            f"{key}.url={cfg.url!r}: no server answers {health} ({answer}); start it (simsearch serve "
            "recipes/serve/..., or Search-R1's retrieval_server.py) or fix the URL"
        )
