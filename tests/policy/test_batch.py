"""Trajectories to tensors, micro-batching, data order, advantage dispatch and the actor loss."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from simsearch.policy.actor_loss import actor_micro_loss, sequence_kl
from simsearch.policy.collate import (
    collate_trajectories,
    logprobs_in_micro_batches,
    loss_denominators,
    micro_batches,
    minibatches,
    pad_micro_batches,
    response_logits,
    rows_with_signal,
)
from simsearch.policy.critic import ValueModel, values_in_micro_batches
from simsearch.policy.losses import token_logprobs
from simsearch.policy.order import epoch_order, rank_share, stream_indices
from simsearch.policy.recipe import AlgorithmConfig
from simsearch.policy.step import token_advantages
from simsearch.types import QAExample, Trajectory

PAD = 0


def trajectory(
    prompt: list[int], response: list[int], mask: list[int], prompt_id: int = 0, searches: int = 0
) -> Trajectory:
    return Trajectory(
        prompt_id=prompt_id,
        example=QAExample(id="q", question="q?", golden_answers=["a"]),
        prompt_ids=prompt,
        response_ids=response,
        loss_mask=mask,
        turns=[],
        response_text="",
        answer=None,
        num_searches=searches,
        num_invalid=0,
        finish="answer",
    )


# Row 0: prompt [5, 6], response [7, 8, 9] with the middle token inserted (mask 0).
# Row 1: prompt [3, 4, 5], response [6] (group 1, one search).
ROWS = [trajectory([5, 6], [7, 8, 9], [1, 0, 1]), trajectory([3, 4, 5], [6], [1], prompt_id=1, searches=1)]


def test_collate_left_pads_prompts_and_right_pads_responses() -> None:
    batch = collate_trajectories(ROWS, PAD)
    # P = 3, L = 3: row 0 = pad | 5 6 | 7 8 9 ; row 1 = 3 4 5 | 6 | pad pad
    assert batch.input_ids.tolist() == [[PAD, 5, 6, 7, 8, 9], [3, 4, 5, 6, PAD, PAD]]
    assert batch.attention_mask.tolist() == [[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]
    # positions count real tokens only; right padding repeats the last one
    assert batch.position_ids.tolist() == [[0, 0, 1, 2, 3, 4], [0, 1, 2, 3, 3, 3]]
    assert batch.responses.tolist() == [[7, 8, 9], [6, PAD, PAD]]
    assert batch.loss_mask.tolist() == [[1, 0, 1], [1, 0, 0]]
    assert batch.group_ids.tolist() == [0, 1] and batch.num_searches.tolist() == [0, 1]


def test_select_trims_padding_the_selected_rows_do_not_need() -> None:
    batch = collate_trajectories(ROWS, PAD)
    row0 = batch.select(torch.tensor([0]))
    # row 0 alone: its prompt has 2 tokens, so the first (pad) column goes; its response fills L
    assert row0.input_ids.tolist() == [[5, 6, 7, 8, 9]] and row0.position_ids.tolist() == [[0, 1, 2, 3, 4]]
    row1 = batch.select(torch.tensor([1]))
    assert row1.input_ids.tolist() == [[3, 4, 5, 6]] and row1.response_width == 1
    assert row1.loss_mask.tolist() == [[1]]


def test_collate_rejects_a_mask_of_the_wrong_length() -> None:
    with pytest.raises(ValueError, match="loss_mask has 1 entries for 2 response tokens"):
        collate_trajectories([trajectory([1], [2, 3], [1])], PAD)


class PositionModel(nn.Module):
    """Logits whose every entry is the input position, honouring `logits_to_keep`."""

    def forward(self, input_ids, attention_mask, position_ids, use_cache, logits_to_keep):
        batch, width = input_ids.shape
        logits = torch.arange(width, dtype=torch.float32).view(1, width, 1).expand(batch, width, 4)
        return type("Out", (), {"logits": logits[:, -logits_to_keep:]})()


def test_response_logits_are_those_of_the_positions_before_each_response_token() -> None:
    batch = collate_trajectories(ROWS, PAD)
    logits = response_logits(PositionModel(), batch)
    # P = 3: response token j sits at column 3 + j and is predicted at column 2 + j
    assert logits.shape == (2, 3, 4)
    assert logits[0, :, 0].tolist() == [2.0, 3.0, 4.0]


def tiny_lm() -> nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


def test_log_probs_do_not_depend_on_padding_or_micro_batching() -> None:
    model = tiny_lm()
    batch = collate_trajectories(ROWS, PAD)
    together = logprobs_in_micro_batches(model, batch, micro_batch_size=2)
    apart = logprobs_in_micro_batches(model, batch, micro_batch_size=1)
    # Row 0 alone, unpadded, by hand: log softmax at positions 1..3 of [5, 6, 7, 8, 9].
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[5, 6, 7, 8, 9]])).logits[:, 1:4]
    alone = token_logprobs(logits, torch.tensor([[7, 8, 9]]))[0] * torch.tensor([1.0, 0.0, 1.0])
    torch.testing.assert_close(together[0], alone, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(apart, together, rtol=1e-5, atol=1e-5)
    assert together[1, 1:].tolist() == [0.0, 0.0]  # padding gets 0
    assert together[0, 1] == 0.0  # so does the inserted token


def test_value_model_reads_the_state_before_each_response_token() -> None:
    lm = tiny_lm()
    critic = ValueModel(lm.base_model, 16)
    batch = collate_trajectories(ROWS, PAD)
    assert values_in_micro_batches(critic, batch, 2).abs().sum() == 0.0  # the head starts at 0
    with torch.no_grad():
        critic.head.bias.fill_(0.5)
    values = values_in_micro_batches(critic, batch, 2)
    assert values.tolist() == [[0.5, 0.0, 0.5], [0.5, 0.0, 0.0]]  # 0 where the loss mask is 0


def test_stream_indices_run_through_seeded_epochs_and_resume_anywhere() -> None:
    first, second = epoch_order(3, seed=7, epoch=0), epoch_order(3, seed=7, epoch=1)
    assert sorted(first) == [0, 1, 2] and sorted(second) == [0, 1, 2]
    assert stream_indices(3, 0, 6, seed=7) == first + second
    assert stream_indices(3, 4, 2, seed=7) == second[1:]  # a resume at position 4
    assert epoch_order(50, seed=7, epoch=0) != epoch_order(50, seed=8, epoch=0)


def test_rank_share_splits_prompts_evenly_or_refuses() -> None:
    assert [rank_share(8, r, 2) for r in (0, 1)] == [slice(0, 4), slice(4, 8)]
    with pytest.raises(ValueError, match="multiple of 2"):
        rank_share(7, 0, 2)


def test_minibatches_and_micro_batches() -> None:
    assert [m.tolist() for m in minibatches(4, 0, None)] == [[0, 1, 2, 3]]
    split = minibatches(4, 2, torch.Generator().manual_seed(0))
    assert len(split) == 2 and sorted(torch.cat(split).tolist()) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="must divide"):
        minibatches(6, 4, None)
    lengths = torch.tensor([5, 9, 1, 7])
    chunks = micro_batches(torch.tensor([0, 1, 2, 3]), lengths, 3)
    assert [c.tolist() for c in chunks] == [[1, 3, 0], [2]]  # longest first
    assert micro_batches(torch.tensor([], dtype=torch.long), lengths, 3) == []  # all rows skipped


def test_rows_with_signal_and_micro_batches_topped_up_with_spare_rows() -> None:
    advantages = torch.tensor([[0.0, 0.0], [0.0, -1.0], [0.0, 0.0], [2.0, 0.0]])
    assert rows_with_signal(advantages).tolist() == [False, True, False, True]
    lengths = torch.tensor([5, 9, 1, 7])
    kept = micro_batches(torch.tensor([1, 3]), lengths, 1)  # [[1], [3]]
    # Two more wanted: the spare rows 0 and 2, shortest first, one per micro-batch.
    padded = pad_micro_batches(kept, torch.tensor([0, 2]), lengths, 4)
    assert [m.tolist() for m in padded] == [[1], [3], [2], [0]]
    assert pad_micro_batches(kept, torch.tensor([0, 2]), lengths, 2) == kept
    assert [m.tolist() for m in pad_micro_batches([], torch.tensor([0, 2]), lengths, 1)] == [[2]]
    with pytest.raises(ValueError, match="5 micro-batches wanted from 2 and 2 spare rows"):
        pad_micro_batches(kept, torch.tensor([0, 2]), lengths, 5)


def test_loss_denominators_count_tokens_and_sequences() -> None:
    mask = torch.tensor([[1, 0, 1], [0, 0, 0], [1, 1, 0]])
    assert loss_denominators(mask) == (4.0, 2.0)  # 2 + 0 + 2 tokens; the empty row is no sequence


def test_sequence_estimators_with_kl_folded_into_the_reward() -> None:
    rows = [trajectory([1], [2, 3], [1, 1], prompt_id=g) for g in (0, 0, 1, 1)]
    batch = collate_trajectories(rows, PAD)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    kl = torch.tensor([[0.5, 0.5], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    advantages, returns, _ = token_advantages("dr_grpo", rewards, batch, kl=kl, kl_coef=0.5)
    # shaped rewards: 1 - 0.5 * (0.5 + 0.5) = 0.5 and 0 in group 0 -> mean 0.25, A = +-0.25;
    # group 1 is flat
    assert returns is None
    torch.testing.assert_close(advantages[:, 0], torch.tensor([0.25, -0.25, 0.0, 0.0]))
    torch.testing.assert_close(advantages[:, 1], advantages[:, 0])
    # GRPO divides by the unbiased std sqrt(2 * 0.25^2 / 1) = 0.35355 (+ 1e-6)
    advantages, _, _ = token_advantages("grpo", rewards, batch, kl=kl, kl_coef=0.5)
    expected = 0.25 / (math.sqrt(0.125) + 1e-6)
    torch.testing.assert_close(advantages[:, 0], torch.tensor([expected, -expected, 0.0, 0.0]))


def test_token_level_estimators_give_rows_without_trained_tokens_zero() -> None:
    rows = [trajectory([1], [2, 3], [1, 1]), trajectory([1], [2, 3], [0, 0]), trajectory([1], [4], [1])]
    batch = collate_trajectories(rows, PAD)
    advantages, _, _ = token_advantages("reinforce_pp", torch.tensor([1.0, 5.0, 0.0]), batch)
    assert advantages[1].tolist() == [0.0, 0.0]
    # returns over the valid tokens: [1, 1] and [0]; whitened over those 3 values: mean 2/3,
    # unbiased var 1/3 -> (1 - 2/3) / sqrt(1/3) = 0.57735 and (0 - 2/3) / sqrt(1/3) = -1.1547
    torch.testing.assert_close(advantages[0], torch.tensor([0.57735, 0.57735]), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(advantages[2, :1], torch.tensor([-1.1547]), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="needs the critic's values"):
        token_advantages("ppo", torch.tensor([1.0, 5.0, 0.0]), batch)
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        token_advantages("a2c", torch.tensor([1.0, 5.0, 0.0]), batch)


def test_on_policy_actor_loss_is_the_negative_mean_advantage_and_its_gradient() -> None:
    # One row, V = 2, uniform logits: log p = -ln 2 for each of the 3 tokens; the middle one is
    # masked. On-policy the ratio is 1, so the token-mean loss is -(A0 + A2) / 2 = -(1 - 3) / 2.
    micro = collate_trajectories([trajectory([1], [0, 1, 1], [1, 0, 1])], PAD)
    logits = torch.zeros(1, 3, 2, requires_grad=True)
    advantages = torch.tensor([[1.0, 7.0, -3.0]])
    settings, temperature = AlgorithmConfig(kl_coef=0.0), 1.0
    loss, stats = actor_micro_loss(
        logits,
        micro,
        advantages,
        None,
        None,
        settings,
        loss_denominators(micro.loss_mask),
        temperature=temperature,
        token_sum_normalizer=None,
    )
    assert float(loss.detach()) == pytest.approx(1.0)
    assert stats["entropy"] == pytest.approx(math.log(2))  # uniform over 2 tokens
    assert stats["clipfrac"] == 0.0 and stats["tokens"] == 2.0
    loss.backward()
    # d(-A logp / 2)/dz = -A/2 * (onehot - 1/2): token 0 (label 0, A=1): [-0.25, 0.25];
    # token 1 is masked: 0; token 2 (label 1, A=-3): 1.5 * [-0.5, 0.5] = [-0.75, 0.75]
    torch.testing.assert_close(logits.grad[0], torch.tensor([[-0.25, 0.25], [0.0, 0.0], [-0.75, 0.75]]))


def test_actor_loss_and_old_logprobs_use_the_sampling_temperature() -> None:
    # Logits (0, ln 9) at T = 2 are (0, ln 3): p(label 1) = 3/4, entropy H(1/4, 3/4).
    micro = collate_trajectories([trajectory([1], [1], [1])], PAD)
    logits = torch.tensor([[[0.0, math.log(9.0)]]], requires_grad=True)
    settings, temperature = AlgorithmConfig(kl_coef=0.0), 2.0
    loss, stats = actor_micro_loss(
        logits,
        micro,
        torch.tensor([[1.0]]),
        None,
        None,
        settings,
        (1.0, 1.0),
        temperature=temperature,
        token_sum_normalizer=None,
    )
    assert stats["entropy"] == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    loss.backward()
    # d(-A logp)/dz = -(onehot - p) / T = -((0, 1) - (1/4, 3/4)) / 2
    torch.testing.assert_close(logits.grad[0, 0], torch.tensor([0.125, -0.125]))

    model = tiny_lm()
    batch = collate_trajectories(ROWS, PAD)
    tempered = logprobs_in_micro_batches(model, batch, micro_batch_size=2, temperature=0.6)
    with torch.no_grad():
        row0 = model(input_ids=torch.tensor([[5, 6, 7, 8, 9]])).logits[:, 1:4]
    expected = torch.log_softmax(row0 / 0.6, dim=-1)[0, [0, 2], [7, 9]]
    torch.testing.assert_close(tempered[0, [0, 2]], expected, rtol=1e-5, atol=1e-5)
    raw = logprobs_in_micro_batches(model, batch, micro_batch_size=2)
    assert float((raw[0, [0, 2]] - tempered[0, [0, 2]]).abs().max()) > 1e-3


def test_actor_loss_adds_the_kl_term_with_its_coefficient() -> None:
    micro = collate_trajectories([trajectory([1], [0], [1])], PAD)
    logits = torch.zeros(1, 1, 2)  # log p(0) = -ln 2
    ref = torch.tensor([[math.log(0.25)]])
    settings, temperature = AlgorithmConfig(kl_coef=0.5, kl_estimator="k1"), 1.0
    loss, stats = actor_micro_loss(
        logits,
        micro,
        torch.zeros(1, 1),
        None,
        ref,
        settings,
        (1.0, 1.0),
        temperature=temperature,
        token_sum_normalizer=None,
    )
    # k1 = log p - log ref = -ln 2 + ln 4 = ln 2; loss = 0 (no advantage) + 0.5 ln 2
    assert stats["kl"] == pytest.approx(math.log(2))
    assert float(loss) == pytest.approx(0.5 * math.log(2))
    with pytest.raises(ValueError, match="needs ref_logp"):
        actor_micro_loss(
            logits,
            micro,
            torch.zeros(1, 1),
            None,
            None,
            settings,
            (1.0, 1.0),
            temperature=temperature,
            token_sum_normalizer=None,
        )


def test_sequence_kl_is_zero_at_masked_tokens() -> None:
    logp = torch.tensor([[math.log(0.5), math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.25)]])
    kl = sequence_kl(logp, ref, torch.tensor([[1, 0]]), "k3")
    # k3 with r = ref - logp = -ln 2: e^r - r - 1 = 0.5 + ln 2 - 1 = 0.19315
    torch.testing.assert_close(kl, torch.tensor([[0.5 + math.log(2) - 1.0, 0.0]]))


def test_actor_loss_subtracts_the_entropy_with_its_coefficient() -> None:
    micro = collate_trajectories([trajectory([1], [0], [1])], PAD)
    logits = torch.zeros(1, 1, 2)  # uniform over 2 tokens: H = ln 2
    settings, temperature = AlgorithmConfig(kl_coef=0.0, entropy_coef=0.01), 1.0
    loss, stats = actor_micro_loss(
        logits,
        micro,
        torch.zeros(1, 1),
        None,
        None,
        settings,
        (1.0, 1.0),
        temperature=temperature,
        token_sum_normalizer=None,
    )
    # loss = 0 (no advantage) - 0.01 ln 2; an added entropy would give +0.01 ln 2
    assert stats["entropy"] == pytest.approx(math.log(2))
    assert float(loss) == pytest.approx(-0.01 * math.log(2))
