"""Answer normalization, EM, substring EM, F1 and answer extraction, on hand-worked strings.

Tests without a `normalization` argument exercise the library default, `unicode`; the `squad`
cases follow the SQuAD v1.1 `normalize_answer` that Search-R1, ZeroSearch and SSRL copy
(lowercase, delete `string.punctuation`, replace whole-word a/an/the by a space, collapse
whitespace) and their `em_check` / `subem_check`, which keep golds that normalize to "".
"""

from __future__ import annotations

import pytest

from simsearch.eval.metrics import (
    NORMALIZATIONS,
    exact_match,
    extract_answer,
    f1_score,
    has_gold_answer,
    normalize_answer,
    substring_exact_match,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # lowercase, punctuation deleted, whitespace collapsed
        ("The  Quick, Brown fox!", "quick brown fox"),
        # punctuation is deleted, not replaced by a space (SQuAD): U.S.A. -> usa
        ("U.S.A.", "usa"),
        # all three articles go, as whole words only
        ("An apple a day keeps THE doctor away", "apple day keeps doctor away"),
        ("theater Anna another", "theater anna another"),
        # an article glued to punctuation is still a word once the punctuation is gone
        ("(the) end", "end"),
        # ASCII symbols are in string.punctuation, so they go too
        ("$5 + 3 = 8", "5 3 8"),
        ("", ""),
        ("  ...  ", ""),
    ],
)
def test_normalize_answer_ascii(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # curly apostrophe (Pf) deleted like the ASCII one
        ("O\u2019Neill", "oneill"),
        ("O'Neill", "oneill"),
        # curly quotes (Pi/Pf) and an em dash (Pd) between spaces
        ("\u201cHello\u201d \u2014 world", "hello world"),
        # inverted question mark (Po) and accent kept
        ("\u00bfQu\u00e9?", "qu\u00e9"),
        # CJK full stop (Po) deleted
        ("\u5317\u4eac\u3002", "\u5317\u4eac"),
        # non-ASCII symbols (Sc, So) are kept: they are not punctuation
        ("\u20ac5 at 30\u00b0", "\u20ac5 at 30\u00b0"),
        # Unicode lowercase
        ("\u00c9COLE", "\u00e9cole"),
        # no-break spaces are whitespace
        ("x\u00a0\u00a0y", "x y"),
    ],
)
def test_normalize_answer_unicode(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_normalize_answer_composes_accents() -> None:
    # "e" + combining acute (NFD) and precomposed "é" (NFC) are the same answer
    assert normalize_answer("Jose\u0301") == normalize_answer("Jos\u00e9") == "jos\u00e9"
    # but accents are not stripped
    assert normalize_answer("Jos\u00e9") != normalize_answer("Jose")


def test_exact_match() -> None:
    assert exact_match("the Eiffel Tower.", ["Eiffel Tower"]) == 1.0
    assert exact_match("Eiffel", ["Eiffel Tower"]) == 0.0
    assert exact_match("Eiffel Tower in Paris", ["Eiffel Tower"]) == 0.0
    # max over golds: the second gold matches
    assert exact_match("nyc", ["New York City", "N.Y.C."]) == 1.0
    assert exact_match("O\u2019Neill", ["o'neill"]) == 1.0


def test_substring_exact_match() -> None:
    assert substring_exact_match("It is the Eiffel Tower, in Paris", ["eiffel tower"]) == 1.0
    assert substring_exact_match("Paris", ["Eiffel Tower"]) == 0.0
    # the gold must sit inside the prediction, not the other way round
    assert substring_exact_match("Eiffel", ["Eiffel Tower"]) == 0.0
    assert substring_exact_match("Paris", ["London", "paris, france", "Paris"]) == 1.0
    # character-level: the documented over-credit
    assert substring_exact_match("1995", ["5"]) == 1.0


def test_f1_hand_worked() -> None:
    # pred tokens [cat, sat, on, mat], gold tokens [cat, on, mat]: overlap 3,
    # P = 3/4, R = 3/3, F1 = 2 * 0.75 * 1 / 1.75 = 6/7
    assert f1_score("The cat sat on the mat", ["a cat on a mat"]) == pytest.approx(6 / 7, abs=1e-12)
    # multiset overlap: [new, new, york] vs [new, york] -> overlap 2, P = 2/3, R = 1, F1 = 4/5
    assert f1_score("new new york", ["New York"]) == pytest.approx(0.8, abs=1e-12)
    assert f1_score("Paris", ["London"]) == 0.0
    assert f1_score("Paris!", ["paris"]) == 1.0


def test_f1_max_over_golds() -> None:
    # vs "obama": overlap 1, P = 1/2, R = 1 -> 2/3
    # vs "barack hussein obama": overlap 2, P = 1, R = 2/3 -> 0.8; the max is 0.8
    assert f1_score("Barack Obama", ["Obama", "Barack Hussein Obama"]) == pytest.approx(0.8, abs=1e-12)


@pytest.mark.parametrize("metric", [exact_match, substring_exact_match, f1_score])
def test_empty_cases_score_zero(metric) -> None:
    # an empty normalized gold never matches, not even an empty prediction
    assert metric("", [""]) == 0.0
    assert metric("the", ["a"]) == 0.0  # both normalize to ""
    assert metric("anything at all", [""]) == 0.0
    assert metric("anything at all", ["The", "?!"]) == 0.0
    # an empty prediction matches nothing
    assert metric("", ["Paris"]) == 0.0
    assert metric("...", ["Paris"]) == 0.0
    # a missing answer scores 0
    assert metric(None, ["Paris"]) == 0.0
    # no gold answers at all
    assert metric("Paris", []) == 0.0
    # empty golds are skipped, the remaining gold still counts
    assert metric("Paris", ["", "Paris"]) == 1.0


@pytest.mark.parametrize("metric", [exact_match, substring_exact_match, f1_score])
def test_bare_string_gold_is_rejected(metric) -> None:
    with pytest.raises(TypeError, match="wrap it"):
        metric("Paris", "Paris")


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("<think>easy</think>\n<answer> Paris </answer>", "Paris"),
        # the last complete answer wins
        ("<answer>London</answer> no wait <answer>Paris</answer>", "Paris"),
        # multi-line content
        ("<answer>\nNew\nYork\n</answer>", "New\nYork"),
        # an unclosed trailing answer is ignored
        ("<answer>Paris</answer> then <answer>Lond", "Paris"),
        # the nearest opener before the last closer
        ("<answer>a <answer>b</answer>", "b"),
        # an empty answer is an answer, and scores 0 later
        ("<answer>  </answer>", ""),
        # a stray closer after the block does not extend it (found by the fuzz test)
        ("<answer></answer></answer>", ""),
        ("<answer> Paris </answer> done </answer>", "Paris"),
        # an answer tag inside retrieved documents is not the policy's answer
        (
            "<answer>Paris</answer><information>Doc 1(Title: x) <answer>Rome</answer></information>",
            "Paris",
        ),
        # ... also when the documents span several lines
        ("<answer>Paris</answer><information>Doc 1\n<answer>Rome</answer>\nDoc 2</information>", "Paris"),
    ],
)
def test_extract_answer(response: str, expected: str) -> None:
    assert extract_answer(response) == expected


