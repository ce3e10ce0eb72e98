"""The wiring of `simsearch train`: the curriculum's noise reaches the engine, resumes restore state.

The policy is `tests.scripted.ScriptedAgent` (its turns depend on no float) and every engine
built is recorded, so each test asserts what the search engine was asked, step by step, against
the public schedule functions: a p_noise that never reaches search, an ignored granularity, or a
curriculum or RNG state lost on resume all fail here, whatever the CPU.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

import simsearch.commands.train as train
from simsearch.curriculum.schedules import make_schedule
from simsearch.policy import step as steps
from simsearch.training.runlog import read_metrics
from tests import scripted
from tests.commands import test_train
from tests.commands.test_train import _recipe

world = test_train.world  # the toy world: 16 items, red or blue, a corpus that states each

TOP_K = 3
WIRING = {"search.top_k": TOP_K, "sampling.max_new_tokens": 32, "rollout.max_obs_tokens": 128}
"""Three documents a search, so a per-document draw can differ from a per-call one."""

CURVES: dict[str, dict[str, Any]] = {
    "exponential": {"p_start": 0.0, "p_end": 1.0, "total_steps": 2},
    "linear": {"p_start": 0.0, "p_end": 1.0, "total_steps": 2},
    "cosine": {"p_start": 0.0, "p_end": 1.0, "total_steps": 2},
    "step": {"p_start": 0.0, "milestones": [1, 2], "values": [0.5, 1.0]},
}
"""Each kind from p = 0 at step 0 through a middle value at step 1 to p = 1 at step 2."""


def _curriculum(kind: str, params: dict[str, Any]) -> dict[str, object]:
    def value(v: Any) -> object:
        return f"[{','.join(map(str, v))}]" if isinstance(v, list) else v

    return {"curriculum.kind": kind, **{f"curriculum.{k}": value(v) for k, v in params.items()}}


@pytest.mark.parametrize("granularity", ["call", "document"])
@pytest.mark.parametrize("kind", CURVES)
def test_each_search_gets_the_noise_the_schedule_gives_its_step(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, granularity: str
) -> None:
    log = scripted.install(monkeypatch)
    settings = {**WIRING, **_curriculum(kind, CURVES[kind]), "curriculum.granularity": granularity}
    train.main(_recipe(world, tmp_path / "run", steps=3, **settings))

    schedule = make_schedule(kind, **CURVES[kind])
    rows = read_metrics(tmp_path / "run")
    assert log.built == ["bm25"]
    assert [r["curriculum/p_noise"] for r in rows] == [schedule(s) for s in range(3)]
    assert schedule(0) == 0.0 and 0.0 < schedule(1) < 1.0 and schedule(2) == 1.0
    for step, row in enumerate(rows):
        noisy = [request.num_noisy for request in log.calls(step)]
        assert len(noisy) == row["search/search/searches"] > 0, step
        assert all(r.top_k == TOP_K for r in log.calls(step))
        assert row["search/noisy_share"] == sum(noisy) / (len(noisy) * TOP_K), step
        if step == 0:
            assert set(noisy) == {0}, "p_noise is 0 at step 0: no search may be noisy"
        if step == 2:
            assert set(noisy) == {TOP_K}, "p_noise is 1 at step 2: every document must be noisy"
    middle = {request.num_noisy for request in log.calls(1)}
    if granularity == "call":  # ZeroSearch: a call is all noisy or all useful
        assert middle == {0, TOP_K}, middle
    else:  # one draw per document: some call mixes both (p in (0, 1), many calls)
        assert middle & {1, TOP_K - 1}, middle


def test_a_constant_schedule_noises_every_search_from_the_first_step(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = scripted.install(monkeypatch)
    train.main(_recipe(world, tmp_path / "run", steps=2, **WIRING, **_curriculum("constant", {"p_start": 1.0})))
    assert [r["curriculum/p_noise"] for r in read_metrics(tmp_path / "run")] == [1.0, 1.0]
    assert {r.num_noisy for step in (0, 1) for r in log.calls(step)} == {TOP_K}


ADAPTIVE = {"p_start": 0.0, "p_min": 0.0, "p_max": 1.0, "delta": 0.25, "window": 1, "target_reward": 0.0,
            "collapse_reward": -1.0}  # fmt: skip
"""An adaptive schedule that raises p by 0.25 after every step (any mean reward >= 0 passes the target)."""


def test_the_adaptive_schedule_moves_p_and_the_searches_follow(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = scripted.install(monkeypatch)
    train.main(_recipe(world, tmp_path / "run", steps=4, **WIRING, **_curriculum("adaptive", ADAPTIVE)))
    assert [r["curriculum/p_noise"] for r in read_metrics(tmp_path / "run")] == [0.0, 0.25, 0.5, 0.75]
    assert {r.num_noisy for r in log.calls(0)} == {0}
    assert {r.num_noisy for r in log.calls(3)} >= {TOP_K}, "p = 0.75: some call must be noisy"


def _global_draws(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float]]:
    """Makes each rollout round draw once from torch's and Python's global generators; the draws.

    Nothing in a step draws from the global state today; this stands in for code that would, so
    a resume that forgot to restore the RNG states shows.
    """
    draws: list[tuple[float, float]] = []
    rollout_round = steps.rollout_round

    def drawing(*args: Any, **kwargs: Any) -> Any:
        draws.append((float(torch.rand(())), random.random()))
        return rollout_round(*args, **kwargs)

    monkeypatch.setattr(steps, "rollout_round", drawing)
    return draws


@pytest.fixture
def adaptive_uninterrupted(world: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], list]:
    """Four steps of the adaptive schedule in one go: the metrics rows and the global draws."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        scripted.install(monkeypatch)
        draws = _global_draws(monkeypatch)
        run = tmp_path_factory.mktemp("uninterrupted") / "run"
        train.main(_recipe(world, run, steps=4, save_every=2, **WIRING, **_curriculum("adaptive", ADAPTIVE)))
    return read_metrics(run), draws


