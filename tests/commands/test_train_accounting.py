"""`simsearch train` writes sampled trajectories and counts its searches (issue: viewer and cost)."""

from __future__ import annotations

import json
from pathlib import Path

from simsearch.commands import train
from simsearch.eval import view
from simsearch.training.runlog import read_metrics
from tests.commands.test_train import _recipe, world  # noqa: F401  (fixture)


def test_train_samples_trajectories_and_counts_searches(world: Path, tmp_path: Path) -> None:  # noqa: F811
    run = tmp_path / "run"
    # 3 steps x 2 prompts x group 4; samples of 3 trajectories at steps 1 and 3 (every 2, and the last).
    train.main(_recipe(world, run, steps=3, trajectory_samples=3, trajectory_every=2))

    rows = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 1, 1, 3, 3, 3]
    assert [r["sample"] for r in rows[:3]] == [0, 1, 2]  # the first group's rollouts
    assert all(r["question"] and r["golden_answers"] and "turns" in r and "reward" in r for r in rows)
    metrics = read_metrics(run)
    searches = [m["search/search/searches"] for m in metrics]
    calls = [m["search/calls_per_traj"] * 8 for m in metrics]  # 8 trajectories a step
    assert searches == calls  # the ledger counts every search the rollouts ran
    cost = json.loads((run / "cost.json").read_text())["engines"]["search"]
    assert cost["kind"] == "bm25" and cost["searches"] == sum(searches) and cost["query_cost_usd"] == 0.0
    data = view.page_data(run)
    assert data["kind"] == "train" and [i["dataset"] for i in data["items"]] == ["step 1", "step 3"]