@pytest.mark.parametrize(
    "response",
    [
        "",
        "<think>no idea</think>",
        "</answer>",
        "<answer>Paris",
        "answer: Paris",
        "<search>q</search>\n\n<information>Doc 1 <answer>Rome</answer></information>",
    ],
)
def test_extract_answer_absent(response: str) -> None:
    assert extract_answer(response) is None


def test_response_without_answer_does_not_score_prompt_example() -> None:
    # ZeroSearch's bug: scanning the prompt found its "<answer> Beijing </answer>" example.
    # Only the response is passed here, so a response without an answer scores 0.
    response = "<think>I should guess</think>"
    assert f1_score(extract_answer(response), ["Beijing"]) == 0.0


# --- normalization: squad (the papers') vs unicode (ours) ----------------------------------------


@pytest.mark.parametrize(
    ("text", "squad", "unicode"),
    [
        # curly apostrophes are not in string.punctuation: squad keeps them
        ("Rock \u2019n\u2019 roll", "rock \u2019n\u2019 roll", "rock n roll"),
        ("O\u2019Neill", "o\u2019neill", "oneill"),
        # inverted question mark kept by squad, the ASCII "?" deleted by both
        ("\u00bfQu\u00e9?", "\u00bfqu\u00e9", "qu\u00e9"),
        # em dash and curly quotes kept by squad
        ("\u201cHi\u201d \u2014 yo", "\u201chi\u201d \u2014 yo", "hi yo"),
        # no NFC under squad: e + combining acute stays two code points
        ("Jose\u0301", "jose\u0301", "jos\u00e9"),
        # punctuation goes before articles: "t.he" becomes the word "the", then goes
        ("t.he cat", "cat", "cat"),
        # ASCII punctuation and symbols: the same under both
        ("$5 + 3 = 8", "5 3 8", "5 3 8"),
        ("An apple, THE end!", "apple end", "apple end"),
    ],
)
def test_squad_and_unicode_normalization(text: str, squad: str, unicode: str) -> None:
    assert normalize_answer(text, normalization="squad") == squad
    assert normalize_answer(text, normalization="unicode") == unicode


