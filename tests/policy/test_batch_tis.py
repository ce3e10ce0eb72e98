"""Rollout log-probs as `[B, L]` tensors aligned with the training batch (truncated IS input)."""

from __future__ import annotations

import math

import pytest
import torch

from simsearch.policy.collate import collate_rollout_logprobs, collate_trajectories
from simsearch.policy.offpolicy import truncated_is_weights
from simsearch.policy.rollout import generate_trajectories
from simsearch.types import SamplingParams, Trajectory
from tests.policy.test_batch import PAD, trajectory
from tests.policy.test_rollout import ANSWER_TURN, EXAMPLES, SEARCH_TURN, RecordingSearch, ScriptedPolicy, make_settings
from tests.policy.test_rollout import tokenizer as tokenizer  # the module-scoped fixture


def with_logprobs(t: Trajectory, logprobs: list[float] | None) -> Trajectory:
    t.logprobs = logprobs
    return t


# Row 0, two turns: generated [10, 11, 12], an inserted information block [20, 21] (logprobs
# 0.0, as the rollout writes them), generated [13, 14].
# Row 1: one generated token. Row 2: self-search, whose own information token 17 was generated
# (a real logprob) but is not trained on.
TWO_TURNS = [
    with_logprobs(
        trajectory([5, 6, 7], [10, 11, 12, 20, 21, 13, 14], [1, 1, 1, 0, 0, 1, 1]),
        [-0.5, -1.0, -1.5, 0.0, 0.0, -2.0, -0.25],
    ),
    with_logprobs(trajectory([3], [15], [1], prompt_id=1), [-3.0]),
    with_logprobs(trajectory([4, 4], [16, 17, 18], [1, 0, 1], prompt_id=2), [-0.1, -0.2, -0.3]),
]


def test_rollout_logprobs_sit_in_the_batch_response_columns() -> None:
    out = collate_rollout_logprobs(TWO_TURNS)
    batch = collate_trajectories(TWO_TURNS, PAD)
    # L = 7 (row 0). Each row's logprobs start at response column 0; padding and every token
    # outside the loss mask (row 0's inserted block, row 2's own information token) are 0.
    assert out.dtype == torch.float32
    expected = [
        [-0.5, -1.0, -1.5, 0.0, 0.0, -2.0, -0.25],
        [-3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [-0.1, 0.0, -0.3, 0.0, 0.0, 0.0, 0.0],
    ]
    assert torch.equal(out, torch.tensor(expected, dtype=torch.float32))
    assert out.shape == batch.loss_mask.shape
    # Row 0's second turn: its tokens 13, 14 are response columns 5, 6 with their own logprobs.
    assert batch.responses[0, 5:7].tolist() == [13, 14]
    assert out[0, 5:7].tolist() == [-2.0, -0.25]
    # Non-zero exactly where the batch trains (every logprob here is non-zero).
    assert torch.equal(out.ne(0), batch.loss_mask.bool())


def test_weights_touch_generated_tokens_only_in_both_turns() -> None:
    rollout = collate_rollout_logprobs(TWO_TURNS[:1])
    mask = collate_trajectories(TWO_TURNS[:1], PAD).loss_mask
    # The trainer finds the first token of each turn 4x likelier than the rollout did:
    # ratio 4, capped at 2; every other generated token agrees (weight 1); inserted tokens get 0.
    trainer = rollout.clone()
    trainer[0, 0] += math.log(4)
    trainer[0, 5] += math.log(4)
    weights, stats = truncated_is_weights(trainer, rollout, 2.0, mask)
    assert weights.tolist() == [[2.0, 1.0, 1.0, 0.0, 0.0, 2.0, 1.0]]
    assert float(stats["truncated_frac"]) == pytest.approx(2 / 5, abs=1e-7)


def test_missing_or_misaligned_logprobs_are_refused() -> None:
    no_logprobs = trajectory([5], [10, 11], [1, 1])
    with pytest.raises(ValueError, match=r"trajectory 1 has no rollout log-probs.*logprobs=True"):
        collate_rollout_logprobs([TWO_TURNS[1], no_logprobs])
    short = with_logprobs(trajectory([5], [10, 11], [1, 1]), [-1.0])
    with pytest.raises(ValueError, match="trajectory 0: 1 log-probs and 2 loss-mask entries for 2 response tokens"):
        collate_rollout_logprobs([short])
    with pytest.raises(ValueError, match="no trajectories"):
        collate_rollout_logprobs([])


def test_real_rollouts_of_one_and_two_turns_align(tokenizer) -> None:
    """Through `generate_trajectories`: question 0 searches then answers, question 1 answers at once."""

    def script(context: str, call: int, sample: int) -> str:
        return SEARCH_TURN if call == 0 and "orvale" in context else ANSWER_TURN

    # The scripted engine gives token k of every completion logprob -(k + 1) * 0.5.
    policy = ScriptedPolicy(tokenizer, script, logprob=0.5)
    result = generate_trajectories(
        EXAMPLES[:2], policy=policy, tokenizer=tokenizer, search=RecordingSearch(),
        settings=make_settings(), sampling=SamplingParams(temperature=0.0, max_new_tokens=200, logprobs=True),
    )  # fmt: skip
    two, one = result.trajectories
    assert len(two.turns) == 2 and len(one.turns) == 1
    batch = collate_trajectories(result.trajectories, tokenizer.pad_token_id)
    out = collate_rollout_logprobs(result.trajectories)

    search_ids = tokenizer.encode(SEARCH_TURN, add_special_tokens=False)
    answer_ids = tokenizer.encode(ANSWER_TURN, add_special_tokens=False)
    n1, n2 = len(search_ids), len(answer_ids)
    n_obs = len(two.response_ids) - n1 - n2
    assert n_obs > 0
    span = lambda n: [-(k + 1) * 0.5 for k in range(n)]  # noqa: E731
    width = batch.response_width
    assert width == n1 + n_obs + n2
    # Row 0: the search turn at columns [0, n1), the information block, the answer turn after it.
    assert out[0].tolist() == span(n1) + [0.0] * n_obs + span(n2)
    assert batch.responses[0, :n1].tolist() == search_ids
    assert batch.responses[0, n1 + n_obs :].tolist() == answer_ids
    # Row 1: the answer turn from column 0, then padding.
    assert out[1].tolist() == span(n2) + [0.0] * (width - n2)
    assert batch.responses[1, :n2].tolist() == answer_ids
    assert torch.equal(out.ne(0), batch.loss_mask.bool())
