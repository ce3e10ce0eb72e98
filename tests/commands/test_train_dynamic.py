"""`simsearch train` with DAPO's dynamic sampling (`algorithm.dynamic_sampling`), on CPU.

The world of `test_train.py` (a tiny policy that searches once, then answers red or blue), with
the reward replaced by a rule that fixes which groups are flat whatever the policy samples: a
group is informative when its question is in `INFORMATIVE` (its first sample scores 1, the others
0) and flat otherwise (all 0). With seed 0 the data stream visits the 16 questions in the order
`STREAM`; two prompts per step, three rounds at most:

- step 1, positions 0-3: round 0 = items 10 (flat), 2; round 1 = 0, 6: three informative groups,
  the first two kept (2, 0), item 6 dropped. Rounds 2, prompts 4, flat share 1/2.
- step 2, positions 4-9: 13, 5 | 7, 1 | 8, 14 (only 8 informative): the bound stops it with one
  group. Rounds 3, prompts 6, flat share 1.
- step 3, positions 10-15: 9, 11 | 15, 12 | 4, 3, all flat: the step trains on its first round
  (9, 11), as without dynamic sampling. Rounds 3, prompts 6, groups 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import simsearch.policy.step as step_module
from simsearch.commands import train
from simsearch.errors import RecipeError
from simsearch.policy.order import stream_indices
from simsearch.policy.rewards import RewardOutput
from simsearch.policy.rollout import RolloutResult
from simsearch.policy.update import derived_seed
from simsearch.training.checkpoint import latest_checkpoint, load_state
from simsearch.training.runlog import read_metrics
from simsearch.types import QAExample, Trajectory
from tests.commands import test_train
from tests.commands.test_train import _finite_losses, _recipe, _weights
from tests.toy_world import QUESTIONS

# The module-scoped fixture of test_train.py: QA files, a corpus, a tiny policy that searches.
world = test_train.world

STREAM = [10, 2, 0, 6, 13, 5, 7, 1, 8, 14, 9, 11, 15, 12, 4, 3]
INFORMATIVE = {2, 0, 6, 8}
GROUP = 4
DYNAMIC = {
    "algorithm.dynamic_sampling": "true", "algorithm.max_sampling_rounds": 3, "rollout.group_size": GROUP,
    "curriculum.total_steps": 3, "algorithm.kl_coef": 0.001,
}  # fmt: skip
ROUNDS = [[[10, 2], [0, 6]], [[13, 5], [7, 1], [8, 14]], [[9, 11], [15, 12], [4, 3]]]  # items rolled out
TRAINED = [[2, 0], [8], [9, 11]]  # items trained on, in order


def _item(question: str) -> int:
    return next(i for i, (q, _) in enumerate(QUESTIONS) if q == question)


def _rule_score(trajectories: list[Any], weights: dict[str, float], *, normalization: str = "unicode") -> RewardOutput:
    """The reward rule above; `group_size` consecutive trajectories per question, as the rollout lays them out."""
    total = [float(_item(t.example.question) in INFORMATIVE and row % GROUP == 0) for row, t in enumerate(trajectories)]
    return RewardOutput(total, {"rule": total}, {"reward/mean": sum(total) / len(total)})


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list]]:
    """The rule as the reward; records each rollout round's items and seed, and each trained batch's items."""
    seen: dict[str, list] = {"rounds": [], "seeds": [], "trained": [], "scored": []}
    real_rollout, real_collate = step_module.generate_trajectories, step_module.collate_trajectories

    def rollout(examples: list[Any], **kwargs: Any) -> Any:
        seen["rounds"].append([_item(e.question) for e in examples])
        seen["seeds"].append(kwargs["sampling"].seed)
        return real_rollout(examples, **kwargs)

    def score(trajectories: list[Any], weights: dict[str, float], *, normalization: str = "unicode") -> RewardOutput:
        seen["scored"].append(len(trajectories))
        return _rule_score(trajectories, weights, normalization=normalization)

    def collate(trajectories: list[Any], pad_id: int, **kwargs: Any) -> Any:
        groups = sorted({t.prompt_id: _item(t.example.question) for t in trajectories}.items())
        assert [t.prompt_id for t in trajectories] == [g for g, _ in groups for _ in range(GROUP)]
        seen["trained"].append([item for _, item in groups])
        return real_collate(trajectories, pad_id, **kwargs)

    monkeypatch.setattr(step_module, "generate_trajectories", rollout)
    monkeypatch.setattr(step_module, "score_trajectories", score)
    monkeypatch.setattr(step_module, "collate_trajectories", collate)
    yield seen


def test_the_stream_is_the_one_the_docstring_computes_by_hand() -> None:
    assert stream_indices(len(QUESTIONS), 0, 16, 0) == STREAM


def test_two_keys_and_their_checks(world: Path, tmp_path: Path) -> None:
    recipe = _recipe(world, tmp_path / "a")
    assert (recipe.algorithm.dynamic_sampling, recipe.algorithm.max_sampling_rounds) == (False, 3)
    for bad in ("0", "-1"):
        with pytest.raises(RecipeError, match=rf"algorithm\.max_sampling_rounds={bad} must be >= 1"):
            _recipe(world, tmp_path / "b", **{"algorithm.max_sampling_rounds": bad})


def test_dynamic_sampling_trains_on_informative_groups(world: Path, tmp_path: Path, recorded: dict) -> None:
    run = tmp_path / "run"
    train.main(_recipe(world, run, **DYNAMIC, steps=3))

    assert recorded["rounds"] == [items for step in ROUNDS for items in step]
    assert recorded["scored"] == [2 * GROUP] * 8  # every round scored on its own, 2 prompts x 4
    assert recorded["trained"] == TRAINED
    # Round 0 draws what a step without dynamic sampling draws; later rounds draw afresh.
    assert recorded["seeds"][:2] == [derived_seed(0, "rollout", 0, 0), derived_seed(0, "rollout1", 0, 0)]
    assert len(set(recorded["seeds"])) == 8
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["sampling/rounds"] for r in rows] == [2.0, 3.0, 3.0]
    assert [r["sampling/prompts"] for r in rows] == [4.0, 6.0, 6.0]
    assert [r["sampling/groups"] for r in rows] == [2.0, 1.0, 0.0]
    assert [r["sampling/flat_share"] for r in rows] == [0.5, 1.0, 1.0]
    assert [r["data/position"] for r in rows] == [4.0, 10.0, 16.0]
    # The reward stats are the first round's: step 1's round 0 = item 10 (0, 0, 0, 0), item 2 (1, 0, 0, 0)
    assert [r["reward/mean"] for r in rows] == [pytest.approx(1 / 8, abs=1e-12), 0.0, 0.0]
    assert all(_finite_losses(r) for r in rows)
    trained, start = _weights(latest_checkpoint(run) / "model"), _weights(world / "policy")
    assert any(not (trained[k] == start[k]).all() for k in start)
    assert load_state(latest_checkpoint(run))["data_position"] == 16


def test_without_dynamic_sampling_the_flat_share_is_logged_alone(world: Path, tmp_path: Path, recorded: dict) -> None:
    run = tmp_path / "run"
    train.main(_recipe(world, run, **{**DYNAMIC, "algorithm.dynamic_sampling": "false"}, steps=1))
    assert recorded["rounds"] == [[10, 2]]
    assert recorded["trained"] == [[10, 2]]  # the flat group is trained on, as always without the option
    (row,) = read_metrics(run)
    assert row["sampling/flat_share"] == 0.5
    # The step's time: its rollout, the rewards' scoring apart from it, the rest (update, ...).
    assert row["time/reward_s"] >= 0 and 0 < row["time/rollout_s"] + row["time/reward_s"] <= row["time/step_s"]
    assert not any(k in row for k in ("sampling/rounds", "sampling/prompts", "sampling/groups"))
    assert row["data/position"] == 2.0


def test_a_resumed_run_replays_the_rounds(world: Path, tmp_path: Path, recorded: dict) -> None:
    uninterrupted = tmp_path / "uninterrupted"
    train.main(_recipe(world, uninterrupted, **DYNAMIC, steps=3))
    straight = list(recorded["rounds"])
    recorded["rounds"].clear()

    run = tmp_path / "run"
    train.main(_recipe(world, run, **DYNAMIC, steps=2, save_every=1))
    assert load_state(latest_checkpoint(run))["data_position"] == 10
    train.main(_recipe(world, run, **DYNAMIC, steps=3, save_every=1))
    assert recorded["rounds"] == straight  # the resumed step 3 starts at position 10, as the straight run's
    resumed, theirs = read_metrics(run), read_metrics(uninterrupted)
    assert [r["step"] for r in resumed] == [1, 2, 3]
    for mine, other in zip(resumed, theirs):
        for key in ("data/position", "sampling/rounds", "sampling/prompts", "losses/policy", "losses/kl"):
            assert math.isclose(mine[key], other[key], rel_tol=1e-6, abs_tol=1e-9), (mine["step"], key)


# --------------------------------------------------------------------------- several processes


def _fake_rollout(examples: list[QAExample], i: int) -> RolloutResult:
    """`GROUP` empty trajectories per question; 10 prompt and 3 decoded tokens and 0.5 s of search per round."""
    trajectories = [
        Trajectory(prompt_id=p, example=e, prompt_ids=[1], response_ids=[2], loss_mask=[1], turns=[],
                   response_text="", answer=None, num_searches=i, num_invalid=0, finish="answer")
        for p, e in enumerate(examples) for _ in range(GROUP)
    ]  # fmt: skip
    metrics = {"search/calls_per_traj": float(i), "perf/prompt_tokens": 10.0, "perf/decoded_tokens": 3.0}
    return RolloutResult(trajectories, metrics, {"time/search_s": 0.5})


def test_each_process_fills_its_share_and_all_agree(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Process 0 of 2 (4 prompts a step, 2 each); the other process, faked, ran 3 rounds and found 1 group.

    Round i covers stream positions 4i to 4i + 3 and process 0 takes the first two: items 10, 2
    (2 informative), then 13, 5 (flat), then 8, 14 (8 informative): 2 groups after its 3 rounds.
    The other process found 1: both train on 1 group (item 2); the position advances by the most
    rounds, 3 x 4 = 12 positions; 12 prompts were rolled out, 6 by each process.
    """
    data = [QAExample(str(i), q, [a]) for i, (q, a) in enumerate(QUESTIONS)]
    reduced: list[list[int]] = []

    def other_max(values: Any, world: int) -> Any:  # elementwise max with the other process's [rounds, -groups]
        reduced.append(values.tolist())
        return values.copy_(values.clamp(min=values.new_tensor([3, -1])))

    monkeypatch.setattr(step_module, "score_trajectories", _rule_score)
    monkeypatch.setattr(step_module, "all_reduce_max", other_max)
    monkeypatch.setattr(step_module, "all_reduce_sum", lambda values, world: values.add_(6))  # its 3 rounds x 2
    recipe = _recipe(world, tmp_path, **DYNAMIC, prompts_per_step=4)
    sample = step_module.sample_step(recipe, _fake_rollout, data, 0, slice(0, 2), 2, 0)

    assert reduced == [[3, -2]]  # this process: 3 rounds, 2 informative groups (items 2 and 8)
    assert sample.prompts == 12
    assert sample.metrics.pop("time/reward_s") >= 0
    assert sample.metrics == {"sampling/flat_share": 0.5, "sampling/rounds": 3.0, "sampling/prompts": 12.0,
                              "sampling/groups": 2.0}  # fmt: skip
    trained = sample.result.trajectories
    assert [_item(t.example.question) for t in trained] == [2] * GROUP
    assert [t.prompt_id for t in trained] == [0] * GROUP
    assert sample.scored.total == [1.0, 0.0, 0.0, 0.0]
    assert sample.scored.stats == {"reward/mean": 1 / 8}  # the first round's: item 10 (0, 0, 0, 0), item 2 (1, 0, 0, 0)
    # Rollout metrics of the first round; token counts and timings added over the 3 rounds.
    assert sample.result.metrics == {"search/calls_per_traj": 0.0, "perf/prompt_tokens": 30.0,
                                     "perf/decoded_tokens": 9.0}  # fmt: skip
    assert sample.result.timings == {"time/search_s": 1.5}
