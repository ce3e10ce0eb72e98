"""`simsearch train` at a sampling temperature other than 1, on CPU.

The world of `test_train.py` (a tiny policy that searches once, then answers), rolled out with the
in-process HFEngine in float32 at T = 0.6. The engine reports the raw (T = 1) log-probs of the
tokens it drew; the test also records, at each draw, log softmax(logits / 0.6) of the same
generation logits, which is what the token was really sampled from. The trainer's old and
reference log-probs must equal those, and its current log-probs must start equal to the old ones.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

import simsearch.generation.hf as hf
import simsearch.policy.step as step_module
import simsearch.policy.update as update_module
from simsearch.commands import train
from simsearch.errors import RecipeError
from simsearch.types import SamplingParams
from tests.commands import test_train
from tests.commands.test_train import _recipe

# The module-scoped fixture of test_train.py: QA files, a corpus, a tiny policy that searches.
world = test_train.world

T = 0.6


def _record(monkeypatch: pytest.MonkeyPatch, name: str) -> list[tuple[tuple[Any, ...], Any]]:
    """Wraps `train.<name>`, recording (args, result) of every call."""
    calls: list[tuple[tuple[Any, ...], Any]] = []
    homes = [m for m in (train, update_module, step_module) if hasattr(m, name)]  # where train's steps call it
    real = getattr(homes[0], name)

    def recording(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        calls.append((args + tuple(kwargs.values()), out))  # keyword arguments last, in order
        return out

    for home in homes:
        monkeypatch.setattr(home, name, recording)
    return calls


def test_old_reference_and_current_logprobs_are_those_of_the_sampling_distribution(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (token, raw log-prob the engine reports) -> log-prob at T of the same draw. The engine
    # computes the raw value with these very operations, so the floats match bit for bit.
    sampled: dict[tuple[int, float], float] = {}
    real_sample_next = hf.sample_next

    def recording_sample_next(logits: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        assert kwargs["temperature"] == T
        tokens = real_sample_next(logits, **kwargs)
        raw = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1).tolist()
        tempered = torch.log_softmax(logits / T, dim=-1).gather(-1, tokens[:, None]).squeeze(-1).tolist()
        sampled.update(((t, r), p) for t, r, p in zip(tokens.tolist(), raw, tempered))
        return tokens

    rollouts: list[Any] = []
    real_rollout = step_module.generate_trajectories

    def reporting_rollout(*args: Any, sampling: SamplingParams, **kwargs: Any) -> Any:
        rollouts.append(real_rollout(*args, sampling=replace(sampling, logprobs=True), **kwargs))
        return rollouts[-1]

    monkeypatch.setattr(hf, "sample_next", recording_sample_next)
    monkeypatch.setattr(step_module, "generate_trajectories", reporting_rollout)
    logprobs = _record(monkeypatch, "logprobs_in_micro_batches")
    losses = _record(monkeypatch, "actor_micro_loss")
    # Two epochs: the batch is reused, so old log-probs are computed; kl_coef > 0: a reference.
    recipe = _recipe(world, tmp_path / "run", steps=1, **{"sampling.temperature": T, "algorithm.ppo_epochs": 2})
    train.main(recipe)

    (result,) = rollouts
    (_, ref_logp), (_, old_logp) = logprobs  # the reference pass comes first
    expected = torch.zeros_like(old_logp)
    raw = torch.zeros_like(old_logp)
    for b, trajectory in enumerate(result.trajectories):
        columns = zip(trajectory.response_ids, trajectory.logprobs, trajectory.loss_mask)
        for j, (token, lp, trained) in enumerate(columns):
            if trained:
                expected[b, j] = sampled[(token, lp)]
                raw[b, j] = lp
    mask = torch.zeros_like(old_logp, dtype=torch.bool)
    for b, trajectory in enumerate(result.trajectories):
        mask[b, : len(trajectory.loss_mask)] = torch.tensor(trajectory.loss_mask, dtype=torch.bool)
    assert int(mask.sum()) > 20
    assert float((expected - raw)[mask].abs().max()) > 0.05  # T = 0.6 is far from the raw distribution
    assert float((old_logp - expected)[mask].abs().max()) < 1e-4
    assert float((ref_logp - expected)[mask].abs().max()) < 1e-4  # the reference is the initial policy

    # The update's own log-probs and entropy are tempered too: before the first optimizer step the
    # ratio to the old log-probs is 1 everywhere (approx_kl 0, nothing clipped).
    (args, (_, stats)) = losses[0]
    assert args[7] == T  # actor_micro_loss(..., denominators, temperature=, token_sum_normalizer=)
    assert abs(stats["approx_kl"]) < 1e-5 and stats["clipfrac"] == 0.0


def test_greedy_sampling_is_refused_for_training(world: Path, tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"sampling.temperature=0 samples greedily.*> 0"):
        _recipe(world, tmp_path / "run", **{"sampling.temperature": 0})
