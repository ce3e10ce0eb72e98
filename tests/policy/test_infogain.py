"""IGPO: turn boundaries, teacher-forced gold-answer probabilities, information gains, token advantages.

The fake model's logits at every position are `weight * c`, c = the INFO tokens it has attended to
so far, so the probability of the gold answer after a prefix is a closed form of the INFO tokens
in that prefix: with weight 1 at token RED and 0 elsewhere (V = 6 tokens),
p(c) = e^c / (e^c + 5).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch
from torch import nn

from simsearch.errors import RecipeError
from simsearch.models import build_tiny_model, train_tokenizer
from simsearch.policy.advantages import ESTIMATORS, EstimatorInputs, igpo_advantages
from simsearch.policy.infogain import (
    GoldQuery,
    distinct,
    forward_passes,
    gold_probabilities,
    gold_queries,
    information_gains,
    turn_index,
    turn_starts,
)
from simsearch.policy.recipe import AlgorithmConfig
from simsearch.types import QAExample, Trajectory

PAD, RED, BLUE, INFO, GEN, TAG = range(6)
VOCAB = 6
TOL = {"rtol": 0.0, "atol": 1e-6}


class CountingLM(nn.Module):
    """logits[b, i, v] = weight[v] x (INFO tokens attended to up to position i); counts its forward passes."""

    def __init__(self, weight: list[float]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor(weight))
        self.calls = 0

    def forward(self, input_ids, attention_mask, position_ids=None, use_cache=False, logits_to_keep=0):
        self.calls += 1
        seen = ((input_ids == INFO) & attention_mask.bool()).cumsum(-1).float()  # [B, T]
        logits = seen.unsqueeze(-1) * self.weight  # [B, T, V]
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)


class FakeTokenizer:
    pad_token_id = PAD
    words: ClassVar[dict[str, list[int]]] = {
        "<answer>": [TAG],
        " red": [RED],
        " blue": [BLUE],
        " red blue": [RED, BLUE],
    }

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.words[text]


def _trajectory(response: list[int], mask: list[int], gold: str = "red", prompt_id: int = 0) -> Trajectory:
    return Trajectory(
        prompt_id=prompt_id, example=QAExample("q", "question?", [gold] if gold else []), prompt_ids=[GEN, GEN],
        response_ids=response, loss_mask=mask, turns=[], response_text="", answer=None, num_searches=0,
        num_invalid=0, finish="answer",
    )  # fmt: skip


# G G I I | G I | G G: three turns starting at 0, 4 and 6; 0, 2 and 3 INFO tokens before them
THREE_TURNS = _trajectory([GEN, GEN, INFO, INFO, GEN, INFO, GEN, GEN], [1, 1, 0, 0, 1, 0, 1, 1])
ONE_TURN = _trajectory([GEN, GEN, GEN], [1, 1, 1], gold="blue", prompt_id=1)


def p_red(c: float, temperature: float = 1.0) -> float:
    return math.exp(c / temperature) / (math.exp(c / temperature) + 5)


# --------------------------------------------------------------------------- turns


def test_turns_start_at_each_generated_token_after_an_inserted_one():
    assert turn_starts([1, 1, 0, 0, 1, 0, 1, 1]) == [0, 4, 6]
    assert turn_starts([1, 1, 1]) == [0]
    assert turn_starts([1, 0, 0]) == [0]  # an observation after the last turn starts no turn
    assert turn_starts([1, 0, 1, 1, 0, 0, 1]) == [0, 2, 6]  # self-search: the policy's own information too
    assert turn_starts([]) == [0]
    index = turn_index([THREE_TURNS, ONE_TURN], width=9)
    expected = [[0, 0, 0, 0, 1, 1, 2, 2, -1], [0, 0, 0, -1, -1, -1, -1, -1, -1]]
    assert index.tolist() == expected


def test_one_query_per_turn_start_of_multi_turn_trajectories():
    queries = gold_queries([THREE_TURNS, ONE_TURN, _trajectory([GEN, INFO, GEN], [1, 0, 1], gold="")], FakeTokenizer())
    prompt = [GEN, GEN]
    assert queries == [
        GoldQuery(0, 0, prompt, [TAG, RED], [0, 1]),  # the prompt alone
        GoldQuery(0, 1, [*prompt, GEN, GEN, INFO, INFO], [TAG, RED], [0, 1]),  # after turn 0's information
        GoldQuery(0, 2, [*prompt, GEN, GEN, INFO, INFO, GEN, INFO], [TAG, RED], [0, 1]),  # after turn 1's
    ]  # a single turn has no gain, an empty gold answer nothing to measure
    assert gold_queries([ONE_TURN], FakeTokenizer()) == []
    assert gold_queries([ONE_TURN], FakeTokenizer(), fill=True) == [GoldQuery(0, 0, prompt, [TAG], [0])]


# --------------------------------------------------------------------------- probabilities


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_gold_probabilities_by_teacher_forcing(temperature: float):
    queries = gold_queries([THREE_TURNS], FakeTokenizer())
    model = CountingLM([0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    probs = gold_probabilities(model, queries, pad_id=PAD, device="cpu", micro_batch_size=2, temperature=temperature)
    # T = 1: 1/6 = 0.166667, e^2/(e^2 + 5) = 0.596418, e^3/(e^3 + 5) = 0.800682
    # T = 2: 1/6, e/(e + 5) = 0.352187, e^1.5/(e^1.5 + 5) = 0.472668
    expected = {1.0: [0.166667, 0.596418, 0.800682], 2.0: [0.166667, 0.352187, 0.472668]}[temperature]
    torch.testing.assert_close(probs, torch.tensor(expected), rtol=0, atol=1e-6)
    torch.testing.assert_close(probs, torch.tensor([p_red(c, temperature) for c in (0, 2, 3)]), **TOL)
    assert model.calls == 2  # ceil(3 queries / 2)


def test_the_probability_is_the_geometric_mean_over_the_answer_tokens():
    # weight 1 at RED and 0.5 at BLUE: after c INFO tokens, p(RED) = e^c / Z, p(BLUE) = e^(c/2) / Z,
    # Z = e^c + e^(c/2) + 4; the answer " red blue" scores exp((log p(RED) + log p(BLUE)) / 2)
    trajectory = _trajectory([GEN, INFO, INFO, GEN], [1, 0, 0, 1], gold="red blue")
    queries = gold_queries([trajectory], FakeTokenizer())
    model = CountingLM([0.0, 1.0, 0.5, 0.0, 0.0, 0.0])
    probs = gold_probabilities(model, queries, pad_id=PAD, device="cpu", micro_batch_size=4)

    def geometric(c: float) -> float:
        z = math.exp(c) + math.exp(c / 2) + 4
        return math.sqrt(math.exp(c) / z * math.exp(c / 2) / z)

    # c = 0: 1/6 each: 0.166667; c = 2: sqrt(7.389056 / 14.107338 x 2.718282 / 14.107338) = 0.317685
    torch.testing.assert_close(probs, torch.tensor([0.166667, 0.317685]), rtol=0, atol=1e-6)
    torch.testing.assert_close(probs, torch.tensor([geometric(0), geometric(2)]), **TOL)


def test_batched_probabilities_equal_one_by_one_with_a_real_model():
    tokenizer = train_tokenizer(["<answer> red </answer> item color is blue"] * 20, vocab_size=300)
    model = build_tiny_model(tokenizer, hidden=32, layers=2, heads=2, kv_heads=1, ffn=64, seed=0).eval()
    ids = tokenizer.encode("item color is blue item color", add_special_tokens=False)
    two_turns = _trajectory(ids[:3] + ids[:4] + ids[:2], [1] * 3 + [0] * 4 + [1] * 2)
    three_mask = [1] + [0] * 5 + [1] + [0] * 3 + [1] * 2
    three_turns = _trajectory(ids[:1] + ids[:5] + ids[:1] + ids[:3] + ids[:2], three_mask, "blue", prompt_id=1)
    trajectories = [two_turns, three_turns]
    queries = gold_queries(trajectories, tokenizer)
    assert len(queries) == 2 + 3
    batched = gold_probabilities(model, queries, pad_id=tokenizer.pad_token_id, device="cpu", micro_batch_size=5)
    pad = tokenizer.pad_token_id
    alone = torch.cat([gold_probabilities(model, [q], pad_id=pad, device="cpu", micro_batch_size=1) for q in queries])
    torch.testing.assert_close(batched, alone, rtol=0, atol=1e-6)
    assert bool(((batched > 0) & (batched < 1)).all())


def test_extra_passes_run_and_change_nothing():
    queries = gold_queries([THREE_TURNS], FakeTokenizer())
    model = CountingLM([0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    probs = gold_probabilities(model, queries, pad_id=PAD, device="cpu", micro_batch_size=2, passes=5)
    assert model.calls == 5  # ZeRO-3: as many forward passes as the busiest process
    torch.testing.assert_close(probs, torch.tensor([p_red(c) for c in (0, 2, 3)]), **TOL)
    with pytest.raises(ValueError, match="fill=True"):
        gold_probabilities(model, [], pad_id=PAD, device="cpu", micro_batch_size=2, passes=1)


def test_a_shared_prefix_is_measured_once():
    # A group's trajectories share the prompt alone, and these two their first turn as well.
    group = [THREE_TURNS, THREE_TURNS, _trajectory(THREE_TURNS.response_ids[:5], THREE_TURNS.loss_mask[:5])]
    queries = gold_queries(group, FakeTokenizer())
    unique, index = distinct(queries)
    assert len(queries) == 3 + 3 + 2 and len(unique) == 3
    assert index == [0, 1, 2, 0, 1, 2, 0, 1]
    model = CountingLM([0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    probs = gold_probabilities(model, unique, pad_id=PAD, device="cpu", micro_batch_size=1)
    assert model.calls == 3  # one forward pass per distinct measurement
    torch.testing.assert_close(probs, torch.tensor([p_red(c) for c in (0, 2, 3)]), **TOL)
    assert forward_passes(3, 2) == 2 and forward_passes(4, 2) == 2 and forward_passes(0, 2) == 0


# --------------------------------------------------------------------------- gains and advantages


def test_information_gains_are_differences_of_consecutive_probabilities():
    trajectories = [THREE_TURNS, ONE_TURN]
    queries = gold_queries(trajectories, FakeTokenizer())
    turns = turn_index(trajectories, width=8)
    gains = information_gains(queries, torch.tensor([0.1, 0.5, 0.4]), turns)
    # row 0: 0.5 - 0.1 = 0.4, 0.4 - 0.5 = -0.1; row 1 has one turn: nothing measured, 0
    torch.testing.assert_close(gains, torch.tensor([[0.4, -0.1], [0.0, 0.0]]), **TOL)


# group 0: row 0 has three turns (gains 0.4, 0.2, outcome 1), row 1 one turn (outcome 0);
# group 1: two single-turn rows with outcome 1 (all equal)
REWARDS = torch.tensor([1.0, 0.0, 1.0, 1.0])
GAINS = torch.tensor([[0.4, 0.2], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
TURNS = torch.tensor([[0, 0, 1, 2], [0, 0, -1, -1], [0, -1, -1, -1], [0, 0, 0, -1]])
MASK = torch.tensor([[1, 0, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]])  # row 0 token 1: inserted
GROUPS = torch.tensor([0, 0, 1, 1])


def test_igpo_advantages_by_hand():
    # group 0's turn rewards, jointly: 0.4, 0.2, 1.0, 0.0; mean 0.4, population variance
    # (0 + 0.04 + 0.36 + 0.16) / 4 = 0.14, std 0.374166: normalized 0, -0.534522, 1.603567, -1.069045
    advantages, stats = igpo_advantages(REWARDS, GAINS, TURNS, MASK, GROUPS, gamma=1.0)
    # gamma 1: turn 2 = 1.603567, turn 1 = -0.534522 + 1.603567 = 1.069045, turn 0 = 0 + 1.069045
    expected = torch.tensor(
        [[1.069045, 0.0, 1.069045, 1.603567], [-1.069045, -1.069045, 0.0, 0.0], [0.0] * 4, [0.0] * 4]
    )
    torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-5)
    assert float(stats["zero_std_groups"]) == 1.0 and float(stats["num_groups"]) == 2.0
    torch.testing.assert_close(stats["gain_mean"], torch.tensor(0.3))  # (0.4 + 0.2) / 2
    torch.testing.assert_close(stats["turns_mean"], torch.tensor(1.5))  # (3 + 1 + 1 + 1) / 4
    # gamma 0.5: turn 1 = -0.534522 + 0.5 x 1.603567 = 0.267261, turn 0 = 0 + 0.5 x 0.267261 = 0.133631
    discounted, _ = igpo_advantages(REWARDS, GAINS, TURNS, MASK, GROUPS, gamma=0.5)
    torch.testing.assert_close(discounted[0], torch.tensor([0.133631, 0.0, 0.267261, 1.603567]), rtol=0, atol=1e-5)


def test_inserted_tokens_and_padding_get_no_advantage():
    advantages, _ = igpo_advantages(REWARDS, GAINS, TURNS, MASK, GROUPS)
    assert bool((advantages[MASK == 0] == 0).all())
    assert bool((advantages[0, MASK[0] == 1] != 0).all())


def test_the_table_entry_needs_the_gains():
    x = EstimatorInputs(REWARDS, MASK, GROUPS, torch.zeros(4), gamma=1.0, gains=GAINS, turn_index=TURNS)
    spec = ESTIMATORS["igpo"]
    assert spec.token_level and spec.compares_group and spec.information_gain
    advantages, returns, _ = spec.compute(x)
    assert returns is None
    torch.testing.assert_close(advantages, igpo_advantages(REWARDS, GAINS, TURNS, MASK, GROUPS)[0])
    with pytest.raises(ValueError, match="information gains"):
        spec.compute(EstimatorInputs(REWARDS, MASK, GROUPS, torch.zeros(4)))
    with pytest.raises(ValueError, match="gamma"):
        igpo_advantages(REWARDS, GAINS, TURNS, MASK, GROUPS, gamma=1.5)


def test_the_whole_chain_on_the_fake_model():
    # THREE_TURNS and a one-turn row in one group: gains p(2) - p(0) = 0.596418 - 0.166667 = 0.429751
    # and p(3) - p(2) = 0.800682 - 0.596418 = 0.204264; outcomes 1 and 0
    trajectories = [THREE_TURNS, _trajectory([GEN, GEN, GEN], [1, 1, 1])]
    queries = gold_queries(trajectories, FakeTokenizer())
    model = CountingLM([0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    probs = gold_probabilities(model, queries, pad_id=PAD, device="cpu", micro_batch_size=8)
    turns = turn_index(trajectories, width=8)
    gains = information_gains(queries, probs, turns)
    torch.testing.assert_close(gains[0], torch.tensor([0.429751, 0.204264]), rtol=0, atol=1e-6)
    mask = torch.tensor([THREE_TURNS.loss_mask, [1, 1, 1, 0, 0, 0, 0, 0]])
    advantages, _ = igpo_advantages(torch.tensor([1.0, 0.0]), gains, turns, mask, torch.tensor([0, 0]))
    # rewards 0.429751, 0.204264, 1, 0: mean 0.408504, population std 0.373801; normalized
    # 0.056842, -0.546385, 1.582379, -1.092835; turn advantages (gamma 1) 1.092835, 1.035993, 1.582379
    expected_row0 = torch.tensor([1.092835, 1.092835, 0, 0, 1.035993, 0, 1.582379, 1.582379])
    torch.testing.assert_close(advantages[0], expected_row0, rtol=0, atol=1e-5)
    torch.testing.assert_close(advantages[1, :3], torch.full((3,), -1.092835), rtol=0, atol=1e-5)


# --------------------------------------------------------------------------- recipe


def test_the_recipe_checks_igpo_settings():
    AlgorithmConfig(estimator="igpo", igpo_gamma=0.9).check("algorithm")
    with pytest.raises(RecipeError, match=r"algorithm.igpo_gamma=1.5 must lie in \[0.0, 1.0\]"):
        AlgorithmConfig(estimator="igpo", igpo_gamma=1.5).check("algorithm")
    with pytest.raises(RecipeError, match=r"kl_in_reward=true with algorithm\.estimator=igpo"):
        AlgorithmConfig(estimator="igpo", kl_in_reward=True).check("algorithm")
