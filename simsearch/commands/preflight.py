"""What every command checks before any work starts: its paths, a resume against the saved recipe,
and its torch threads.

Paths are checked by recipe key before a model loads or the run directory is written; names that
look like Hugging Face Hub names pass through. A resume whose recipe computes something else than
the run's `recipe.yaml` is refused unless the recipe says `resume: force`, which records the change.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from inspect import signature
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from simsearch.config import CollectRecipe, EvalRecipe, FinetuneRecipe, ServeRecipe, TrainRecipe, save_recipe
from simsearch.curriculum.schedules import P_NOISE
from simsearch.errors import RecipeError
from simsearch.generation.recipe import GenerationConfig
from simsearch.simulator.recipe import SearchConfig

QA_SUFFIXES = (".jsonl", ".json", ".parquet")
QUICKSTART_RUN = "runs/quickstart"
QUICKSTART_HINT = f" (run `simsearch quickstart --smoke` first: it writes {QUICKSTART_RUN}/)"


def set_threads(threads: int) -> None:
    """Sets torch's intra-op threads when `threads` > 0 (0 keeps torch's default, or what a caller set)."""
    if threads > 0:
        import torch

        torch.set_num_threads(threads)


# --------------------------------------------------------------------------- paths


def check_paths(recipe: Any) -> None:
    """Checks every path the recipe names; `RecipeError` naming the key, the path and the fix."""
    for key, path, kind in recipe_paths(recipe):
        if kind == "model":
            _check_model(key, path)
        elif kind == "qa":
            _check_qa(key, path)
        elif kind == "dir":
            if not Path(path).is_dir():
                raise RecipeError(f"{key}={path!r}: no such directory{_hint(key, path)}")
        elif not Path(path).is_file():  # "file"
            raise RecipeError(f"{key}={path!r}: no such file{_hint(key, path)}")
    if isinstance(recipe, EvalRecipe):
        for i, spec in enumerate(recipe.datasets):
            _check_split(f"datasets[{i}]", spec.path, spec.split)


def recipe_paths(recipe: Any) -> list[tuple[str, str, str]]:
    """(key, path, kind) for every path a recipe names; kind is model, qa, file or dir."""
    out: list[tuple[str, str, str]] = []
    if isinstance(recipe, TrainRecipe | CollectRecipe):
        out += _generation_paths("policy", recipe.policy)
        out += _search_paths("search", recipe.search)
        out += [(f"data.train[{i}]", path, "qa") for i, path in enumerate(recipe.data.train)]
        out += [(f"data.val[{i}]", path, "qa") for i, path in enumerate(recipe.data.val)]
    if isinstance(recipe, TrainRecipe) and recipe.val_search is not None:
        out += _search_paths("val_search", recipe.val_search)
    if isinstance(recipe, CollectRecipe) and recipe.judge.generation is not None:
        out += _generation_paths("judge.generation", recipe.judge.generation)
    if isinstance(recipe, EvalRecipe):
        out += _generation_paths("policy", recipe.policy)
        for name, engine in recipe.engines.items():
            out += _search_paths(f"engines.{name}", engine)
        out += [(f"datasets[{i}].path", spec.path, "qa") for i, spec in enumerate(recipe.datasets)]
        out += [("training_run", recipe.training_run, "dir")] if recipe.training_run else []
    if isinstance(recipe, ServeRecipe):
        out += _search_paths("search", recipe.search)
    if isinstance(recipe, FinetuneRecipe):
        out += [("model.path", recipe.model.path, "model"), ("train_file", recipe.train_file, "file")]
        out += [("val_file", recipe.val_file, "file")] if recipe.val_file else []
    return out


def _generation_paths(key: str, cfg: GenerationConfig) -> list[tuple[str, str, str]]:
    out = [(f"{key}.model.path", cfg.model.path, "model")] if cfg.model.path else []
    return out + ([(f"{key}.model.adapter", cfg.model.adapter, "model")] if cfg.model.adapter else [])


def _search_paths(key: str, cfg: SearchConfig) -> list[tuple[str, str, str]]:
    out = []
    if cfg.kind in ("bm25", "dense"):
        out.append((f"{key}.corpus", cfg.corpus, "file"))
    if cfg.kind == "dense" and cfg.embedding_model:
        out.append((f"{key}.embedding_model", cfg.embedding_model, "model"))
    if cfg.kind == "simulator":
        out += _generation_paths(f"{key}.simulator.generation", cfg.simulator.generation)
    return out


def _looks_local(path: str) -> bool:
    """A path, not a hub name: absolute, relative by `.` or `~`, deeper than `org/name`, or its folder exists."""
    parent = Path(path).expanduser().parent
    return (
        Path(path).is_absolute()
        or path.startswith((".", "~"))
        or path.count("/") > 1
        or (str(parent) != "." and parent.is_dir())
    )


def _check_model(key: str, path: str) -> None:
    local = Path(path).expanduser()
    if local.exists():
        if local.is_file():
            raise RecipeError(f"{key}={path!r} is a file; give the directory written by save_pretrained")
        return
    if _looks_local(path):
        raise RecipeError(
            f"{key}={path!r}: no such directory"
            + (_hint(key, path) or "; fix the path, or give a hub name like Qwen/Qwen2.5-3B")
        )


def _check_qa(key: str, path: str) -> None:
    local = Path(path).expanduser()
    if local.is_file():
        if local.suffix not in QA_SUFFIXES:
            raise RecipeError(f"{key}={path!r}: unknown QA file type {local.suffix!r}; use {', '.join(QA_SUFFIXES)}")
        return
    if local.is_dir():
        if not key.startswith("datasets["):  # eval datasets take a split; training lists take files
            raise RecipeError(f"{key}={path!r} is a folder: name the file inside it (e.g. {path}/train.jsonl)")
        return
    if local.suffix in QA_SUFFIXES or _looks_local(path):
        raise RecipeError(f"{key}={path!r}: no such file{_hint(key, path)}")


def _check_split(key: str, path: str, split: str | None) -> None:
    local = Path(path).expanduser()
    if local.is_dir():
        if split is None:
            files = sorted(p.name for p in local.iterdir() if p.suffix in QA_SUFFIXES)
            raise RecipeError(
                f"{key}.path={path!r} is a FlashRAG folder: set {key}.split to the file to read "
                f"(it holds {', '.join(files) or 'no QA files'})"
            )
        if not any((local / f"{split}{suffix}").is_file() for suffix in QA_SUFFIXES):
            raise RecipeError(f"{key}.split={split!r}: {path} holds no {split}.jsonl, {split}.json or {split}.parquet")
    elif local.is_file() and split is not None:
        raise RecipeError(f"{key}.split={split!r}: {key}.path is a file (one split already); remove {key}.split")


def _hint(key: str, path: str) -> str:
    """What to do about a missing quickstart output: run it, or point `key` at the checkpoint it did write."""
    if not path.startswith(QUICKSTART_RUN):
        return ""
    if not Path(QUICKSTART_RUN).is_dir():
        return QUICKSTART_HINT
    parts = Path(path).parts
    if "checkpoints" in parts:  # .../checkpoints/step_N/model: another step may be there (a --smoke run's)
        at = parts.index("checkpoints")
        folder = Path(*parts[: at + 1])
        steps = sorted(p.name for p in folder.glob("step_*")) if folder.is_dir() else []
        if steps and at + 1 < len(parts):
            found = Path(folder, steps[-1], *parts[at + 2 :])
            return (
                f" ({folder} holds {', '.join(steps)}, from a `simsearch quickstart --smoke` run or another recipe: "
                f"set {key}={found}, or run `simsearch quickstart` for {parts[at + 1]})"
            )
    return f" ({QUICKSTART_RUN} holds no such output: run `simsearch quickstart` (the full run) first)"


# --------------------------------------------------------------------------- resume

TRAIN_UNCOMPUTED = (
    "run_dir", "resume", "threads", "tensorboard", "wandb_project", "save_every", "eval_every",
    "trajectory_samples", "trajectory_every", "micro_batch_size", "policy.batch_size", "search.cache",
    "data.val", "data.val_size", "val_search", "stop_grace_s",
)  # fmt: skip
"""Keys of a train recipe that do not change what is computed: a resume may change them freely."""
FINETUNE_UNCOMPUTED = ("run_dir", "resume", "threads", "save_every", "eval_every", "val_file", "stop_grace_s")
"""Keys of a simulator finetune recipe a resume may change freely."""
COLLECT_UNCOMPUTED = ("run_dir", "threads", "policy.batch_size", "search.cache")
"""Keys of a simulator collect recipe that do not change the pairs it writes."""


def resume_changes(recipe: Any, saved_file: Path, uncomputed: tuple[str, ...]) -> dict[str, tuple[Any, Any]]:
    """Dotted key -> (saved value, value now) for each key differing between `saved_file` and `recipe`.

    Paths inside each run directory compare relative to it; keys in `uncomputed` are left out; a key
    the saved recipe lacks counts only when the recipe sets it off its default.
    """
    saved = yaml.safe_load(saved_file.read_text(encoding="utf-8")) or {}
    now: dict[str, Any] = OmegaConf.to_container(OmegaConf.structured(recipe))  # type: ignore[assignment]
    defaults = dict(_flat(OmegaConf.to_container(OmegaConf.structured(type(recipe)))))
    old = dict(_flat(_inside(saved, str(saved.get("run_dir", "")))))
    new = dict(_flat(_inside(now, str(now["run_dir"]))))
    changes = {}
    for key in sorted(old.keys() | new.keys()):
        if any(key == skip or key.startswith(skip + ".") for skip in uncomputed):
            continue
        was = old[key] if key in old else defaults.get(key)  # an older recipe.yaml lacks it: the default held
        if was != new.get(key):
            changes[key] = (old.get(key), new.get(key))
    return changes


def check_resume(recipe: Any, run_dir: Path, uncomputed: tuple[str, ...]) -> dict[str, tuple[Any, Any]]:
    """The changes a forced resume applies and records ({} when nothing changed or nothing resumes).

    Raises:
        RecipeError: The recipe differs and `resume` is true, naming the keys and the two ways out.
    """
    from simsearch.training.checkpoint import latest_checkpoint  # torch: the command imports it anyway

    saved = run_dir / "recipe.yaml"
    if recipe.resume == "false" or not saved.is_file():
        return {}
    changes = resume_changes(recipe, saved, uncomputed)
    if "steps" in changes and not steps_shape_schedules(recipe):
        del changes["steps"]  # a longer (or shorter) run of the same steps: the run goes on as it was
    if not changes or latest_checkpoint(run_dir) is None:  # no checkpoint: nothing resumes
        return {}
    if recipe.resume != "force":
        raise RecipeError(
            f"{run_dir} was trained with another recipe ({saved}): {_listed(changes)}; use a new run_dir, or "
            "resume=force to apply the change from the last checkpoint on (it is recorded in recipe_changes.jsonl)"
        )
    return changes


def check_collected(recipe: CollectRecipe, run_dir: Path) -> None:
    """Refuses to overwrite pairs that `run_dir` holds from another collect recipe.

    Collect writes its pairs first and `recipe.yaml` last, so a directory with both tells what made them.

    Raises:
        RecipeError: The saved recipe differs in a key outside `COLLECT_UNCOMPUTED`, naming the keys.
    """
    saved = run_dir / "recipe.yaml"
    if not saved.is_file() or not (run_dir / "train.jsonl").is_file():
        return
    changes = resume_changes(recipe, saved, COLLECT_UNCOMPUTED)
    if changes:
        raise RecipeError(
            f"{run_dir} holds pairs collected with another recipe ({saved}): {_listed(changes)}; use a new "
            f"run_dir, or delete {run_dir} to collect there again"
        )


def steps_shape_schedules(recipe: TrainRecipe | FinetuneRecipe) -> bool:
    """Whether `steps` shapes the LR schedule or the noise curriculum, so changing it changes every step."""
    optim = recipe.optim
    if optim.schedule != "constant" or optim.warmup_ratio > 0:
        return True
    if isinstance(recipe, FinetuneRecipe):
        return False
    if recipe.algorithm.estimator == "ppo" and recipe.algorithm.critic_warmup_ratio:
        return True
    curriculum = recipe.curriculum
    curve = P_NOISE.get(curriculum.kind)
    return curriculum.total_steps == 0 and curve is not None and "total_steps" in signature(curve).parameters


def start_records(recipe: Any, run_dir: Path, step: int, changes: dict[str, tuple[Any, Any]],
                  command: str) -> dict[str, Any] | None:  # fmt: skip
    """Writes recipe.yaml and a forced resume's changes (`recipe_changes.jsonl`), and says a run resumed at
    `step` > 0; call once models have loaded.

    Returns:
        The cost earlier invocations recorded in the run directory (`accounting.read_cost`), or None.
    """
    from simsearch.retrieval.accounting import read_cost
    from simsearch.training.runlog import log_recipe_change

    save_recipe(recipe, run_dir)
    previous_cost = read_cost(run_dir)
    if changes:
        path = log_recipe_change(run_dir, step, changes)
        keys = ", ".join(changes)
        print(f"simsearch {command}: resumed at step {step} with a changed {keys} (resume=force; recorded in {path})",
              flush=True)  # fmt: skip
    elif step > 0:
        print(f"simsearch {command}: resumed from step {step} ({run_dir}; resume=false starts over)", flush=True)
    return previous_cost


def _listed(changes: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{key} ({_show(old)} -> {_show(new)})" for key, (old, new) in changes.items())


def _show(value: Any) -> str:
    return "unset" if value is None else str(value)


def _flat(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _flat(item, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), value


def _inside(value: Any, run_dir: str) -> Any:
    """`value` with every path under `run_dir` written as `<run_dir>/...`."""
    if isinstance(value, dict):
        return {key: _inside(item, run_dir) for key, item in value.items()}
    if isinstance(value, list):
        return [_inside(item, run_dir) for item in value]
    if run_dir and isinstance(value, str) and (value == run_dir or value.startswith(run_dir + os.sep)):
        return "<run_dir>" + value[len(run_dir) :]
    return value
