"""The per-step logic of `simsearch train` (`policy.step`) against hand-computed values."""

from __future__ import annotations

import contextlib
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import simsearch.policy.infogain as infogain
import simsearch.policy.step as step_module
from simsearch.config import TrainRecipe
from simsearch.policy.collate import collate_trajectories
from simsearch.policy.recipe import AlgorithmConfig
from simsearch.policy.rollout import RolloutResult
from simsearch.policy.step import sample_step, step_batch, step_rewards
from simsearch.types import QAExample, Trajectory, TrajectoryFinish
from tests.policy.test_infogain import PAD, THREE_TURNS, CountingLM, FakeTokenizer
from tests.policy.test_infogain import _trajectory as _igpo_trajectory

REAL_DISTINCT = infogain.distinct


def _trajectory(prompt: int, response: int, finish: TrajectoryFinish, answer: str) -> Trajectory:
    text = f"<answer> {answer} </answer>" if finish == "answer" else "<search> q </search>"
    return Trajectory(
        prompt_id=0, example=QAExample("q0", "Where?", ["paris"]), prompt_ids=[1] * prompt,
        response_ids=[2] * response, loss_mask=[1] * response, turns=[], response_text=text,
        answer=answer if finish == "answer" else None, num_searches=0, num_invalid=0, finish=finish,
    )  # fmt: skip


def test_a_trajectory_the_context_cut_gets_the_full_overlong_penalty() -> None:
    recipe = TrainRecipe(run_dir="unused")
    recipe.rollout.max_context_tokens = 100
    recipe.reward.overlong_buffer, recipe.reward.overlong_penalty = 20, 0.5
    rows = [
        _trajectory(30, 40, "answer", "paris"),  # L = 70 <= 80: no penalty; f1 1
        _trajectory(30, 60, "answer", "paris"),  # L = 90: 0.5 x (100 - 20 - 90) / 20 = -0.25
        # Cut with 10 tokens to spare (an observation did not fit): L counts as L_max = 100, -0.5,
        # not 0.5 x (80 - 90) / 20 = -0.25 as its 90 tokens alone would give.
        _trajectory(30, 60, "context", ""),
        _trajectory(30, 20, "max_turns", ""),  # L = 50: unfinished, but short: no penalty
    ]
    scored, unshaped = step_rewards(recipe, rows)
    assert scored.components["f1"] == unshaped == [1.0, 1.0, 0.0, 0.0]
    assert scored.total == pytest.approx([1.0, 0.75, -0.5, 0.0], abs=1e-12)
    assert scored.stats["reward/overlong"] == pytest.approx(-0.75 / 4, abs=1e-12)
    assert scored.stats["reward/overlong_share"] == 0.5


@pytest.mark.parametrize(("mask_unfinished", "mask_gave_up", "kept"), [
    (False, False, [1, 1, 1, 1]),  # no masking
    (True, False, [1, 0, 1, 0]),  # the default: over-turn rows out, the give-up trained on
    (True, True, [1, 0, 0, 0]),  # give-ups out too
])  # fmt: skip
def test_step_batch_masks_what_the_recipe_asks(mask_unfinished: bool, mask_gave_up: bool, kept: list[int]) -> None:
    recipe = TrainRecipe(run_dir="unused")
    recipe.algorithm.mask_unfinished, recipe.algorithm.mask_gave_up = mask_unfinished, mask_gave_up
    rows = [_trajectory(2, 2, finish, "") for finish in ("answer", "max_turns", "gave_up", "context")]
    assert step_batch(recipe.algorithm, rows, pad_id=0).loss_mask.tolist() == [[k, k] for k in kept]


def test_dynamic_sampling_judges_flatness_before_overlong_shaping() -> None:
    # One prompt a step, two rollouts, two rounds at most; L_max 100, buffer 20, penalty 1.
    # Round 0: both right (f1 1, 1), L = 50 and 90: shaped 1 and 1 - 0.5 = 0.5 differ, but the
    # group is flat on the reward itself, so round 1 runs: right and wrong (1, 0), L = 50: kept.
    recipe = TrainRecipe(run_dir="unused", prompts_per_step=1)
    recipe.rollout.group_size, recipe.rollout.max_context_tokens = 2, 100
    recipe.reward.overlong_buffer = 20
    recipe.algorithm.dynamic_sampling, recipe.algorithm.max_sampling_rounds = True, 2
    rounds = [
        [_trajectory(30, 20, "answer", "paris"), _trajectory(30, 60, "answer", "paris")],
        [_trajectory(30, 20, "answer", "paris"), _trajectory(30, 20, "answer", "rome")],
    ]
    data = [QAExample(str(i), "Where?", ["paris"]) for i in range(2)]

    def rollout(examples: list[QAExample], i: int) -> RolloutResult:
        return RolloutResult(rounds[i], {"perf/prompt_tokens": 60.0, "perf/decoded_tokens": 40.0}, {})

    sample = sample_step(recipe, rollout, data, 0, slice(0, 1), 1, 0)
    assert sample.metrics.pop("time/reward_s") >= 0
    assert sample.metrics == {"sampling/flat_share": 1.0, "sampling/rounds": 2.0, "sampling/prompts": 2.0,
                              "sampling/groups": 1.0}  # fmt: skip
    assert sample.prompts == 2
    assert [t.answer for t in sample.result.trajectories] == ["paris", "rome"]
    assert sample.scored.total == [1.0, 0.0]


