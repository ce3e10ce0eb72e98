"""Checkpoints are atomic, pruned, and restore trainer state and RNG exactly."""

import random
from pathlib import Path

import pytest
import torch

from simsearch.training.checkpoint import (
    checkpoint_dir,
    latest_checkpoint,
    load_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


class FakeModel:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def save_pretrained(self, path: Path, safe_serialization: bool = True) -> None:
        path.mkdir(parents=True)
        (path / "model.safetensors").write_text("weights")
        if self.fail:
            raise KeyboardInterrupt  # a kill in the middle of the write


class FakeTokenizer:
    def save_pretrained(self, path: Path) -> None:
        (path / "tokenizer.json").write_text("{}")


def test_latest_is_the_highest_finished_step_and_old_ones_are_pruned(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model=FakeModel(), tokenizer=FakeTokenizer(), state={"x": step}, keep_last=2)
    assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 3)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_0000002", "step_0000003"]
    assert load_state(latest_checkpoint(tmp_path)) == {"x": 3, "step": 3}


def test_a_write_killed_midway_leaves_the_previous_checkpoint_latest(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 1, model=FakeModel(), tokenizer=FakeTokenizer(), state={})
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, model=FakeModel(fail=True), tokenizer=FakeTokenizer(), state={})
    assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 1)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_0000001"]


def test_rng_state_round_trips_through_a_weights_only_load(tmp_path: Path) -> None:
    random.seed(5)
    torch.manual_seed(5)
    save_checkpoint(tmp_path, 1, model=FakeModel(), tokenizer=FakeTokenizer(), state={"rng": rng_state()})
    expected = (random.random(), torch.rand(3))
    random.seed(99)
    torch.manual_seed(99)
    set_rng_state(load_state(latest_checkpoint(tmp_path))["rng"])
    again = (random.random(), torch.rand(3))
    assert again[0] == expected[0] and torch.equal(again[1], expected[1])
