"""Answer scoring shared by training rewards and evaluation reports.

Two normalizations (`NORMALIZATIONS`), chosen by the caller:

- `squad`: the SQuAD v1.1 evaluation script's `normalize_answer`, which Search-R1
  (`verl/utils/reward_score/qa_em.py`, lines 19-33), ZeroSearch (same file, lines 22-36) and SSRL
  (`verl/workers/reward_manager/naive.py`, lines 43-57) copy: lowercase, delete ASCII
  punctuation (`string.punctuation`), replace the whole words a/an/the by a space, collapse
  whitespace, in that order. A gold answer that normalizes to "" is kept, as there: it equals an
  empty prediction and is a substring of every prediction.
- `unicode`: ours. It departs from `squad` in three ways. Text is put in NFC form first (a
  precomposed `é` equals `e` + combining accent; full-width letters and ligatures are not
  folded). Every character whose Unicode category is punctuation (`P*`: curly quotes, en/em
  dashes, `¿`, `。`) is deleted too, so `O’Neill` matches `O'Neill`; symbols outside ASCII (`€`,
  `°`) and accents are kept. A gold answer that normalizes to "" (`""`, `"The"`, `"?"`) is a data
  error, not an answer: it never matches under any metric, since otherwise it would reward an
  empty answer (EM) or every answer (substring EM).

Under both, a missing prediction (`None`, what `extract_answer` returns when the response has no
answer) scores 0 under every metric, as in the references that handle it.

Which "EM" the papers report: Search-R1 and SSRL report strict `exact_match` (equality after
normalization: Search-R1's `em_check`, SSRL's `em_check` at naive.py line 108); ZeroSearch
reports `substring_exact_match` (its `em_check` tests containment, qa_em.py line 87).
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_ASCII_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_INFORMATION_BLOCK = re.compile(r"<information>.*?</information>", re.DOTALL)
# The answer tags, defined here, the lowest floor that reads them; `policy.tags` takes them for the
# agent's tag language (docs/architecture.md: eval may not import policy).
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"


def _is_punctuation(char: str) -> bool:
    return char in _ASCII_PUNCTUATION or unicodedata.category(char).startswith("P")


def _normalize_squad(text: str) -> str:
    text = text.lower()
    text = "".join(char for char in text if char not in _ASCII_PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _normalize_unicode(text: str) -> str:
    text = unicodedata.normalize("NFC", text).lower()
    text = "".join(char for char in text if not _is_punctuation(char))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


@dataclass(frozen=True)
class Normalization:
    """One way to normalize answers before comparing them.

    Attributes:
        normalize: The string function.
        keeps_empty_golds: Whether a gold answer that normalizes to "" still takes part in
            matching (as in SQuAD and the papers) or is dropped (ours).
        summary: One line saying what it does, for report captions.
    """

    normalize: Callable[[str], str]
    keeps_empty_golds: bool
    summary: str


NORMALIZATIONS: dict[str, Normalization] = {
    "squad": Normalization(
        _normalize_squad,
        keeps_empty_golds=True,
        summary="SQuAD v1.1 as Search-R1, ZeroSearch and SSRL: lowercase, ASCII punctuation deleted, "
        'a/an/the dropped; a gold answer that normalizes to "" still matches',
    ),
    "unicode": Normalization(
        _normalize_unicode,
        keeps_empty_golds=False,
        summary="ours: SQuAD v1.1 plus NFC and every Unicode punctuation mark deleted; "
        'a gold answer that normalizes to "" never matches',
    ),
}
"""Answer normalizations by name (module docstring): the choices of the recipes' `normalization`."""


def _normalization(name: str) -> Normalization:
    if name not in NORMALIZATIONS:
        raise ValueError(f"normalization={name!r} is not one of {', '.join(NORMALIZATIONS)}")
    return NORMALIZATIONS[name]


def normalize_answer(text: str, *, normalization: str = "unicode") -> str:
    """Normalizes an answer string for comparison.

    Args:
        text: A predicted or gold answer.
        normalization: A name from `NORMALIZATIONS` (module docstring).

    Returns:
        The text lowercased, without punctuation (deleted, not replaced by a space, as in SQuAD:
        `"U.S."` -> `"us"`), without the words a/an/the, with whitespace runs collapsed to one
        space and no leading or trailing whitespace.

    Raises:
        ValueError: An unknown normalization.
    """
    return _normalization(normalization).normalize(text)


def _normalized_golds(golds: Sequence[str], normalization: str) -> list[str]:
    # A bare string would silently be scored character by character.
    if isinstance(golds, str):
        raise TypeError(f"golds must be a list of gold answers, got the string {golds!r}; wrap it: [{golds!r}]")
    rule = _normalization(normalization)
    normalized = [rule.normalize(gold) for gold in golds]
    if rule.keeps_empty_golds:
        return normalized
    return [gold for gold in normalized if gold]


