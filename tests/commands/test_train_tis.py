"""`simsearch train` with truncated importance sampling (`algorithm.tis_cap`), on CPU.

The world of `test_train.py` (a tiny policy that searches once, then answers), rolled out with
the in-process HFEngine in float32: its log-probs are the trainer's up to kernel rounding, so
TIS must leave the run as it was. Then the engine's reported log-probs are shifted by hand on
known tokens, which fixes every weight the trainer must compute and apply.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

import simsearch.factory.train as rl_module
import simsearch.policy.step as step_module
import simsearch.policy.update as update_module
from simsearch.commands import train
from simsearch.errors import RecipeError
from simsearch.generation.hf import HFEngine
from simsearch.training.runlog import read_metrics
from simsearch.types import Completion, SamplingParams
from tests.commands import test_train
from tests.commands.test_train import _finite_losses, _recipe, _weights

# The module-scoped fixture of test_train.py: QA files, a corpus, a tiny policy that searches.
world = test_train.world

LOG4 = math.log(4.0)


def _record(monkeypatch: pytest.MonkeyPatch, name: str) -> list[tuple[tuple[Any, ...], dict[str, Any], Any]]:
    """Wraps `train.<name>`, recording (args, kwargs, result) of every call."""
    calls: list[tuple[tuple[Any, ...], dict[str, Any], Any]] = []
    homes = [m for m in (train, update_module, step_module) if hasattr(m, name)]  # where train's steps call it
    real = getattr(homes[0], name)

    def recording(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        calls.append((args, kwargs, out))
        return out

    for home in homes:
        monkeypatch.setattr(home, name, recording)
    return calls


def _mask_runs(mask: list[int]) -> list[list[int]]:
    """Column indices of each run of 1s: one run per generated turn (inserted text separates them)."""
    runs: list[list[int]] = []
    for j, m in enumerate(mask):
        if m and runs and runs[-1][-1] == j - 1:
            runs[-1].append(j)
        elif m:
            runs.append([j])
    return runs


@pytest.fixture(scope="module")
def plain_run(world: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    run = tmp_path_factory.mktemp("tis_off") / "run"
    train.main(_recipe(world, run))
    return read_metrics(run), run


def test_tis_cap_defaults_off_and_rejects_caps_below_one(world: Path, tmp_path: Path) -> None:
    assert _recipe(world, tmp_path / "a").algorithm.tis_cap == 0.0
    assert _recipe(world, tmp_path / "b", **{"algorithm.tis_cap": 1}).algorithm.tis_cap == 1.0
    for bad in ("0.5", "-2", "nan"):
        with pytest.raises(RecipeError, match=rf"algorithm\.tis_cap={bad}.* must be 0 .*or >= 1"):
            _recipe(world, tmp_path / "c", **{"algorithm.tis_cap": bad})


def test_off_path_logs_no_weights(plain_run: tuple[list[dict], Path]) -> None:
    rows, _ = plain_run
    assert [r["step"] for r in rows] == [1, 2]
    assert not any(k.startswith("offpolicy/") for r in rows for k in r)


def test_float32_hf_rollouts_give_weights_of_one_and_the_same_run(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plain_run: tuple[list[dict], Path]
) -> None:
    tis = _record(monkeypatch, "truncated_is_weights")
    run = tmp_path / "run"
    train.main(_recipe(world, run, **{"algorithm.tis_cap": 2}))
    rows = read_metrics(run)
    plain, plain_dir = plain_run

    assert len(tis) == 2  # once per step
    for (trainer_logp, rollout_logp, cap, mask), _, (weights, _) in tis:
        valid = mask.bool()
        assert cap == 2 and int(valid.sum()) > 0
        # Aligned: a column off would compare different tokens' log-probs (gaps of ~1 nat).
        assert float((trainer_logp - rollout_logp)[valid].abs().max()) < 1e-4
        assert float((weights[valid] - 1).abs().max()) < 1e-4
        assert bool((weights[~valid] == 0).all())
    for row, ref in zip(rows, plain):
        assert row["offpolicy/truncated_frac"] == 0.0
        assert abs(row["offpolicy/weight_mean"] - 1.0) < 1e-5
        assert abs(row["offpolicy/mismatch_k1"]) < 1e-5
        assert row["reward/mean"] == ref["reward/mean"]  # the same rollouts
        for key in ("losses/policy", "losses/kl", "losses/entropy", "optim/grad_norm"):
            assert row[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-7), key
    trained = _weights(run / "checkpoints" / "step_0000002" / "model")
    reference = _weights(plain_dir / "checkpoints" / "step_0000002" / "model")
    start = _weights(world / "policy")
    gap = sum(float((trained[k] - reference[k]).norm() ** 2) for k in reference) ** 0.5
    moved = sum(float((reference[k] - start[k]).norm() ** 2) for k in reference) ** 0.5
    assert gap < 1e-3 * moved  # Adam steps of ~lr per parameter: the two runs took the same ones


def test_shifted_rollout_logprobs_give_capped_and_shrunk_weights(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine reports the first token of every turn 4x less likely than it was (ratio 4, capped
    at 2) and the second 4x more likely (ratio 1/4); every other token keeps ratio 1."""
    lengths: list[int] = []  # tokens of every completion the engine returned

    class ShiftedEngine(HFEngine):
        def generate(self, prompts: Any, params: SamplingParams) -> list[Completion]:
            assert params.logprobs  # tis_cap > 0 asks for them
            out = []
            for c in super().generate(prompts, params):
                shift = [-LOG4, LOG4][: len(c.token_ids)] + [0.0] * max(len(c.token_ids) - 2, 0)
                out.append(replace(c, logprobs=[lp + s for lp, s in zip(c.logprobs, shift)]))
                lengths.append(len(c.token_ids))
            return out

    monkeypatch.setattr(rl_module, "HFEngine", ShiftedEngine)
    tis = _record(monkeypatch, "truncated_is_weights")
    estimator = _record(monkeypatch, "token_advantages")
    losses = _record(monkeypatch, "actor_micro_loss")
    run = tmp_path / "run"
    train.main(_recipe(world, run, **{"algorithm.tis_cap": 2, "steps": 1}))
    (row,) = read_metrics(run)
    assert _finite_losses(row)

    # Every completion's tokens are trained on (nothing is cut at max_context_tokens=256), so the
    # counts over the engine's completions are those over the loss mask:
    # N tokens, n0 first tokens (weight 2), n1 second tokens (weight 1/4), N - n0 - n1 at 1.
    total, n0, n1 = sum(lengths), len(lengths), sum(n >= 2 for n in lengths)
    ((args, _, (weights, _)),) = tis
    mask = args[3]
    assert int(mask.sum()) == total
    assert row["offpolicy/truncated_frac"] == pytest.approx(n0 / total, abs=1e-6)
    assert row["offpolicy/weight_mean"] == pytest.approx((2 * n0 + 0.25 * n1 + total - n0 - n1) / total, abs=1e-5)
    assert row["offpolicy/mismatch_k1"] == pytest.approx(LOG4 * (n1 - n0) / total, abs=1e-5)

    # Per row, each generated turn (run of trained columns) starts with weight 2 (exactly: the
    # cap), then 1/4, then 1s; inserted tokens and padding have weight 0.
    turns = 0
    for b in range(mask.shape[0]):
        expected = torch.zeros(mask.shape[1])
        for run_cols in _mask_runs(mask[b].tolist()):
            expected[run_cols] = 1.0
            expected[run_cols[0]] = 2.0
            if len(run_cols) > 1:
                expected[run_cols[1]] = 0.25
            turns += 1
        assert torch.allclose(weights[b], expected, rtol=1e-4, atol=0), b
        assert float(weights[b].max()) == 2.0 or not mask[b].any()
    assert turns == n0 > mask.shape[0]  # some rows have two turns

    # The update trains on the estimator's advantages times these weights, row by row.
    ((est_args, _, (advantages, _, _)),) = estimator
    batch = est_args[2]
    weighted = advantages * weights.cpu()
    by_row = {
        tuple(batch.input_ids[b][batch.attention_mask[b].bool()].tolist()): weighted[b] for b in range(batch.size)
    }
    checked = 0
    for (_, micro, micro_adv, *_), _, _ in losses:
        for i in range(micro.size):
            key = tuple(micro.input_ids[i][micro.attention_mask[i].bool()].tolist())
            assert torch.equal(micro_adv[i], by_row[key][: micro.response_width])
            checked += 1
    assert checked > 0 and any(float(a.abs().max()) > 0 for (_, _, a, *_), _, _ in losses)