def test_rock_n_roll_matches_only_under_unicode() -> None:
    # squad: "rock n roll" != "rock \u2019n\u2019 roll"; unicode: both "rock n roll"
    for metric in (exact_match, substring_exact_match):
        assert metric("rock n roll", ["Rock \u2019n\u2019 roll"], normalization="squad") == 0.0
        assert metric("rock n roll", ["Rock \u2019n\u2019 roll"], normalization="unicode") == 1.0
    # F1: tokens {rock, n, roll} vs {rock, \u2019n\u2019, roll}: overlap 2, P = R = 2/3 -> 2/3
    squad_f1 = f1_score("rock n roll", ["Rock \u2019n\u2019 roll"], normalization="squad")
    assert squad_f1 == pytest.approx(2 / 3, abs=1e-12)
    assert f1_score("rock n roll", ["Rock \u2019n\u2019 roll"], normalization="unicode") == 1.0


@pytest.mark.parametrize("gold", ["!!!", "the", "", "A"])
def test_empty_gold_matches_under_squad_only(gold: str) -> None:
    # squad: the gold normalizes to "", which equals an empty prediction and is in every one
    assert exact_match("", [gold], normalization="squad") == 1.0
    assert exact_match("...", [gold], normalization="squad") == 1.0
    assert exact_match("Paris", [gold], normalization="squad") == 0.0
    assert substring_exact_match("Paris", [gold], normalization="squad") == 1.0
    # F1 has no tokens to share: 0 under both, as ZeroSearch's f1_score_cal
    assert f1_score("", [gold], normalization="squad") == 0.0
    assert f1_score("Paris", [gold], normalization="squad") == 0.0
    # unicode: such a gold never matches
    for metric in (exact_match, substring_exact_match, f1_score):
        assert metric("", [gold], normalization="unicode") == 0.0
        assert metric("Paris", [gold], normalization="unicode") == 0.0


@pytest.mark.parametrize("normalization", ["squad", "unicode"])
@pytest.mark.parametrize("metric", [exact_match, substring_exact_match, f1_score])
def test_missing_answer_scores_zero_under_both(metric, normalization: str) -> None:
    assert metric(None, ["Paris"], normalization=normalization) == 0.0
    assert metric(None, [""], normalization=normalization) == 0.0
    assert metric("Paris", [], normalization=normalization) == 0.0


def test_unknown_normalization_is_refused() -> None:
    assert set(NORMALIZATIONS) == {"squad", "unicode"}
    with pytest.raises(ValueError, match="normalization='ascii' is not one of squad, unicode"):
        exact_match("Paris", ["Paris"], normalization="ascii")
    with pytest.raises(ValueError, match="normalization='ascii'"):
        normalize_answer("Paris", normalization="ascii")


def test_has_gold_answer_needs_a_gold_left_after_normalization() -> None:
    assert has_gold_answer(["The", "Velmora"]) and has_gold_answer(["1873"])
    assert not has_gold_answer(["a", "the", "..."]) and not has_gold_answer([])
