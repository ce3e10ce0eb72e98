"""`simsearch train` two steps on CPU with GSPO, over-turn masking and DAPO's overlong shaping.

The world of `test_train.py`: a tiny policy that searches once, then answers red or blue. Each
test records what the loop hands the library (the rewards' inputs, the update's batch, the
policy loss's tensors) and recomputes by hand what the option must have done with it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

import simsearch.policy.actor_loss as actor_loss_module
import simsearch.policy.step as step_module
from simsearch.commands import train
from simsearch.generation.hf import HFEngine
from simsearch.policy.advantages import grpo_advantages
from simsearch.training.checkpoint import latest_checkpoint
from simsearch.training.runlog import read_metrics
from simsearch.types import OVER_TURN, UNFINISHED, Completion
from tests.commands import test_train
from tests.commands.test_train import _finite_losses, _recipe, _weights
from tests.toy_world import SEARCH_TURN

# The module-scoped fixture of test_train.py: QA files, a corpus, a tiny policy that searches.
world = test_train.world


def _record(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[tuple[tuple[Any, ...], Any]]:
    """Wraps `module.<name>`, recording (args, result) of every call."""
    calls: list[tuple[tuple[Any, ...], Any]] = []
    real = getattr(module, name)

    def recording(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        calls.append((args, out))
        return out

    monkeypatch.setattr(module, name, recording)
    return calls


def _trained_two_steps(run: Path, rows: list[dict], initial: dict[str, torch.Tensor]) -> None:
    assert [r["step"] for r in rows] == [1, 2]
    assert all(_finite_losses(r) for r in rows)
    checkpoint = latest_checkpoint(run)
    assert checkpoint is not None and checkpoint.name == "step_0000002"
    final = _weights(checkpoint / "model")
    assert any(not torch.equal(initial[k], final[k]) for k in initial), "no parameter moved"


def test_gspo_clips_one_ratio_per_sequence(world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 2 minibatches of 4 rows per step: the second is trained after the first moved the weights,
    # so its ratios are not 1 and the sequence ratio differs from the token ratios.
    calls = _record(monkeypatch, actor_loss_module, "policy_loss")
    run = tmp_path / "run"
    recipe = _recipe(world, run, **{"algorithm.ratio_level": "sequence", "algorithm.minibatch_size": 4,
                                     "algorithm.kl_coef": 0.0})  # fmt: skip
    train.main(recipe)
    _trained_two_steps(run, read_metrics(run), _weights(world / "policy"))
    moved = 0
    for args, (_, stats) in calls:
        logp, old, _, mask = (a.detach().double() for a in args[:4])
        assert args[4].ratio_level == "sequence"  # the ratio level reaches the loss
        valid = mask.bool()
        # s_i = exp(mean over the row's trained tokens of logp - old), the same at each of its tokens
        seq = torch.stack([torch.exp((logp[i][valid[i]] - old[i][valid[i]]).mean()) for i in range(len(mask))])
        rows = valid.any(dim=-1)
        assert float(stats["ratio_max"]) == pytest.approx(float(seq[rows].max()), abs=1e-5)
        assert float(stats["ratio_min"]) == pytest.approx(float(seq[rows].min()), abs=1e-5)
        tokens = (seq.unsqueeze(-1) * valid)[valid]
        assert float(stats["ratio_mean"]) == pytest.approx(float(tokens.mean()), abs=1e-5)
        moved += float(seq[rows].max() - seq[rows].min()) > 1e-4
    assert moved > 0  # some minibatch was off-policy, with sequence ratios that differ


def _answers_become_over_budget_searches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every second completion that answers searches instead: in the final turn that is an over-budget
    search, so its trajectory finishes "max_turns" without an answer."""
    real = HFEngine.generate

    def generate(self: HFEngine, prompts: list[list[int]], params: Any) -> list[Completion]:
        out = real(self, prompts, params)
        ids = self.tokenizer.encode(SEARCH_TURN, add_special_tokens=False)
        for i, completion in enumerate(out):
            if i % 2 and "<answer>" in completion.text:
                out[i] = Completion(token_ids=ids, text=SEARCH_TURN, finish_reason="stop", stop="</search>")
        return out

    monkeypatch.setattr(HFEngine, "generate", generate)


