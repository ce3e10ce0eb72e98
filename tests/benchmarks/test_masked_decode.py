"""benchmarks/masked_decode.py in a tiny mode: its three arms measured, its ratios theirs, its JSON last."""

from __future__ import annotations

import json

import pytest
import transformers

from tests.benchmark_scripts import load_benchmark


def test_masked_decode_times_three_arms_per_context_and_prints_its_json_last(capsys):
    bench = load_benchmark("masked_decode")
    summary = bench.main(["--layers", "1", "--batch", "3", "--contexts", "48", "64", "--steps", "2"])
    printed = capsys.readouterr().out.strip().splitlines()
    assert json.loads(printed[-1]) == summary
    assert summary["transformers"] == transformers.__version__ and summary["torch_threads"] == 1
    assert list(summary["contexts"]) == ["48", "64"]
    for row in summary["contexts"].values():
        assert all(row[f"{arm}_ms"] > 0 for arm in bench.ARMS)
        assert row["ragged_over_even"] == pytest.approx(row["ragged_ms"] / row["even_ms"], rel=1e-12)
        assert row["packed_over_even"] == pytest.approx(row["packed_ms"] / row["even_ms"], rel=1e-12)
    assert bench.lengths("even", 3, 48) == [48, 48, 48] and bench.lengths("ragged", 3, 48) == [48, 41, 34]


def test_masked_decode_refuses_contexts_no_longer_than_the_spread(capsys):
    bench = load_benchmark("masked_decode")
    with pytest.raises(SystemExit):
        bench.main(["--contexts", "40"])
    assert "--contexts must each exceed 40" in capsys.readouterr().err
