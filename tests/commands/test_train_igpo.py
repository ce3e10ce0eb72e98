"""`simsearch train` with IGPO end to end on CPU: two steps, two search turns allowed.

Reuses `test_train.py`'s tiny world (a policy taught to search, then answer red or blue).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

import simsearch.commands.train as train
import simsearch.policy.step as step_module
from simsearch.policy.infogain import turn_starts
from simsearch.training.checkpoint import latest_checkpoint
from simsearch.training.runlog import read_metrics
from tests.commands.test_train import _finite_losses, _recipe, _weights, world  # noqa: F401  (world: a fixture)


def test_igpo_trains_two_steps_on_its_turn_rewards(world: Path, tmp_path: Path, monkeypatch) -> None:  # noqa: F811
    measured: list[tuple[int, torch.Tensor]] = []
    real_gold_queries, real_gold_probabilities = step_module.gold_queries, step_module.gold_probabilities
    expected_queries: list[int] = []
    real_distinct, distinct_calls = step_module.distinct, list[tuple[int, int]]()

    def recording_queries(trajectories, tokenizer, fill=False):
        # one measurement per turn start of every trajectory with two turns or more
        expected_queries.append(sum(len(s) for t in trajectories if len(s := turn_starts(t.loss_mask)) > 1))
        return real_gold_queries(trajectories, tokenizer, fill)

    def recording_probabilities(model, queries, **kwargs):
        probabilities = real_gold_probabilities(model, queries, **kwargs)
        measured.append((len(queries), probabilities))
        return probabilities

    def counting_distinct(queries):
        unique, index = real_distinct(queries)
        distinct_calls.append((len(queries), len(unique)))
        return unique, index

    monkeypatch.setattr(step_module, "gold_queries", recording_queries)
    monkeypatch.setattr(step_module, "gold_probabilities", recording_probabilities)
    monkeypatch.setattr(step_module, "distinct", counting_distinct)
    run = tmp_path / "run"
    train.main(_recipe(world, run, **{"algorithm.estimator": "igpo", "rollout.max_turns": 2}))

    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(_finite_losses(r) for r in rows)
    assert all(r["time/infogain_s"] > 0 for r in rows)
    assert rows[0]["advantages/turns_mean"] > 1.5  # the policy searches: most trajectories have two turns or more
    assert math.isfinite(rows[0]["advantages/gain_mean"])
    # each step dedupes its queries once and measures only the distinct ones (a group shares its prompt)
    assert [n for n, _ in distinct_calls] == expected_queries and expected_queries[0] > 0
    assert [n for n, _ in measured] == [u for _, u in distinct_calls] and measured[0][0] < expected_queries[0]
    assert all(bool(((p > 0) & (p <= 1)).all()) for _, p in measured)
    checkpoint = latest_checkpoint(run)
    assert checkpoint is not None
    trained, start = _weights(checkpoint / "model"), _weights(world / "policy")
    assert any(not torch.equal(trained[k], start[k]) for k in start), "no parameter moved"
