"""benchmarks/masked_decode.py in a tiny mode: its arms, the rollout-shaped case, its agreement checks, its JSON last.

Times are not asserted (a loaded CPU says nothing about them); what is asserted can fail: the
batches each arm decodes, and that packed attention decodes the greedy tokens of padded attention.
"""

from __future__ import annotations

import json

import pytest
import transformers

TINY = ["--layers", "1", "--batch", "8", "--contexts", "48", "64", "--rollout-context", "96", "--steps", "3"]


@pytest.fixture(scope="module")
def bench():
    from benchmarks import masked_decode

    return masked_decode


def test_masked_decode_reports_each_arm_and_the_rollout_case_and_prints_its_json_last(bench, capsys):
    summary = bench.main(TINY)
    printed = capsys.readouterr().out.strip().splitlines()
    assert json.loads(printed[-1]) == summary
    assert summary["transformers"] == transformers.__version__ and summary["torch_threads"] == 1
    assert list(summary["contexts"]) == ["48", "64"]
    for row in summary["contexts"].values():
        assert set(row) == {f"{arm}_ms" for arm in bench.ARMS} | {
            "ragged_over_even", "packed_over_even", "packed_same_tokens"
        }  # fmt: skip
        assert row["packed_same_tokens"] is True  # packing changes the kernel, not the tokens
    rollout = summary["rollout"]
    # 8 rows in 2 groups of 4: one at the full context, one at half of it: a quarter is padding.
    assert (rollout["context"], rollout["shortest"], rollout["padding_share"]) == (96, 48, 0.25)
    assert rollout["packed_same_tokens"] is True
    assert any(line.startswith("rollout-shaped: contexts 48-96 in groups of 4, 25% padding") for line in printed)


def test_rollout_lengths_are_groups_spread_over_the_second_half_of_the_context(bench):
    rows = bench.rollout_lengths(40, 1100)
    groups = [rows[i : i + bench.ROLLOUT_GROUP] for i in range(0, 40, bench.ROLLOUT_GROUP)]
    assert all(len(set(group)) == 1 for group in groups)  # a question's samples share a prompt length
    firsts = sorted(group[0] for group in groups)
    assert firsts[0] == 550 and firsts[-1] == 1100 and len(set(firsts)) == 10  # ten lengths over [550, 1100]
    assert bench.padding_share(rows) == pytest.approx(1 - sum(rows) / (40 * 1100))
    assert 0.2 < bench.padding_share(rows) < 0.3
    assert bench.lengths("even", 3, 48) == [48, 48, 48] and bench.lengths("ragged", 3, 48) == [48, 41, 34]


def test_decode_gives_the_same_tokens_for_the_same_rows_and_other_tokens_for_others(bench):
    model = bench.build(1, "cpu")
    _, first = bench.decode_ms(model, [30, 20], 2)
    _, again = bench.decode_ms(model, [30, 20], 2)
    _, other = bench.decode_ms(model, [30, 21], 2)
    assert first == again and len(first) == 2 and all(len(row) == 3 for row in first)
    assert other != first  # the agreement flags compare something that can differ


def test_masked_decode_refuses_contexts_no_longer_than_the_spread(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--contexts", "40"])
    assert "--contexts must each exceed 40" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--contexts", "48", "--rollout-context", "5"])
    assert "--rollout-context must be 0 (skip) or at least 8" in capsys.readouterr().err
