"""Answer scoring shared by training rewards and evaluation reports.

Two normalizations (`NORMALIZATIONS`):

- `squad`: the SQuAD v1.1 `normalize_answer`: lowercase, delete ASCII punctuation, replace the
  whole words a/an/the by a space, collapse whitespace. A gold answer that normalizes to "" is
  kept: it equals an empty prediction and is a substring of every prediction.
- `unicode`: NFC first; every Unicode punctuation character (`P*`) is deleted too, so `O’Neill`
  matches `O'Neill`. A gold answer that normalizes to "" never matches under any metric.

Under both, a missing prediction (`None`) scores 0 under every metric.
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
    """One way to normalize answers: `normalize`, whether a gold answer normalizing to "" still takes
    part (`keeps_empty_golds`), and a one-line `summary` for report captions.
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
    """Normalizes an answer string under `normalization` (a name from `NORMALIZATIONS`).

    Lowercased, punctuation deleted (`"U.S."` -> `"us"`), a/an/the removed, whitespace collapsed
    and stripped.

    Raises:
        ValueError: An unknown normalization.
    """
    return _normalization(normalization).normalize(text)


def has_gold_answer(golds: Sequence[str], *, normalization: str = "unicode") -> bool:
    """Whether some gold answer is left after normalization (a gold of only articles or punctuation is not)."""
    return any(normalize_answer(gold, normalization=normalization) for gold in golds)


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
    """1.0 when the normalized prediction equals some normalized gold answer, else 0.0 (Search-R1's
    and SSRL's "EM"); 0.0 when `pred` is None or no gold answer is left.
    """
    normalized_golds = _normalized_golds(golds, normalization)
    if pred is None:
        return 0.0
    prediction = normalize_answer(pred, normalization=normalization)
    return float(any(prediction == gold for gold in normalized_golds))


def substring_exact_match(pred: str | None, golds: Sequence[str], *, normalization: str = "unicode") -> float:
    """1.0 when some normalized gold answer is a substring of the normalized prediction, else 0.0
    (ZeroSearch's "EM"); 0.0 when `pred` is None or no gold answer is left. It matches characters,
    so gold `"5"` is found in `"1995"`.
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
    """Token-overlap F1 (multiset of whitespace words) against the best gold answer, in [0, 1]; 0.0
    when `pred` is None, the prediction or gold has no tokens, or no gold answer is left.
    """
    normalized_golds = _normalized_golds(golds, normalization)
    if pred is None:
        return 0.0
    prediction_tokens = normalize_answer(pred, normalization=normalization).split()
    scores = (_token_f1(prediction_tokens, gold.split()) for gold in normalized_golds)
    return max(scores, default=0.0)


def extract_answer(response: str) -> str | None:
    """The last complete `<answer>…</answer>` of a generated response (never pass the prompt),
    stripped; None when there is none.

    The last `<answer>` with a `</answer>` after it, paired with the first such `</answer>`; an
    unclosed trailing `<answer>` and anything inside complete `<information>` blocks are ignored.
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
