"""Over-turn masking (`algorithm.mask_unfinished`, Mini-o3): over-turn trajectories leave the loss, not the groups."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from simsearch.policy.collate import collate_trajectories, loss_denominators
from simsearch.policy.step import token_advantages
from simsearch.types import OVER_TURN, UNFINISHED, Trajectory
from tests.policy.test_batch import PAD, trajectory


def _group(finishes: list[str]) -> list[Trajectory]:
    """One group of trajectories with response [7, 8, 9] and mask [1, 0, 1] (a search in the middle)."""
    row = trajectory([5, 6], [7, 8, 9], [1, 0, 1])
    return [replace(row, finish=finish) for finish in finishes]  # type: ignore[arg-type]


def test_unfinished_are_the_turn_and_context_finishes() -> None:
    assert frozenset({"max_turns", "gave_up", "context"}) == UNFINISHED  # "length" is trained on
    assert frozenset({"max_turns", "context"}) == OVER_TURN  # a give-up is masked only on request


def test_masking_zeroes_the_rows_of_over_turn_trajectories_only() -> None:
    rows = _group(["answer", "max_turns", "context", "length", "gave_up"])
    plain = collate_trajectories(rows, PAD)
    masked = collate_trajectories(rows, PAD, mask_unfinished=True)
    assert plain.loss_mask.tolist() == [[1, 0, 1]] * 5
    assert masked.loss_mask.tolist() == [[1, 0, 1], [0, 0, 0], [0, 0, 0], [1, 0, 1], [1, 0, 1]]
    assert torch.equal(masked.input_ids, plain.input_ids) and torch.equal(masked.responses, plain.responses)
    # the loss denominators count the 6 trained tokens of 3 sequences, not 10 tokens of 5
    assert loss_denominators(masked.loss_mask) == (6.0, 3.0)


def test_mask_gave_up_masks_give_ups_too_and_only_with_mask_unfinished() -> None:
    rows = _group(["answer", "max_turns", "gave_up", "length"])
    both = collate_trajectories(rows, PAD, mask_unfinished=True, mask_gave_up=True)
    assert both.loss_mask.tolist() == [[1, 0, 1], [0, 0, 0], [0, 0, 0], [1, 0, 1]]
    assert loss_denominators(both.loss_mask) == (4.0, 2.0)  # 2 trained tokens in each of rows 0 and 3
    alone = collate_trajectories(rows, PAD, mask_gave_up=True)  # without over-turn masking: nothing masked
    assert alone.loss_mask.tolist() == [[1, 0, 1]] * 4


def test_grpo_keeps_masked_rows_in_the_group_statistics() -> None:
    # rewards 1, 0 (masked), 0 (masked), 0: mean 0.25, unbiased std sqrt(0.25) = 0.5
    # (1 - 0.25) / (0.5 + 1e-6) = 1.4999970 and (0 - 0.25) / 0.5 = -0.4999990 for the kept rows.
    # Leaving the masked rows out of the group would give (1 - 0.5) / 0.7071068 = 0.7071058.
    batch = collate_trajectories(_group(["answer", "max_turns", "context", "length"]), PAD, mask_unfinished=True)
    adv, _, _ = token_advantages("grpo", torch.tensor([1.0, 0.0, 0.0, 0.0]), batch)
    high, low = 0.75 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6)
    torch.testing.assert_close(
        adv, torch.tensor([[high, 0.0, high], [0.0] * 3, [0.0] * 3, [low, 0.0, low]]), rtol=0.0, atol=1e-6
    )


def test_token_level_estimators_skip_masked_rows() -> None:
    # REINFORCE++ whitens over trained tokens: the kept rows (rewards 1 and 0, two tokens each, gamma 1)
    # have returns 1, 1, 0, 0 -> mean 0.5, unbiased var 1/3: +-0.5 / sqrt(1/3) = +-0.8660254
    batch = collate_trajectories(_group(["answer", "max_turns", "answer"]), PAD, mask_unfinished=True)
    adv, _, _ = token_advantages("reinforce_pp", torch.tensor([1.0, 5.0, 0.0]), batch)
    z = 0.5 / (1 / 3) ** 0.5
    torch.testing.assert_close(adv, torch.tensor([[z, 0.0, z], [0.0] * 3, [-z, 0.0, -z]]), rtol=0.0, atol=1e-5)


@pytest.mark.parametrize("finish", ["answer", "length", "gave_up"])
def test_finished_rows_keep_their_mask(finish: str) -> None:
    batch = collate_trajectories(_group([finish]), PAD, mask_unfinished=True)
    assert batch.loss_mask.tolist() == [[1, 0, 1]]
