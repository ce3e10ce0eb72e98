"""benchmarks/rollout.py end to end in a tiny mode, for each protocol (2 trajectories, 1 timed rollout)."""

from __future__ import annotations

import json
import sys

import pytest

from benchmarks import rollout

TINY = ["--questions", "1", "--group-size", "2", "--repeats", "1", "--pretrain-steps", "1", "--new-tokens", "8"]


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[str, dict]:
    """The benchmark's printed output and its last line's JSON."""
    monkeypatch.setattr(sys, "argv", ["rollout.py", *TINY, *argv])
    rollout.main()
    out = capsys.readouterr().out
    return out, json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("protocol", list(rollout.PROTOCOL_DEFAULTS))
def test_both_protocols_run_and_report(
    protocol: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out, figures = run(monkeypatch, capsys, "--protocol", protocol)
    assert figures["trajectories"] == 2 and figures["same_trajectories"] is True
    assert 0.0 < figures["assembly_share"] < 1.0 and figures["generate_calls"] >= 1
    if protocol == "tags":  # the tag run's output as it was before --protocol
        assert out.startswith("rollout: 1 questions") and "protocol" not in figures
    else:
        assert out.startswith("rollout, protocol tool-call: 1 questions")
        assert figures["protocol"] == "tool-call" and 0.0 <= figures["searched_share"] <= 1.0
        # One pretraining step writes no valid call: every turn that did not answer was invalid.
        assert figures["invalid_turns"] >= 1 and figures["call_errors"] >= figures["invalid_turns"]
        assert "invalid turns" in out


def test_the_tool_call_tokenizer_renders_the_search_tool() -> None:
    tokenizer = rollout.build_tokenizer(["Belsa rope works"], tool_call=True)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[{"type": "function",
        "function": {"name": "search"}}], tokenize=False)  # fmt: skip
    assert text.startswith("<|im_start|>system\ntools: search<|im_end|>")
    assert len(tokenizer.encode("<tool_call>", add_special_tokens=False)) == 1
