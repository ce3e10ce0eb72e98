"""benchmarks/mutations.py: the table stays true to the code, a real bug is caught, a no-op mutant survives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import mutations

ROOT = Path(__file__).resolve().parents[2]

# A comment of eval/metrics.py reworded: no behaviour changes, so no test can fail on it.
NO_OP = mutations.Mutant(
    "comment_reworded", "simsearch/eval/metrics.py", "# A bare string would silently be scored character by character.",
    "# A bare string would be scored one character at a time.", ("tests/eval/test_metrics.py::test_f1_hand_worked",),
    "a comment reworded",
)  # fmt: skip


def test_every_mutant_names_a_text_found_once_and_tests_that_exist() -> None:
    mutations.check_table(mutations.MUTANTS)  # raises, naming the mutant, when the code moved on
    assert len(mutations.MUTANTS) >= 34
    for mutant in mutations.MUTANTS:
        for test in mutant.tests:
            assert (ROOT / test.split("::")[0]).is_file(), f"{mutant.name}: {test} does not exist"
    # issue 57's four wiring bugs are in the table
    names = {m.name for m in mutations.MUTANTS}
    assert {"p_noise_zero_in_search", "granularity_ignored", "curriculum_not_restored", "rng_not_restored"} <= names


def test_a_table_that_rots_fails_naming_the_mutant(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("x = 1\nx = 1\ny = 2\n")
    twice = mutations.Mutant("twice", "m.py", "x = 1", "x = 2", ("t.py",), "")
    gone = mutations.Mutant("gone", "m.py", "z = 3", "z = 4", ("t.py",), "")
    with pytest.raises(ValueError, match=r"mutant twice: its old text occurs 2 times in m\.py"):
        mutations.check_table([twice], tmp_path)
    with pytest.raises(ValueError, match="mutant gone: its old text occurs 0 times"):
        mutations.apply(gone, tmp_path)
    same = mutations.Mutant("twice", "m.py", "y = 2", "y = 3", ("t.py",), "")
    with pytest.raises(ValueError, match="repeated: twice"):
        mutations.check_table([same, same], tmp_path)


def test_apply_writes_the_new_text_and_returns_the_original(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("a = 1\nb = 2\n")
    original = mutations.apply(mutations.Mutant("m", "m.py", "b = 2", "b = 3", (), ""), tmp_path)
    assert original == "a = 1\nb = 2\n" and (tmp_path / "m.py").read_text() == "a = 1\nb = 3\n"


def test_a_copy_without_simsearch_is_refused_rather_than_testing_the_installed_one(tmp_path: Path) -> None:
    # tmp_path holds no simsearch/: Python there imports the installed (editable) package, not a mutated copy
    with pytest.raises(RuntimeError, match="imports simsearch from"):
        mutations.check_imports_the_copy(tmp_path)


def test_a_timeout_is_its_own_status() -> None:
    status, detail = mutations.run_tests(ROOT, ["tests/eval/test_metrics.py"], timeout_s=0.01)
    assert (status, detail) == ("timeout", "over 0 s")


def test_main_reports_a_real_bug_caught_and_prints_the_record_last(capsys: pytest.CaptureFixture) -> None:
    """Tiny mode: one mutant of the table, F1 without its factor 2, with its covering tests run unmutated first."""
    figures = mutations.main(["--only", "f1_no_factor_2"])
    out = capsys.readouterr().out.splitlines()
    assert json.loads(out[-1]) == figures
    assert (figures["mutants"], figures["caught"], figures["survivors"], figures["errors"]) == (1, 1, [], [])
    assert figures["command"] == "python -m benchmarks.mutations --only f1_no_factor_2"
    assert out[-2] == "caught 1 / 1" and out[1].split()[:3] == ["f1_no_factor_2", "eval/metrics.py", "caught"]


def test_a_no_op_mutant_survives_so_the_runner_can_report_a_miss() -> None:
    [outcome] = mutations.run_mutants([NO_OP], timeout_s=600.0, baseline=False)
    assert outcome.status == "survived"
    figures = mutations.summary([outcome], 1.0, [])
    assert (figures["mutants"], figures["caught"], figures["survivors"]) == (1, 0, ["comment_reworded"])
    assert "# A bare string would silently" in (ROOT / NO_OP.path).read_text()  # the repository itself untouched
