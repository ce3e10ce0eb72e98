"""One declaration per setting: a field name two dataclasses of `simsearch` share has one default.

Every module of the package is imported and every dataclass it defines is read. Two classes
that declare the same field name with different defaults fail the test, unless the name is in
`DIFFERENT_SETTINGS` with the reason the two are different settings. Not settings, so skipped:
a field whose default is itself a dataclass (a recipe composing a section, which may set that
section's values for its command) and a default of None or "???" (unset, or required).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections import defaultdict

import simsearch

DIFFERENT_SETTINGS = {
    "batch_size": "generation's prompts per engine call vs finetune's examples per optimizer step",
    "eval_every": "train's validation period (0 = none) vs finetune's",
    "golden_answers": "none either way: a frozen integrations.SampleContext holds a tuple, a SearchRequest a list",
    "kind": "each section's own choice table (curriculum, generation engine, search engine, judge)",
    "kl_coef": "EstimatorInputs.kl_coef is the weight one estimator call folds into its reward (0 unless kl_in_reward)",
    "max_new_tokens": "the policy's turn, the simulator's documents, and an engine call's own default",
    "run_dir": "serve writes no run (empty) and the quickstart names its own",
    "save_every": "train's checkpoint period vs finetune's (0 = only the last)",
    "steps": "RL steps of train vs optimizer steps of finetune",
    "temperature": "the policy's sampling vs the simulator's (SamplingParams: an engine call's default)",
    "timeout_s": "a generation request vs a search request",
    "window": "the adaptive curriculum's reward average vs the health monitor's level rules",
}

UNSET = (None, "???")

NEEDS_A_TRAINER = {"simsearch.integrations.verl": "imports verl, installed only beside the venv for its own test"}
"""Modules another framework must be installed for; they declare no setting of a recipe."""


def _defaults() -> dict[str, dict[str, object]]:
    """field name -> {class: default} over every dataclass defined in `simsearch`."""
    out: dict[str, dict[str, object]] = defaultdict(dict)
    for info in pkgutil.walk_packages(simsearch.__path__, "simsearch."):
        if info.name in NEEDS_A_TRAINER:
            continue
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if not (isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__):
                continue
            for f in dataclasses.fields(obj):
                if f.default is not dataclasses.MISSING:
                    default = f.default
                elif f.default_factory is not dataclasses.MISSING:
                    default = f.default_factory()
                else:
                    continue
                if default in UNSET or dataclasses.is_dataclass(default):
                    continue
                out[f.name][f"{obj.__module__}.{obj.__qualname__}"] = default
    return out


def test_a_setting_has_one_default() -> None:
    clashes = {
        name: by_class
        for name, by_class in _defaults().items()
        if name not in DIFFERENT_SETTINGS and len({repr(v) for v in by_class.values()}) > 1
    }
    assert not clashes, f"one setting, several defaults (declare it once, or say why they differ): {clashes}"


def test_the_allowlist_names_real_clashes_only() -> None:
    defaults = _defaults()
    stale = [name for name in DIFFERENT_SETTINGS if len({repr(v) for v in defaults.get(name, {}).values()}) < 2]
    assert not stale, f"no longer declared with different defaults, drop from DIFFERENT_SETTINGS: {stale}"