def test_a_resumed_run_continues_the_adaptive_schedule_and_the_random_state(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, adaptive_uninterrupted: tuple[list[dict], list]
) -> None:
    rows, draws = adaptive_uninterrupted
    scripted.install(monkeypatch)
    resumed_draws = _global_draws(monkeypatch)
    settings = {"save_every": 2, **WIRING, **_curriculum("adaptive", ADAPTIVE)}
    train.main(_recipe(world, tmp_path / "run", steps=2, **settings))
    train.main(_recipe(world, tmp_path / "run", steps=4, **settings))

    resumed = read_metrics(tmp_path / "run")
    assert [r["curriculum/p_noise"] for r in rows] == [0.0, 0.25, 0.5, 0.75]
    assert [r["curriculum/p_noise"] for r in resumed] == [0.0, 0.25, 0.5, 0.75], "the schedule's state was lost"
    assert [r["search/noisy_share"] for r in resumed] == [r["search/noisy_share"] for r in rows]
    assert [r["data/position"] for r in resumed] == [r["data/position"] for r in rows]
    assert len(draws) == len(resumed_draws) == 4
    assert resumed_draws[2:] == draws[2:], "the global RNG states were not restored on resume"


@pytest.mark.parametrize("kind", ["bm25", "empty", "random", "answerless"])
def test_the_engine_in_the_loop_is_the_one_the_recipe_names(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    log = scripted.install(monkeypatch)
    train.main(_recipe(world, tmp_path / "run", steps=1, **WIRING, **{"search.kind": kind}))
    assert log.built == [kind]
    rows = read_metrics(tmp_path / "run")
    assert len(log.calls(0)) == rows[0]["search/search/searches"] > 0
    assert all(r.query.startswith("item ") and r.query.endswith(" color") for r in log.calls(0))