def exact_match(pred: str | None, golds: Sequence[str], *, normalization: str = "unicode") -> float:
    """Scores 1.0 when the normalized prediction equals some normalized gold answer.

    This is the metric Search-R1 and SSRL report as "EM".

    Args:
        pred: The predicted answer, or None when the response gave none.
        golds: The gold answers.
        normalization: A name from `NORMALIZATIONS`; under `unicode` golds that normalize to ""
            are ignored, under `squad` they equal an empty prediction.

    Returns:
        1.0 or 0.0; 0.0 when `pred` is None or no gold answer is left after normalization.
    """
    normalized_golds = _normalized_golds(golds, normalization)
    if pred is None:
        return 0.0
    prediction = normalize_answer(pred, normalization=normalization)
    return float(any(prediction == gold for gold in normalized_golds))


def substring_exact_match(pred: str | None, golds: Sequence[str], *, normalization: str = "unicode") -> float:
    """Scores 1.0 when some normalized gold answer is a substring of the normalized prediction.

    This is the metric ZeroSearch reports as "EM" ("cover EM"). It matches on characters, not
    words, so it over-credits: gold `"5"` is found in `"1995"`, and any long prediction listing
    many candidates scores 1.

    Args:
        pred: The predicted answer, or None when the response gave none.
        golds: The gold answers.
        normalization: A name from `NORMALIZATIONS`; under `unicode` golds that normalize to ""
            are ignored, under `squad` they are a substring of every prediction.

    Returns:
        1.0 or 0.0; 0.0 when `pred` is None or no gold answer is left after normalization.
    """
    normalized_golds = _normalized_golds(golds, normalization)
    if pred is None:
        return 0.0
    prediction = normalize_answer(pred, normalization=normalization)
    return float(any(gold in prediction for gold in normalized_golds))


def _token_f1(prediction_tokens: list[str], gold_tokens: list[str]) -> float:
    overlap = sum((Counter(prediction_tokens) & Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(prediction_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(pred: str | None, golds: Sequence[str], *, normalization: str = "unicode") -> float:
    """Token-overlap F1 between the normalized prediction and the best gold answer.

    Tokens are the whitespace-separated words of the normalized strings; overlap counts
    repeated tokens at most as often as they occur in both (a multiset intersection). A gold or
    prediction with no tokens scores 0 against anything, under both normalizations (as in
    ZeroSearch's `f1_score_cal`).

    Args:
        pred: The predicted answer, or None when the response gave none.
        golds: The gold answers.
        normalization: A name from `NORMALIZATIONS`.

    Returns:
        The maximum F1 over gold answers, in [0, 1]; 0.0 when `pred` is None, the prediction
        normalizes to "" or no gold answer is left after normalization.
    """
    normalized_golds = _normalized_golds(golds, normalization)
    if pred is None:
        return 0.0
    prediction_tokens = normalize_answer(pred, normalization=normalization).split()
    scores = (_token_f1(prediction_tokens, gold.split()) for gold in normalized_golds)
    return max(scores, default=0.0)


def extract_answer(response: str) -> str | None:
    """Returns the last complete `<answer>…</answer>` of a response, stripped of whitespace.

    Pass the generated response only, never the prompt: the Search-R1 prompt holds its own
    `<answer> Beijing </answer>` example, which ZeroSearch's extractor had to skip by counting
    matches. Content inside complete `<information>…</information>` blocks is ignored, because
    those documents come from a search engine (or, in self-search, are the policy's imagined
    documents) and an answer tag inside them is not the policy's answer; a simulator that knows
    the gold answer could otherwise hand out reward.

    "Last complete" means: the last `<answer>` that has a `</answer>` after it, paired with the
    first such `</answer>` (as the references' non-greedy `<answer>(.*?)</answer>`, last match);
    an unclosed trailing `<answer>` is ignored. Content may span several lines.

    Args:
        response: The policy's generated text.

    Returns:
        The answer text with surrounding whitespace removed (possibly ""), or None when the
        response has no complete answer block.
    """
    text = _INFORMATION_BLOCK.sub(" ", response)
    close = text.rfind(ANSWER_CLOSE)
    if close == -1:
        return None
    open_ = text.rfind(ANSWER_OPEN, 0, close)
    if open_ == -1:
        return None
    start = open_ + len(ANSWER_OPEN)
    # A stray `</answer>` after the block does not extend it: `<answer> a </answer> </answer>` is "a".
    return text[start : text.find(ANSWER_CLOSE, start)].strip()
