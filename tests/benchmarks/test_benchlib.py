"""benchmarks/benchlib.py: the paired differences' t-interval, its cells and its JSON, by hand."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from benchmarks import ablations, benchlib, budget, controls, study, toolcall, turn_rewards

T_1, T_2, T_4 = 12.706205, 4.302653, 2.776445  # Student's t at 0.975 with 1, 2 and 4 degrees of freedom


def test_the_t_quantiles_written_here_are_scipys() -> None:
    for df, t in ((1, T_1), (2, T_2), (4, T_4)):
        assert stats.t.ppf(0.975, df) == pytest.approx(t, abs=1e-6)


def test_t_interval_by_hand() -> None:
    # 1, 2, 3: mean 2, sd 1, standard error 1 / sqrt(3); 2 -+ t(0.975, 2) / sqrt(3) = 2 -+ 2.484138.
    low, high = benchlib.t_interval([1.0, 2.0, 3.0])
    assert low == pytest.approx(2 - T_2 / math.sqrt(3), abs=1e-5) and low == pytest.approx(-0.484138, abs=1e-5)
    assert high == pytest.approx(2 + T_2 / math.sqrt(3), abs=1e-5) and high == pytest.approx(4.484138, abs=1e-5)
    # Two worlds, 0 and 10: mean 5, sd 7.0711, standard error 5; 5 -+ 5 * 12.7062 = 5 -+ 63.531 (a percentile
    # bootstrap would have said 0 to 10: the range).
    low, high = benchlib.t_interval([0.0, 10.0])
    assert low == pytest.approx(5 - 5 * T_1, abs=1e-4) and high == pytest.approx(5 + 5 * T_1, abs=1e-4)
    # 1..5: mean 3, sd 1.5811, standard error 0.70711; 3 -+ 2.776445 * 0.70711 = 3 -+ 1.963243.
    low, high = benchlib.t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert low == pytest.approx(1.036757, abs=1e-5) and high == pytest.approx(4.963243, abs=1e-5)
    # Another level: t(0.95, 2) = 2.919986, so 2 -+ 2.919986 / sqrt(3) = 2 -+ 1.685854.
    low, high = benchlib.t_interval([1.0, 2.0, 3.0], level=0.90)
    assert low == pytest.approx(0.314146, abs=1e-5) and high == pytest.approx(3.685854, abs=1e-5)
    assert benchlib.t_interval([4.0, 4.0, 4.0]) == (4.0, 4.0)  # no spread, no width
    assert benchlib.t_interval([7.0]) is None  # one world: no interval
    assert benchlib.t_interval([]) is None


def test_difference_cell_by_hand() -> None:
    # 1, 2, 3: -0.48 to +4.48 holds 0.
    assert benchlib.difference_cell([1.0, 2.0, 3.0]) == "no measurable difference (+2.0; -0.5 to +4.5)"
    # 2, 4, 6 (the same sign on every world; a bootstrap said +2.0 to +6.0): 4 -+ 2 * 2.484138 holds 0.
    assert benchlib.difference_cell([2.0, 4.0, 6.0]) == "no measurable difference (+4.0; -1.0 to +9.0)"
    assert benchlib.difference_cell([-2.0, -4.0, -6.0]) == "no measurable difference (-4.0; -9.0 to +1.0)"
    # 10, 11, 12: 11 -+ 2.484138, clear of 0.
    assert benchlib.difference_cell([10.0, 11.0, 12.0]) == "+11.0 (+8.5 to +13.5)"
    assert benchlib.difference_cell([-10.0, -11.0, -12.0]) == "-11.0 (-13.5 to -8.5)"
    assert benchlib.difference_cell([0.0, 10.0]) == "no measurable difference (+5.0; -58.5 to +68.5)"
    # Zero, and what rounds to it, has no sign: mean -0.01, ends -0.035 and +0.015.
    assert benchlib.difference_cell([-0.02, -0.01, 0.0]) == "no measurable difference (0.0; 0.0 to 0.0)"
    # 0.25, 0.5, 0.5: mean 0.416667, sd 0.144338, standard error 0.083333; -+ 0.358554.
    assert benchlib.difference_cell([0.25, 0.5, 0.5], digits=2) == "+0.42 (+0.06 to +0.78)"
    assert benchlib.difference_cell([5.0]) == "+5.0 (1 world: no interval)"
    assert benchlib.difference_cell([]) == "-"


def test_paired_rounds_the_mean_and_interval_for_the_json() -> None:
    assert benchlib.paired([1.0, 2.0, 3.0]) == {"mean": 2.0, "ci_low": -0.48, "ci_high": 4.48}
    assert benchlib.paired([0.0, 10.0]) == {"mean": 5.0, "ci_low": -58.53, "ci_high": 68.53}
    assert benchlib.paired([7.0]) == {"mean": 7.0, "ci_low": None, "ci_high": None}


def test_every_benchmark_uses_the_one_interval() -> None:
    assert not hasattr(benchlib, "bootstrap_interval")
    method = benchlib.INTERVAL_METHOD
    assert method.startswith("95% t-interval") and "scipy.stats.t, n - 1 degrees of freedom" in method
    assert controls.t_cell is benchlib.difference_cell and controls.paired is benchlib.paired
    assert controls.INTERVAL_METHOD is benchlib.INTERVAL_METHOD
    # the runner's tables of paired differences (ablations, turn_rewards) and the pages that write cells themselves
    for module in (study, toolcall, budget):
        assert module.difference_cell is benchlib.difference_cell, module.__name__
    assert ablations.paired_figures is benchlib.paired
    assert turn_rewards.paired is toolcall.paired is benchlib.paired