def test_scoring_is_timed_apart_from_the_rollout(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two rounds (the first flat), each scored in 0.05 s or more: time/reward_s >= 0.1.
    recipe = TrainRecipe(run_dir="unused", prompts_per_step=1)
    recipe.rollout.group_size = 2
    recipe.algorithm.dynamic_sampling, recipe.algorithm.max_sampling_rounds = True, 2
    real_step_rewards = step_module.step_rewards

    def slow_rewards(*args: Any) -> Any:
        time.sleep(0.05)
        return real_step_rewards(*args)

    monkeypatch.setattr(step_module, "step_rewards", slow_rewards)
    rows = [_trajectory(30, 20, "answer", "rome")] * 2  # f1 0, 0: flat, so both rounds run
    data = [QAExample(str(i), "Where?", ["paris"]) for i in range(2)]
    rollout_result = RolloutResult(rows, {"perf/prompt_tokens": 60.0, "perf/decoded_tokens": 40.0}, {})
    sample = sample_step(recipe, lambda examples, i: rollout_result, data, 0, slice(0, 1), 1, 0)
    assert sample.metrics["sampling/rounds"] == 2.0
    assert 0.1 <= sample.metrics["time/reward_s"] < 5.0


def _igpo_on_fakes(monkeypatch: pytest.MonkeyPatch, world: int) -> tuple[Any, int, list[int]]:
    """IGPO's advantages of one group on the fake LM of `tests.policy.test_infogain`, the learner faked as
    a ZeRO-3 process among `world` (another process needs 5 forward passes); (advantages, passes, dedupes)."""
    dedupes: list[int] = []

    def counting_distinct(queries: Any) -> Any:
        dedupes.append(len(queries))
        return REAL_DISTINCT(queries)

    monkeypatch.setattr(infogain, "distinct", counting_distinct)
    monkeypatch.setattr(step_module, "distinct", counting_distinct)
    monkeypatch.setattr(step_module, "all_reduce_max", lambda value, world: torch.maximum(value, torch.tensor([5])))
    # 3 + 3 + 2 queries, 3 distinct: the group shares the prompt alone and the first turn
    group = [THREE_TURNS, THREE_TURNS, _igpo_trajectory(THREE_TURNS.response_ids[:5], THREE_TURNS.loss_mask[:5])]
    model = CountingLM([0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    learner = SimpleNamespace(
        actor=SimpleNamespace(zero3=True, engine=model), world=world, device="cpu",
        autocast_context=contextlib.nullcontext,
    )  # fmt: skip
    settings = SimpleNamespace(micro_batch_size=1, temperature=1.0)
    alg = AlgorithmConfig(estimator="igpo")
    batch = collate_trajectories(group, PAD)
    result = RolloutResult(group, {}, {})
    advantages, _, _ = step_module._information_gain_advantages(
        alg, learner, settings, [1.0, 0.0, 1.0], batch, result, FakeTokenizer()  # type: ignore[arg-type]
    )  # fmt: skip
    return advantages, model.calls, dedupes


def test_igpo_under_zero3_dedupes_the_prefixes_once(monkeypatch: pytest.MonkeyPatch) -> None:
    alone, alone_calls, alone_dedupes = _igpo_on_fakes(monkeypatch, world=1)
    synced, synced_calls, synced_dedupes = _igpo_on_fakes(monkeypatch, world=2)
    assert alone_dedupes == synced_dedupes == [8]  # one dedupe of the 8 queries, on either path
    assert alone_calls == 3  # one pass per distinct measurement at micro-batch 1
    assert synced_calls == 5  # ZeRO-3: as many passes as the busiest process; the extra 2 change nothing
    torch.testing.assert_close(synced, alone, rtol=0.0, atol=0.0)
