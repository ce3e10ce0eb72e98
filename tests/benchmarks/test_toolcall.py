"""benchmarks/toolcall.py: its figures by hand, its count of unreadable calls, and `--smoke` end to end."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks import study, toolcall

KEYS = {"tags_em_bm25", "toolcall_em_bm25", "toolcall_invalid_call_share"}  # the keys


def _world(seed: int, tags: float, calls: float, counts: dict[str, int]) -> dict:
    def em(rl: float) -> dict:
        return {
            "base": dict.fromkeys(toolcall.ENGINES, 5.0),
            "rl_search": {"bm25": rl, "dense": rl / 2, "simulator": rl},
        }

    protocols = {"tags": em(tags), "tool-call": em(calls)}
    return {"seed": seed, "commit": {"tags": "abc", "tool-call": "def"}, "em": protocols, "tool_calls": counts}


def test_the_figures_pair_the_protocols_world_by_world() -> None:
    counts = [{"calls": 90, "unreadable_calls": 10, "turns": 200, "invalid_turns": 4},
              {"calls": 30, "unreadable_calls": 0, "turns": 100, "invalid_turns": 2},
              {"calls": 60, "unreadable_calls": 10, "turns": 100, "invalid_turns": 0}]  # fmt: skip
    worlds = {0: _world(0, 50, 46, counts[0]), 1: _world(1, 40, 40, counts[1]), 2: _world(2, 60, 50, counts[2])}
    figures = toolcall.summarize(worlds)
    assert figures["tags_em_bm25"] == 50.0 and figures["toolcall_em_bm25"] == 45.33
    assert figures["toolcall_minus_tags_bm25"]["mean"] == pytest.approx(-4.67, abs=0.01)
    # Differences -4, 0, -10: mean -4.667, sd 5.0332, standard error 2.9059, t(0.975, 2) = 4.302653: -+ 12.503.
    assert figures["toolcall_minus_tags_bm25"] == {"mean": -4.67, "ci_low": -17.17, "ci_high": 7.84}
    assert figures["within_5_points"] is True and figures["interval_method"].startswith("95% t-interval")
    # 20 unreadable of the 200 calls written (180 read); 6 invalid of 400 turns.
    assert figures["toolcall_invalid_call_share"] == 0.1
    assert figures["toolcall_invalid_turn_share"] == 0.015
    assert figures["commits"] == {"tags": ["abc"], "tool-call": ["def"]}
    # what the study runner adds to the figures
    figures.update(smoke=False, provenance={"commit": "def", "cpu": "cpu", "torch_threads": 1, "jobs": 1})
    lines = toolcall.doc_lines(figures, argparse.Namespace(jobs=1, threads=1, tags_dir="", tags_commit=""))
    assert "| 2 | 60.0 (5.0) / 30.0 (5.0) / 60.0 (5.0) | 50.0 (5.0) / 25.0 (5.0) / 50.0 (5.0) | -10.0 |" in lines
    # BM25 and the simulator: -4.7 -+ 12.5 holds 0; dense halves every EM: -2, 0, -5, -2.333 -+ 6.252.
    assert (
        "| tool-call minus tags (RL) | no measurable difference (-4.7; -17.2 to +7.8) | no measurable difference "
        "(-2.3; -8.6 to +3.9) | no measurable difference (-4.7; -17.2 to +7.8) |"
    ) in lines
    assert any(line.startswith("Tool-call minus tags: the mean over worlds, and 95% t-interval") for line in lines)
    assert "tags runs at abc; tool-call runs at def" in lines[0] and "--tags-dir" not in lines[0]
    # Reused tag runs are named by their commit, never by a path of this machine.
    reused = argparse.Namespace(jobs=1, threads=1, tags_dir="/somewhere/seed_{seed}", tags_commit="abc")
    first = toolcall.doc_lines(figures, reused)[0]
    assert "--threads 1 --tags-dir TAG_RUNS --tags-commit abc`" in first and "/somewhere" not in first


def test_reused_tag_runs_need_their_commit() -> None:
    with pytest.raises(SystemExit):
        study.parse(toolcall.STUDY, ["--tags-dir", "runs/controls/world_{seed}/quickstart"])


@pytest.mark.slow
@pytest.mark.timeout(900)  # two quickstart smokes: minutes on a busy 2-core machine
def test_smoke_runs_both_protocols_and_prints_the_keys(tmp_path: Path, capsys) -> None:
    figures = toolcall.main(["--smoke", "--run-dir", str(tmp_path)])
    assert set(figures) >= KEYS and figures["smoke"] is True
    world = json.loads((tmp_path / "world_0" / "toolcall.json").read_text())
    assert world["tool_calls"]["calls"] + world["tool_calls"]["unreadable_calls"] > 0
    assert (tmp_path / "world_0" / "tool-call" / "report.json").is_file()
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == figures
    assert "| tool-call minus tags (RL) |" in (tmp_path / "toolcall.md").read_text()
