"""Outcome rewards, our format reward and SSRL's exact one, on hand-written responses."""

from __future__ import annotations

import math

import pytest

from simsearch.errors import RecipeError
from simsearch.policy.recipe import RewardConfig
from simsearch.policy.rewards import (
    REWARD_NAMES,
    em_rewards,
    f1_rewards,
    format_rewards,
    format_score,
    ssrl_format_rewards,
    ssrl_format_score,
    substring_em_rewards,
    weighted_reward,
)
from simsearch.policy.tags import INVALID_ACTION_MESSAGE

INFO = "\n\n<information>Doc 1(Title: Paris) Paris is the capital of France.</information>\n\n"
# one think per search plus one before the answer: T = 2, S = 1
GOOD = (
    "<think>I need to look this up.</think>\n<search>capital of France</search>"
    + INFO
    + "<think>The document says Paris.</think>\n<answer>Paris</answer>"
)


def _trajectory(num_think: int, num_search: int) -> str:
    """num_search think+search+information rounds, the remaining thinks, then an answer."""
    parts = []
    for i in range(num_search):
        parts.append(f"<think>step {i}</think><search>query {i}</search>\n<information>doc {i}</information>\n")
    parts.extend(f"<think>more {i}</think>" for i in range(num_think - num_search))
    parts.append("<answer>Paris</answer>")
    return "".join(parts)


# --- the score formula: min(0.5 T, 1) * min(T, S + 1) / max(T, S + 1) ---------------------------


@pytest.mark.parametrize(
    ("num_think", "num_search", "expected"),
    [
        (1, 0, 0.5),  # min(0.5, 1) * 1/1
        (2, 1, 1.0),  # min(1, 1) * 2/2
        (1, 1, 0.25),  # min(0.5, 1) * min(1, 2)/max(1, 2) = 0.5 * 1/2
        (2, 0, 0.5),  # min(1, 1) * min(2, 1)/max(2, 1) = 1/2
        (3, 1, 2 / 3),  # min(1.5, 1) * min(3, 2)/max(3, 2)
        (3, 2, 1.0),  # 1 * 3/3
        (8, 0, 0.125),  # 1 * 1/8
        (8, 7, 1.0),  # 8 thinks is still allowed
        (9, 8, 0.0),  # more than 8 thinks scores 0 even when balanced
    ],
)
def test_format_score_formula(num_think: int, num_search: int, expected: float) -> None:
    assert format_score(_trajectory(num_think, num_search)) == pytest.approx(expected, abs=1e-12)
    # SSRL's rule has the same formula and the same 8-think limit on well-formed responses
    assert ssrl_format_score(_trajectory(num_think, num_search)) == pytest.approx(expected, abs=1e-12)


def test_format_score_good_response() -> None:
    assert format_score(GOOD) == 1.0
    # surrounding whitespace is ignored
    assert format_score("\n  " + GOOD + "\n") == 1.0
    # plain text between blocks is allowed
    assert format_score("<think>a</think> so: <answer>b</answer>") == 0.5
    # multi-line think, information and answer are fine
    assert format_score(GOOD.replace("look this up.", "look\nthis up.")) == 1.0


# --- each rule, broken once --------------------------------------------------------------------


