"""SFT library: pair reading, loss masking, the response loss, batch order."""

from __future__ import annotations

import math
from itertools import chain
from pathlib import Path

import pytest
import torch

from simsearch.errors import DataError
from simsearch.models import train_tokenizer
from simsearch.simulator.sft import (
    IGNORE_INDEX,
    TokenizedPair,
    collate,
    count_targets,
    eval_batches,
    read_pairs,
    response_loss,
    step_batches,
    tokenize_pair,
    tokenize_pairs,
)


@pytest.fixture(scope="module")
def tokenizer():
    texts = ["Query: capital of france\nResults:\nDoc 1(Title: Paris) Paris is the capital."] * 10
    return train_tokenizer(texts, vocab_size=300)


def test_read_pairs_and_its_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text(
        '{"prompt": "p", "response": "r", "label": "useful", "golden_answers": ["a"]}\n'
        '\n{"prompt": "p2", "response": "r2"}\n'
    )
    assert read_pairs(good) == [
        {"prompt": "p", "response": "r", "golden_answers": ["a"]},
        {"prompt": "p2", "response": "r2", "golden_answers": []},
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "p", "response": "r"}\n{"prompt": "p"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: needs a string 'response'"):
        read_pairs(bad)
    bad.write_text("{not json\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: not valid JSON"):
        read_pairs(bad)
    bad.write_text('{"prompt": "p", "response": "r", "golden_answers": "Paris"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: 'golden_answers' must be a list of strings"):
        read_pairs(bad)
    with pytest.raises(DataError, match="not found"):
        read_pairs(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no pairs"):
        read_pairs(tmp_path / "empty.jsonl")


def test_prompt_tokens_are_masked_and_eos_is_learned(tokenizer) -> None:
    prompt, response = "Query: capital of france\nResults:\n", "Doc 1(Title: Paris) Paris"
    pair = tokenize_pair(tokenizer, prompt, response, chat_template=False, max_length=100)
    prompt_ids = tokenizer(prompt)["input_ids"]
    response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
    assert pair.input_ids == prompt_ids + response_ids + [tokenizer.eos_token_id]
    assert pair.labels == [IGNORE_INDEX] * len(prompt_ids) + response_ids + [tokenizer.eos_token_id]
    assert pair.weights == [0.0] * len(prompt_ids) + [1.0] * (len(response_ids) + 1)


def test_answer_tokens_get_the_answer_weight(tokenizer) -> None:
    prompt, response = "Query: capital of france\nResults:\n", "Doc 1(Title: Paris) Paris is the capital."
    pair = tokenize_pair(
        tokenizer, prompt, response, chat_template=False, max_length=100, answers=["Paris"], answer_weight=5.0
    )
    n_prompt = len(tokenizer(prompt)["input_ids"])
    weighted = [tokenizer.decode([t]) for t, w in zip(pair.input_ids, pair.weights) if w == 5.0]
    # Both whole-word occurrences, every token of each, and nothing else.
    assert "".join(weighted).replace(" ", "") == "ParisParis"
    assert set(pair.weights[:n_prompt]) == {0.0} and set(pair.weights[n_prompt:]) == {1.0, 5.0}
    # An answer inside a longer word is not an occurrence; weight 1 weights nothing.
    assert 5.0 not in tokenize_pair(tokenizer, prompt, "Parisian", chat_template=False, max_length=100,
                                    answers=["Paris"], answer_weight=5.0).weights  # fmt: skip
    plain = tokenize_pair(tokenizer, prompt, response, chat_template=False, max_length=100, answers=["Paris"])
    assert set(plain.weights[n_prompt:]) == {1.0}


def test_chat_template_prompt_matches_the_engine(tokenizer) -> None:
    pair = tokenize_pair(tokenizer, "Query: x", "Doc 1: y", chat_template=True, max_length=100)
    n_prompt = sum(label == IGNORE_INDEX for label in pair.labels)
    # The tiny chat template: "role: content" lines, then "assistant: " (empty system message first).
    assert tokenizer.decode(pair.input_ids[:n_prompt]) == "system: \nuser: Query: x\nassistant: "


def test_truncation_cuts_the_response_and_drops_overlong_prompts(tokenizer) -> None:
    prompt = "Query: capital of france\n"
    n_prompt = len(tokenizer(prompt)["input_ids"])
    pair = tokenize_pair(tokenizer, prompt, "Paris is the capital.", chat_template=False, max_length=n_prompt + 2)
    assert len(pair.input_ids) == n_prompt + 2 and sum(x != IGNORE_INDEX for x in pair.labels) == 2
    assert tokenize_pair(tokenizer, prompt, "x", chat_template=False, max_length=n_prompt) is None
    kept, dropped = tokenize_pairs(
        [{"prompt": prompt, "response": "a"}, {"prompt": prompt * 5, "response": "b"}],
        tokenizer,
        chat_template=False,
        max_length=n_prompt + 3,
    )
    assert (len(kept), dropped) == (1, 1)


def test_collate_right_pads() -> None:
    batch = collate([TokenizedPair([5, 6, 7], [-100, 6, 7], [0.0, 1.0, 3.0]), TokenizedPair([8], [8], [1.0])], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert batch["weights"].tolist() == [[0.0, 1.0, 3.0], [1.0, 0.0, 0.0]]
    # After the shift, row 0 trains on 6 (weight 1) and 7 (weight 3), row 1 on nothing (its only
    # label is position 0).
    assert count_targets(batch["weights"]) == 4.0


def test_response_loss_by_hand() -> None:
    # Position 0 predicts label 0 from logits [0, 0]: -ln(1/2) = ln 2.
    # Position 1 predicts label 1 from logits [0, ln 3]: p = 3/4, -ln(3/4) = ln(4/3).
    # Position 2 has no next token. Sum: ln 2 + ln(4/3) = ln(8/3).
    logits = torch.tensor([[[0.0, 0.0], [0.0, math.log(3.0)], [9.0, -9.0]]])
    labels = torch.tensor([[IGNORE_INDEX, 0, 1]])
    ones = torch.tensor([[0.0, 1.0, 1.0]])
    assert response_loss(logits, labels, ones).item() == pytest.approx(math.log(8 / 3), abs=1e-6)
    # The prompt label is ignored: labelling position 0 changes nothing (it is never predicted).
    assert response_loss(logits, torch.tensor([[1, 0, 1]]), ones).item() == pytest.approx(math.log(8 / 3), abs=1e-6)
    # Masking position 2's label removes the ln(4/3) term.
    masked = torch.tensor([[IGNORE_INDEX, 0, IGNORE_INDEX]])
    assert response_loss(logits, masked, torch.tensor([[0.0, 1.0, 0.0]])).item() == pytest.approx(
        math.log(2.0), abs=1e-6
    )
    # Weight 3 on position 2: ln 2 + 3 ln(4/3).
    weighted = torch.tensor([[0.0, 1.0, 3.0]])
    assert response_loss(logits, labels, weighted).item() == pytest.approx(
        math.log(2.0) + 3 * math.log(4 / 3), abs=1e-6
    )


def test_step_batches_cover_each_epoch_once_across_ranks() -> None:
    # 10 pairs, B=2, A=1, W=2: one step consumes 4 positions; steps 0..4 consume 20 = two epochs.
    seen = []
    for step in range(5):
        for rank in range(2):
            (micro,) = step_batches(10, step=step, batch_size=2, grad_accum=1, rank=rank, world_size=2, seed=3)
            seen += micro
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10))
    assert seen[:10] != seen[10:]  # each epoch has its own order
    again = step_batches(10, step=3, batch_size=2, grad_accum=1, rank=1, world_size=2, seed=3)
    assert again == [seen[14:16]]  # step 3, rank 1: positions 14, 15 (a pure function of the step)


def test_step_batches_sorted_by_length_keep_each_step_s_pairs_and_pad_less() -> None:
    lengths = [5, 90, 12, 70, 33, 8, 64, 21, 47, 100, 3, 55]
    padded = {False: 0, True: 0}
    for step in range(6):
        for rank in range(2):
            plain = step_batches(12, step=step, batch_size=2, grad_accum=3, rank=rank, world_size=2, seed=1)
            grouped = step_batches(
                12, step=step, batch_size=2, grad_accum=3, rank=rank, world_size=2, seed=1, lengths=lengths
            )
            assert sorted(chain(*grouped)) == sorted(chain(*plain))  # the same pairs in the step
            assert [len(m) for m in grouped] == [2, 2, 2]
            flat = [lengths[i] for i in chain(*grouped)]
            assert flat == sorted(flat, reverse=True)  # longest first across the micro-batches
            for key, micro in ((False, plain), (True, grouped)):
                padded[key] += sum(len(m) * max(lengths[i] for i in m) for m in micro)
    assert padded[True] < padded[False]


def test_eval_batches_give_every_rank_the_same_number_of_forwards() -> None:
    # 5 examples, batch 2 -> chunks [0,1] [2,3] [4]; rank 0 gets chunks 0 and 2, rank 1 chunk 1
    # plus a repeat of chunk 0 that is not counted.
    assert eval_batches(5, batch_size=2, rank=0, world_size=2) == [([0, 1], True), ([4], True)]
    assert eval_batches(5, batch_size=2, rank=1, world_size=2) == [([2, 3], True), ([0, 1], False)]
