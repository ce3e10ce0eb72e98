"""Validation during training: each of `val/em`, `val/f1`, `val/substring_em` and `val/calls_per_traj` is its own mean.

A scripted policy answers three questions so that the three scores differ on each, and one question
searches first: a metric logged under another's name, or a mean over the wrong count, shows.
"""

from __future__ import annotations

import pytest

from simsearch.policy.validation import Validation, validate
from simsearch.types import QAExample
from tests.policy import test_rollout
from tests.policy.test_rollout import SEARCH_TURN, RecordingSearch, ScriptedPolicy, make_settings

tokenizer = test_rollout.tokenizer  # a byte-level BPE with the tags as single tokens

EXAMPLES = [QAExample(f"v{i}", f"who won prize {i}?", [f"gold {i}"]) for i in range(3)]
ANSWERS = {
    "prize 0": "gold 0",  # EM 1, F1 1, substring EM 1
    "prize 1": "the gold 1 medal",  # normalized "gold 1 medal": EM 0, substring EM 1, F1 0.8 (below)
    "prize 2": "silver",  # 0, 0, 0
}


def script(context: str, call: int, sample: int) -> str:
    """Question 0 searches in the first generate call, then answers; the others answer at once."""
    prize = next(key for key in ANSWERS if key in context)
    if prize == "prize 0" and call == 0:
        return SEARCH_TURN
    return f"<think> sure </think>\n<answer> {ANSWERS[prize]} </answer>"


def test_each_validation_metric_is_its_own_mean_over_the_questions(tokenizer) -> None:
    search = RecordingSearch()
    val = Validation(EXAMPLES, search, make_settings(), max_new_tokens=200, normalization="squad", seed=0)
    metrics = validate(val, ScriptedPolicy(tokenizer, script), tokenizer, rank=0, world=1)
    # "gold 1 medal" against "gold 1": 2 shared tokens, precision 2/3, recall 1, F1 = 2 (2/3) / (5/3) = 0.8.
    # Over the 3 questions: EM (1 + 0 + 0) / 3, F1 (1 + 0.8 + 0) / 3 = 0.6, substring EM (1 + 1 + 0) / 3,
    # and one search in three trajectories.
    assert metrics == {
        "val/em": pytest.approx(1 / 3, abs=1e-12),
        "val/f1": pytest.approx(0.6, abs=1e-12),
        "val/substring_em": pytest.approx(2 / 3, abs=1e-12),
        "val/calls_per_traj": pytest.approx(1 / 3, abs=1e-12),
    }
    assert [len(call) for call in search.calls] == [1]  # the one search, in one call