def test_mask_unfinished_leaves_unfinished_trajectories_out_of_the_loss_only(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _answers_become_over_budget_searches(monkeypatch)
    scored_calls = _record(monkeypatch, step_module, "step_rewards")
    updates = _record(monkeypatch, train, "update")
    run = tmp_path / "run"
    train.main(_recipe(world, run, **{"algorithm.mask_unfinished": "true", "algorithm.kl_coef": 0.0}))
    rows = read_metrics(run)
    _trained_two_steps(run, rows, _weights(world / "policy"))
    masked_total = 0
    for (scored_args, (scored, _)), (update_args, _), logged in zip(scored_calls, updates, rows, strict=True):
        trajectories = scored_args[1]
        batch, trained = update_args[3].to("cpu"), update_args[4].cpu()
        unfinished = torch.tensor([t.finish in UNFINISHED for t in trajectories])
        assert logged["rollout/unfinished_share"] == pytest.approx(float(unfinished.float().mean()))
        unfinished = torch.tensor([t.finish in OVER_TURN for t in trajectories])  # give-ups are trained on
        masked_total += int(unfinished.sum())
        for b, t in enumerate(trajectories):
            expected = [0] * len(t.loss_mask) if unfinished[b] else t.loss_mask
            assert batch.loss_mask[b, : len(t.loss_mask)].tolist() == expected
        assert not trained[unfinished].any()  # no advantage where nothing is trained
        # GRPO's group statistics still count the masked rows' rewards (Mini-o3)
        rewards = torch.tensor(scored.total)
        advantages, _ = grpo_advantages(rewards, batch.group_ids)
        kept = batch.loss_mask.bool()
        torch.testing.assert_close(trained[kept], advantages.unsqueeze(-1).expand_as(trained)[kept])
    assert 0 < masked_total < 16  # both kinds were in the two steps' 16 trajectories


def test_overlong_shaping_penalizes_trajectories_near_the_context_limit(
    world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _record(monkeypatch, step_module, "step_rewards")
    run = tmp_path / "run"
    # L_max = rollout.max_context_tokens = 256, buffer 220: the penalty starts past 36 tokens,
    # so every trajectory (its prompt alone is longer) pays (36 - L) / 220 x 0.5.
    train.main(_recipe(world, run, **{"reward.overlong_buffer": 220, "reward.overlong_penalty": 0.5}))
    rows = read_metrics(run)
    _trained_two_steps(run, rows, _weights(world / "policy"))
    for (args, (scored, unshaped)), logged in zip(calls, rows, strict=True):
        trajectories = args[1]
        # A trajectory the context cut counts as L_max (the full penalty).
        lengths = [256 if t.finish == "context" else len(t.prompt_ids) + len(t.response_ids) for t in trajectories]
        penalties = [max(0.5 * (256 - 220 - n) / 220, -0.5) if n > 36 else 0.0 for n in lengths]
        assert all(p < 0 for p in penalties)
        f1 = scored.components["f1"]
        assert scored.total == pytest.approx([r + p for r, p in zip(f1, penalties)], abs=1e-12)
        assert unshaped == f1  # what dynamic sampling would judge flatness on
        assert logged["reward/overlong"] == pytest.approx(sum(penalties) / len(penalties), abs=1e-9)
        assert logged["reward/mean"] == pytest.approx((sum(f1) + sum(penalties)) / len(f1), abs=1e-9)
        assert logged["reward/f1"] == pytest.approx(sum(f1) / len(f1), abs=1e-9)
        assert math.isfinite(logged["reward/overlong_share"])
