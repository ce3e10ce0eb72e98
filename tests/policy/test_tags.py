"""Parsing the agent's tags: actions, queries, information spans."""

from __future__ import annotations

import pytest

from simsearch.eval.metrics import extract_answer
from simsearch.policy.tags import (
    INVALID_ACTION_MESSAGE,
    STOP_STRINGS,
    Action,
    extract_queries,
    information_spans,
    parse_action,
)


def test_stop_strings() -> None:
    assert STOP_STRINGS == ("</search>", "</answer>")


def test_invalid_action_message_says_where_things_go() -> None:
    message = INVALID_ACTION_MESSAGE
    assert message.startswith("\n") and message.endswith("\n")
    assert "not valid" in message
    assert "search tags" in message and "answer tags" in message
    assert "again" in message
    # ZeroSearch's wording "between <answer> and </answer>" parses as the answer "and";
    # ours holds no tag, so a trajectory that never answered still has no answer.
    assert "<" not in message and ">" not in message
    assert parse_action(message) == Action("invalid")
    trajectory = "<think>hm</think> <serch>x</serch>" + message + "<think>hm</think>"
    assert extract_queries(trajectory) == []
    assert extract_answer(trajectory) is None


@pytest.mark.parametrize(
    ("turn", "expected"),
    [
        ("<think>need facts</think>\n<search> capital of France </search>", Action("search", "capital of France")),
        ("<think>known</think>\n<answer> Paris </answer>", Action("answer", "Paris")),
        # the last search of the turn is the query
        ("<search>first</search> hmm <search>second</search>", Action("search", "second")),
        # multi-line think and answer (DOTALL)
        ("<think>line one\nline two</think>\n<answer>New\nYork</answer>", Action("answer", "New\nYork")),
        # multi-line query content is still read (the format reward is what penalizes it)
        ("<search>a\nb</search>", Action("search", "a\nb")),
        # an empty answer still ends the trajectory
        ("<answer></answer>", Action("answer", "")),
        # the later closing tag decides
        ("<answer>x</answer> <search>q</search>", Action("search", "q")),
        ("<search>q</search> <answer>x</answer>", Action("answer", "x")),
        # trailing whitespace after the stop string does not matter
        ("<search>q</search>\n", Action("search", "q")),
    ],
)
def test_parse_action(turn: str, expected: Action) -> None:
    assert parse_action(turn) == expected


@pytest.mark.parametrize(
    "turn",
    [
        "",
        "<think>thinking, then the token budget ran out",
        "<search>unfinished query",
        "<answer>unfinished",
        "no tags at all",
        # closing tag without an opener
        "query</search>",
        "Paris</answer>",
        # an empty query cannot be searched
        "<search>   </search>",
        "<think>only thinking</think>",
    ],
)
def test_parse_action_invalid(turn: str) -> None:
    assert parse_action(turn) == Action("invalid", "")


def test_extract_queries() -> None:
    text = (
        "<think>a</think><search> q1 </search>\n\n<information>Doc <search>not mine</search>"
        "</information>\n\n<search>  </search><search>multi\nline</search><search>q3"
    )
    assert extract_queries(text) == ["q1", "multi\nline"]


def test_information_spans() -> None:
    text = "ab<information>x\ny</information>cd<information>zz</information>"
    # "ab" -> block 1 starts at 2; "<information>" is 13 chars, "x\ny" 3, "</information>" 14
    # -> ends at 2 + 13 + 3 + 14 = 32; "cd" -> block 2 starts at 34, ends at 34 + 13 + 2 + 14 = 63
    assert information_spans(text) == [(2, 32), (34, 63)]
    assert [text[s:e] for s, e in information_spans(text)] == [
        "<information>x\ny</information>",
        "<information>zz</information>",
    ]


def test_information_spans_truncated_block_runs_to_end() -> None:
    text = "<think>t</think><information>cut off"
    assert information_spans(text) == [(16, len(text))]
    assert information_spans("no blocks") == []