@pytest.mark.parametrize(
    "response",
    [
        # rule 1: foreign tags, tags with attributes, self-closing tags, nesting, unbalanced
        GOOD.replace("look this up", "look <b>this</b> up"),
        GOOD.replace("<think>The document", "<think id=2>The document"),
        GOOD.replace("the capital", "the<br/>capital"),
        GOOD.replace("<think>The document says Paris.</think>", "<think>The <answer>x</answer> doc</think>"),
        GOOD.replace("</information>", ""),
        GOOD.replace("<think>The document says Paris.</think>", "<think>The document says Paris."),
        "<think>a</think></think><answer>b</answer>",
        "<think>a</search><answer>b</answer>",  # a block closed by the wrong tag
        # rule 2: does not start with <think> / does not end with </answer>
        "Sure. " + GOOD,
        "<search>capital of France</search>" + INFO + "<think>x</think><answer>Paris</answer>",
        GOOD + " Done.",
        GOOD.replace("<answer>Paris</answer>", "<answer>Paris</answer><think>check</think>"),
        "<think>no answer at all</think>",
        # rule 3: empty blocks
        GOOD.replace("I need to look this up.", "  "),
        GOOD.replace("capital of France", " "),
        GOOD.replace("Doc 1(Title: Paris) Paris is the capital of France.", "\n"),
        GOOD.replace("<answer>Paris</answer>", "<answer></answer>"),
        # rule 4: a search spread over two lines
        GOOD.replace("capital of France", "capital of\nFrance"),
        # rule 5: a search not followed by information, or with text in between
        GOOD.replace(INFO, "\n<think>wait</think>" + INFO),
        GOOD.replace(INFO, " and then " + INFO),
        "<think>a</think><search>q</search><think>b</think><answer>c</answer>",
        # rule 6: more information blocks than searches
        "<think>a</think><information>made up</information><answer>c</answer>",
        GOOD.replace(INFO, INFO + INFO),
        # rule 7: template placeholders from the Search-R1 prompt, any case
        GOOD.replace("capital of France", " query "),
        GOOD.replace("capital of France", "Query"),
        GOOD.replace("<answer>Paris</answer>", "<answer> Beijing </answer>"),
    ],
)
def test_format_score_rule_violations_score_zero(response: str) -> None:
    assert format_score(response) == 0.0


def test_format_score_placeholders_match_whole_content_only() -> None:
    # "query" inside a real query is not the template text
    assert format_score(GOOD.replace("capital of France", "SQL query syntax")) == 1.0
    assert format_score(GOOD.replace("<answer>Paris</answer>", "<answer>Beijing, China</answer>")) == 1.0


def test_format_score_after_invalid_action_is_zero() -> None:
    # An appended corrective message holds no tags, so the rest of the format still parses;
    # the trajectory keeps its format score only if the policy's own tags are well formed.
    bad_turn = "<think>hm</think> <serch>x</serch>"
    assert format_score(bad_turn + INVALID_ACTION_MESSAGE + "<answer>Paris</answer>") == 0.0


# --- ssrl_format: SSRL's format_reward (verl/workers/reward_manager/naive.py), rule by rule -------

ROUND = "<search>q</search><information>d</information>"


@pytest.mark.parametrize(
    ("response", "ssrl", "ours"),
    [
        # the good cases agree: T = 1, S = 0 -> 0.5; T = 2, S = 1 -> 1
        ("<think>a</think><answer>b</answer>", 0.5, 0.5),
        (GOOD, 1.0, 1.0),
        # no search, two thinks: min(1, 1) * min(2, 1) / max(2, 1) = 0.5
        ("<think>a</think><think>b</think><answer>c</answer>", 0.5, 0.5),
        # one search, no think after it: min(0.5, 1) * min(1, 2) / max(1, 2) = 0.25
        ("<think>a</think>" + ROUND + "<answer>c</answer>", 0.25, 0.25),
        # placeholders: SSRL's phrases anywhere in a block, any case
        (
            "<think>a</think><search>Your Query here</search><information>d</information>"
            "<think>b</think><answer>c</answer>",
            0.0,
            1.0,
        ),
        ("<think>a</think><answer>your answer: Paris</answer>", 0.0, 0.5),
        ("<think>Your thoughts</think><answer>x</answer>", 0.0, 0.5),
        (
            "<think>a</think><search>q</search><information>see YOUR INFORMATION</information>"
            "<think>b</think><answer>c</answer>",
            0.0,
            1.0,
        ),
        # ... but not the Search-R1 template text that ours refuses
        (
            "<think>a</think><search> query </search><information>d</information>"
            "<think>b</think><answer>Beijing</answer>",
            1.0,
            0.0,
        ),
        # any "<...>" is a tag, across lines too, and must be one of the eight
        ("<think>x < y and z > w</think><answer>b</answer>", 0.0, 0.5),
        ("<think>if a <\nb> c</think><answer>x</answer>", 0.0, 0.5),
        # a lone "<" reaches the next ">": the tag " y</think" is foreign
        ("<think>x < y</think><answer>b</answer>", 0.0, 0.5),
        ("<think>a</think><answer>b<br></answer>", 0.0, 0.0),
        # unmatched and repeated tags: only the first two, the last two and each search round
        # are checked, and <think> is counted as a string (T = 2, S = 0 -> 0.5)
        ("<think>a</think><think>b<answer>c</answer>", 0.5, 0.0),
        ("<think>a</think></think><answer>b</answer>", 0.5, 0.0),  # T = 1
        ("<think>a</think>" + ROUND + "<think>b<answer>c</answer>", 1.0, 0.0),  # T = 2, S = 1
        ("<think>a</think><answer>x</answer><answer>y</answer>", 0.5, 0.5),
        # nesting puts <think> second: fails the opening check
        ("<think>a<think>b</think></think><answer>c</answer>", 0.0, 0.0),
        # a search round must be exactly </search> <information> </information>; text between is fine
        (
            "<think>a</think><search>q</search> so <information>d</information><think>b</think><answer>c</answer>",
            1.0,
            0.0,
        ),
        ("<think>a</think><search>q<information>d</information><think>b</think><answer>c</answer>", 0.0, 0.0),
        # information without search: 0 searches != 1 information
        ("<think>a</think><information>d</information><answer>c</answer>", 0.0, 0.0),
        # a search line: only "\n" breaks it for SSRL, "\r" too for ours
        (
            "<think>a</think><search>q\nr</search><information>d</information><think>b</think><answer>c</answer>",
            0.0,
            0.0,
        ),
        (
            "<think>a</think><search>q\rr</search><information>d</information><think>b</think><answer>c</answer>",
            1.0,
            0.0,
        ),
        # empty block, fewer than four known tags, wrong start or end
        ("<think> </think><answer>b</answer>", 0.0, 0.0),
        ("<think>a</answer>", 0.0, 0.0),
        ("Sure. <think>a</think><answer>b</answer>", 0.0, 0.0),
        ("<think>a</think><answer>b</answer> Done.", 0.0, 0.0),
    ],
)
def test_ssrl_format_score_follows_ssrl_rules(response: str, ssrl: float, ours: float) -> None:
    assert ssrl_format_score(response) == pytest.approx(ssrl, abs=1e-12)
    assert format_score(response) == pytest.approx(ours, abs=1e-12)


def test_ssrl_format_think_limit_counts_the_string() -> None:
    # 8 complete think blocks, 7 rounds: 1.0; a ninth, unclosed "<think>" makes 9 > 8 -> 0
    eight = _trajectory(8, 7)
    assert ssrl_format_score(eight) == 1.0
    ninth = eight.replace("<answer>", "<think>unclosed<answer>")
    assert ssrl_format_score(ninth) == 0.0
    # 9 thinks and 9 rounds would be balanced (T = S) but is over the limit
    assert ssrl_format_score(_trajectory(9, 9)) == 0.0


def test_ssrl_format_rewards_batch_and_name() -> None:
    assert ssrl_format_rewards([GOOD, "<think>a</think></think><answer>b</answer>", "nothing"]) == [1.0, 0.5, 0.0]
    assert REWARD_NAMES == ("f1", "em", "substring_em", "format", "ssrl_format", "toolcall_format")


# --- outcome rewards ---------------------------------------------------------------------------


def test_f1_rewards() -> None:
    responses = [
        "<think>x</think><answer>new new york</answer>",  # [new, new, york] vs [new, york]: F1 = 4/5
        "<think>no answer</think>",  # no answer -> 0
        GOOD,  # the answer Paris, not the "Paris" inside the documents
    ]
    golds = [["New York"], ["x"], ["paris"]]
    assert f1_rewards(responses, golds) == pytest.approx([0.8, 0.0, 1.0], abs=1e-12)


def test_em_and_substring_em_rewards() -> None:
    responses = ["<answer>The Eiffel Tower, Paris</answer>", "<answer>eiffel tower</answer>"]
    golds = [["Eiffel Tower"], ["Eiffel Tower"]]
    assert em_rewards(responses, golds) == [0.0, 1.0]
    assert substring_em_rewards(responses, golds) == [1.0, 1.0]


@pytest.mark.parametrize(("normalization", "expected"), [("squad", [0.0, 1.0]), ("unicode", [1.0, 0.0])])
def test_outcome_rewards_use_the_given_normalization(normalization: str, expected: list[float]) -> None:
    # "rock n roll" vs "Rock \u2019n\u2019 roll" matches only under unicode; an empty answer
    # against the gold "the" (normalizes to "") matches only under squad
    responses = ["<answer>rock n roll</answer>", "<answer></answer>"]
    golds = [["Rock \u2019n\u2019 roll"], ["the"]]
    assert em_rewards(responses, golds, normalization=normalization) == expected
    out = weighted_reward({"em": 0.9, "ssrl_format": 0.1}, responses, golds, normalization=normalization)
    assert out.components == {"em": expected, "ssrl_format": [0.0, 0.0]}  # no <think>: format 0
    assert out.total == pytest.approx([0.9 * e for e in expected], abs=1e-12)


def test_answer_inside_information_is_not_rewarded() -> None:
    response = "<think>a</think><search>q</search><information>Doc 1 <answer>Paris</answer></information>"
    assert f1_rewards([response], [["Paris"]]) == [0.0]


def test_invalid_action_message_is_not_an_answer() -> None:
    # ZeroSearch's message "... between <answer> and </answer> ..." would be read as the answer
    # "and": F1 vs "Tom and Jerry" = 2 * 1 * (1/3) / (4/3) = 0.5. Ours scores 0.
    response = "<think>hm</think>oops" + INVALID_ACTION_MESSAGE + "<think>still nothing</think>"
    assert f1_rewards([response], [["Tom and Jerry"]]) == [0.0]


def test_format_rewards_batch() -> None:
    assert format_rewards([GOOD, "<think>a</think><answer>b</answer>", "nothing"]) == [1.0, 0.5, 0.0]


# --- weighted_reward ---------------------------------------------------------------------------


def test_weighted_reward_ssrl() -> None:
    wrong = "<think>I know this.</think><answer>London</answer>"  # EM 0, format 0.5
    out = weighted_reward({"em": 0.9, "format": 0.1}, [GOOD, wrong], [["Paris"], ["Paris"]])
    assert out.components == {"em": [1.0, 0.0], "format": [1.0, 0.5]}
    # 0.9 * 1 + 0.1 * 1 = 1.0;  0.9 * 0 + 0.1 * 0.5 = 0.05
    assert out.total == pytest.approx([1.0, 0.05], abs=1e-12)
    assert out.stats == pytest.approx({"reward/mean": 0.525, "reward/em": 0.5, "reward/format": 0.75}, abs=1e-12)


def test_weighted_reward_f1_only() -> None:
    out = weighted_reward({"f1": 1.0}, ["<answer>new new york</answer>"], [["New York"]])
    assert out.total == pytest.approx([0.8], abs=1e-12)
    assert out.stats == pytest.approx({"reward/mean": 0.8, "reward/f1": 0.8}, abs=1e-12)


def test_weighted_reward_substring_em() -> None:
    out = weighted_reward({"substring_em": 2.0}, ["<answer>in 1995</answer>"], [["1995"]])
    assert out.total == [2.0]
    assert out.components == {"substring_em": [1.0]}


@pytest.mark.parametrize(
    ("weights", "responses", "golds", "match"),
    [
        ({"exact": 1.0}, ["r"], [["g"]], "unknown reward 'exact'"),
        ({}, ["r"], [["g"]], "empty"),
        ({"f1": math.nan}, ["r"], [["g"]], "finite"),
        ({"f1": 1.0}, [], [], "empty batch"),
        ({"f1": 1.0}, ["r", "s"], [["g"]], "2 responses but 1"),
    ],
)
def test_weighted_reward_errors(weights, responses, golds, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        weighted_reward(weights, responses, golds)


def test_weighted_reward_refuses_unknown_normalization_even_for_format_only() -> None:
    with pytest.raises(ValueError, match="normalization='ascii' is not one of squad, unicode"):
        weighted_reward({"format": 1.0}, ["r"], [["g"]], normalization="ascii")


# --- the recipe section ------------------------------------------------------------------------


def test_reward_config_accepts_every_reward_name_and_a_normalization() -> None:
    config = RewardConfig(weights={name: 1.0 for name in REWARD_NAMES})
    config.check("reward")
    assert config.normalization == "squad"  # the papers' rule unless a recipe opts out
    RewardConfig(weights={"em": 0.9, "ssrl_format": 0.1}, normalization="unicode").check("reward")
    with pytest.raises(RecipeError, match=r"reward.normalization='ascii' is not one of squad, unicode"):
        RewardConfig(normalization="ascii").check("reward")
    with pytest.raises(RecipeError, match=r"reward.weights key='ssrl'"):
        RewardConfig(weights={"ssrl": 1.0}).check("reward")
