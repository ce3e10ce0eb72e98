"""Outcome and format rewards for search-agent trajectories.

Every reward takes a batch: `responses[i]` is the text the policy produced for example i (the
response only, never the prompt, including the `<information>` blocks the rollout inserted or,
in self-search, the policy wrote) and `golden_answers[i]` its gold answers. The answer is the
last `<answer>…</answer>` of the response, scored with `simsearch.eval.metrics` under the
normalization the caller names, so training rewards and evaluation tables can never disagree.

- Answer rewards (`ANSWER_METRICS`): `f1` (ZeroSearch's reward), `em` (strict; Search-R1's and
  SSRL's) and `substring_em` (what ZeroSearch reports as "EM").
- Format rewards (`FORMAT_SCORES`): `format`, ours, inspired by SSRL's (`format_score`), and
  `ssrl_format`, SSRL's own rule reproduced exactly (`ssrl_format_score`, compat).
- `toolcall_format` (`TURN_SCORES`): the tool-call protocol's format reward, on the turn records
  (`toolcall_format_score`): 1 when every turn is a readable call and the last one answers.
- `weighted_reward` combines them, e.g. SSRL's `{"em": 0.9, "ssrl_format": 0.1}`, and returns the
  per-component values and their batch means for logging (`reward/f1`, `reward/format`, ...).

- `overlong_penalty` / `shape_overlong`: DAPO's soft overlong punishment (Yu et al. 2025, eq. 13),
  added to the total.

Departure from the papers: the answer extractor skips `<information>` blocks (see
`extract_answer`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from simsearch.eval.metrics import (
    NORMALIZATIONS,
    exact_match,
    extract_answer,
    f1_score,
    substring_exact_match,
)
from simsearch.policy.tags import TAG_NAMES
from simsearch.types import Trajectory, Turn

PLACEHOLDERS: dict[str, tuple[str, ...]] = {
    "search": ("query",),
    "answer": ("beijing",),
}
"""`format`: template text copied from the Search-R1 prompt (`<search> query </search>`, `<answer>
Beijing </answer>`): a block whose whole content, stripped and lowercased, is one of these scores 0."""

MAX_THINK_BLOCKS = 8
"""More `<think>` blocks than this and either format reward is 0 (SSRL)."""

SSRL_PLACEHOLDERS: dict[str, str] = {
    "think": "your thoughts",
    "search": "your query",
    "information": "your information",
    "answer": "your answer",
}
"""`ssrl_format`: a block of this name whose lowercased content contains this phrase scores 0
(SSRL, `verl/workers/reward_manager/naive.py`, lines 315-322)."""

_ALLOWED_TAGS = frozenset(f"<{name}>" for name in TAG_NAMES) | frozenset(f"</{name}>" for name in TAG_NAMES)
# Anything shaped like an XML/HTML tag, attributes and self-closing slash included, so
# `<think id=1>` or `<br/>` is caught as a foreign tag rather than read as plain text.
_ANY_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9_:-]*(?:\s[^<>]*)?/?>")

# SSRL's notion of a tag: any text between "<" and the next ">", across lines too.
_SSRL_ANY_TAG = re.compile(r"<([^>]+)>")
_SSRL_ALLOWED = frozenset(TAG_NAMES) | frozenset(f"/{name}" for name in TAG_NAMES)
_SSRL_KNOWN_TAG = re.compile(r"<(/?(?:think|search|information|answer))>")
_SSRL_BLOCKS = {name: re.compile(rf"<{name}>(.*?)</{name}>", re.DOTALL) for name in TAG_NAMES}
_SSRL_SEARCH_ROUND = ["search", "/search", "information", "/information"]


@dataclass(frozen=True)
class _Block:
    name: str
    content: str
    start: int  # index of "<name>"
    end: int  # index just past "</name>"


def _parse_blocks(text: str) -> list[_Block] | None:
    """Splits text into flat `<name>…</name>` blocks; None if any tag is foreign or unbalanced."""
    tags = list(_ANY_TAG.finditer(text))
    if any(tag.group(0) not in _ALLOWED_TAGS for tag in tags) or len(tags) % 2:
        return None
    blocks = []
    # Blocks never nest: the tags must read open X, close X, open Y, close Y, ...
    for opening, closing in zip(tags[::2], tags[1::2]):
        name = opening.group(0)[1:-1]
        if name.startswith("/") or closing.group(0) != f"</{name}>":
            return None
        content = text[opening.end() : closing.start()]
        blocks.append(_Block(name, content, opening.start(), closing.end()))
    return blocks


def format_score(response: str) -> float:
    """Our format reward in [0, 1] for one response, not its prompt (`format`), inspired by SSRL's.

    The score is 0 unless every rule holds (leading and trailing whitespace of the response is
    ignored; plain text between blocks is allowed):

    1. The only tags are `<think>`, `<search>`, `<information>`, `<answer>` and their closing
       tags, forming flat (never nested) open/close pairs. Any other tag-shaped text (`<b>`,
       `<think id=1>`, `<br/>`) fails, including inside information blocks.
    2. The response starts with `<think>` and ends with `</answer>`.
    3. No block is empty or whitespace-only.
    4. Every `<search>…</search>` sits on one line (no line break inside).
    5. Every `</search>` is followed, with only whitespace between, by an
       `<information>…</information>` block.
    6. There are as many search blocks as information blocks.
    7. No block is template text (`PLACEHOLDERS`, e.g. `<search> query </search>`).
    8. There are at most `MAX_THINK_BLOCKS` (8) think blocks.

    Then, with T think blocks and S search blocks,
    score = min(0.5·T, 1) · min(T, S + 1) / max(T, S + 1): one think and no search scores 0.5,
    one think per search plus one before the answer scores 1.
    """
    text = response.strip()
    if not (text.startswith("<think>") and text.endswith("</answer>")):
        return 0.0
    blocks = _parse_blocks(text)
    if blocks is None:
        return 0.0
    for index, block in enumerate(blocks):
        content = block.content.strip()
        if not content or content.lower() in PLACEHOLDERS.get(block.name, ()):
            return 0.0
        if block.name == "search":
            if "\n" in block.content or "\r" in block.content:
                return 0.0
            following = blocks[index + 1] if index + 1 < len(blocks) else None
            if following is None or following.name != "information":
                return 0.0
            if text[block.end : following.start].strip():
                return 0.0
    num_think = sum(block.name == "think" for block in blocks)
    num_search = sum(block.name == "search" for block in blocks)
    num_information = sum(block.name == "information" for block in blocks)
    if num_search != num_information or num_think > MAX_THINK_BLOCKS:
        return 0.0
    # num_think >= 1: the response starts with a think block.
    balance = min(num_think, num_search + 1) / max(num_think, num_search + 1)
    return min(0.5 * num_think, 1.0) * balance


def ssrl_format_score(response: str) -> float:
    """SSRL's format reward in [0, 1] for one response, not its prompt, reproduced exactly (compat; `ssrl_format`).

    The score is 0 when any of these holds (the response is stripped of surrounding whitespace first):

    1. Some text between `<` and the next `>` (across lines too) is not one of `think`,
       `search`, `information`, `answer` or those with a leading `/`.
    2. The response does not start with `<think>` or does not end with `</answer>`.
    3. It has fewer than 4 of the eight known tags.
    4. A block found by the non-greedy pattern `<name>(.*?)</name>` is empty or whitespace-only,
       a search block holds a `\n`, or a block contains its `SSRL_PLACEHOLDERS` phrase
       (case-insensitive).
    5. The first two known tags are not `<think>`, `</think>`, or the last two not `<answer>`,
       `</answer>`.
    6. Between those, some `<search>` is not immediately followed by the tags `</search>`,
       `<information>`, `</information>` (other tags and any text elsewhere are not checked).
    7. The counts of the strings `<search>` and `<information>` differ.
    8. The string `<think>` occurs more than `MAX_THINK_BLOCKS` (8) times.

    Otherwise, with T occurrences of `<think>` and S of `<search>`,
    score = min(0.5·T, 1) · min(T, S + 1) / max(T, S + 1).
    """
    text = response.strip()
    if any(tag not in _SSRL_ALLOWED for tag in _SSRL_ANY_TAG.findall(text)):
        return 0.0
    if not (text.startswith("<think>") and text.endswith("</answer>")):
        return 0.0
    tags = _SSRL_KNOWN_TAG.findall(text)
    if len(tags) < 4:
        return 0.0
    for name, pattern in _SSRL_BLOCKS.items():
        for content in pattern.findall(text):
            if not content.strip() or SSRL_PLACEHOLDERS[name] in content.lower():
                return 0.0
            if name == "search" and "\n" in content:
                return 0.0
    if tags[:2] != ["think", "/think"] or tags[-2:] != ["answer", "/answer"]:
        return 0.0
    middle = tags[2:-2]
    index = 0
    while index < len(middle):
        if middle[index] != "search":
            index += 1
            continue
        if middle[index : index + 4] != _SSRL_SEARCH_ROUND:
            return 0.0
        index += 4
    num_think = text.count("<think>")
    num_search = text.count("<search>")
    if num_search != text.count("<information>") or num_think > MAX_THINK_BLOCKS:
        return 0.0
    balance = min(num_think, num_search + 1) / max(num_think, num_search + 1)
    return min(0.5 * num_think, 1.0) * balance


def toolcall_format_score(turns: Sequence[Turn]) -> float:
    """The tool-call protocol's format reward for one trajectory (`toolcall_format`).

    1.0 when the trajectory is well formed: every turn before the last is a search whose calls
    could all be read, and the last turn answers with no unreadable call in it; else 0.0.
    """
    if not turns or turns[-1].action != "answer":
        return 0.0
    well_formed = all(turn.action == "search" for turn in turns[:-1])
    return 1.0 if well_formed and not any(turn.call_reasons for turn in turns) else 0.0


def _check_batch(responses: Sequence[str], golden_answers: Sequence[Sequence[str]]) -> None:
    if len(responses) != len(golden_answers):
        raise ValueError(
            f"got {len(responses)} responses but {len(golden_answers)} golden_answers lists; "
            "pass one list of gold answers per response"
        )


def _answer_rewards(
    metric: Callable[..., float],
    responses: Sequence[str],
    golden_answers: Sequence[Sequence[str]],
    normalization: str,
    answers: Sequence[str | None] | None = None,
) -> list[float]:
    _check_batch(responses, golden_answers)
    if answers is None:
        answers = [extract_answer(r) for r in responses]
    return [metric(answer, golds, normalization=normalization) for answer, golds in zip(answers, golden_answers)]


def f1_rewards(
    responses: Sequence[str], golden_answers: Sequence[Sequence[str]], *, normalization: str = "unicode"
) -> list[float]:
    """Token F1 of each response's last answer against its gold answers (0 without an answer).

    Args:
        responses: Response texts, one per example.
        golden_answers: Gold answers, one list per example.
        normalization: A name from `simsearch.eval.metrics.NORMALIZATIONS`.

    Returns:
        One reward in [0, 1] per response.
    """
    return _answer_rewards(f1_score, responses, golden_answers, normalization)


def em_rewards(
    responses: Sequence[str], golden_answers: Sequence[Sequence[str]], *, normalization: str = "unicode"
) -> list[float]:
    """Strict exact match of each response's last answer (0 without an answer).

    Args:
        responses: Response texts, one per example.
        golden_answers: Gold answers, one list per example.
        normalization: A name from `simsearch.eval.metrics.NORMALIZATIONS`.

    Returns:
        One reward in {0, 1} per response.
    """
    return _answer_rewards(exact_match, responses, golden_answers, normalization)


def substring_em_rewards(
    responses: Sequence[str], golden_answers: Sequence[Sequence[str]], *, normalization: str = "unicode"
) -> list[float]:
    """Substring exact match (gold inside prediction) of each response's last answer.

    Args:
        responses: Response texts, one per example.
        golden_answers: Gold answers, one list per example.
        normalization: A name from `simsearch.eval.metrics.NORMALIZATIONS`.

    Returns:
        One reward in {0, 1} per response.
    """
    return _answer_rewards(substring_exact_match, responses, golden_answers, normalization)


def format_rewards(responses: Sequence[str]) -> list[float]:
    """`format_score` (ours) of each response.

    Args:
        responses: Response texts.

    Returns:
        One reward in [0, 1] per response.
    """
    return [format_score(response) for response in responses]


def ssrl_format_rewards(responses: Sequence[str]) -> list[float]:
    """`ssrl_format_score` (SSRL's exact rule) of each response.

    Args:
        responses: Response texts.

    Returns:
        One reward in [0, 1] per response.
    """
    return [ssrl_format_score(response) for response in responses]


ANSWER_METRICS: dict[str, Callable[..., float]] = {
    "f1": f1_score,
    "em": exact_match,
    "substring_em": substring_exact_match,
}
"""Reward components scored on the extracted answer, by name: `metric(answer, golds, normalization=)`."""

FORMAT_SCORES: dict[str, Callable[[str], float]] = {
    "format": format_score,
    "ssrl_format": ssrl_format_score,
}
"""Reward components scored on the response's tags alone, by name."""

TURN_SCORES: dict[str, Callable[[Sequence[Turn]], float]] = {
    "toolcall_format": toolcall_format_score,
}
"""Reward components scored on a trajectory's turn records, by name."""

REWARD_NAMES: tuple[str, ...] = (*ANSWER_METRICS, *FORMAT_SCORES, *TURN_SCORES)
"""Every reward component name: the keys `reward.weights` accepts."""


@dataclass
class RewardOutput:
    """Rewards of a batch and what to log about them.

    Attributes:
        total: The weighted sum per response.
        components: Each weighted component's unweighted values per response, by name.
        stats: Batch means: `reward/mean` for the total and `reward/<name>` per component.
    """

    total: list[float]
    components: dict[str, list[float]]
    stats: dict[str, float]


def _component(
    name: str,
    responses: Sequence[str],
    golden_answers: Sequence[Sequence[str]],
    normalization: str,
    answers: Sequence[str | None] | None,
    turns: Sequence[Sequence[Turn]] | None,
) -> list[float]:
    if name in ANSWER_METRICS:
        return _answer_rewards(ANSWER_METRICS[name], responses, golden_answers, normalization, answers)
    if name in FORMAT_SCORES:
        return [FORMAT_SCORES[name](response) for response in responses]
    if name in TURN_SCORES:
        if turns is None:
            raise ValueError(f"reward {name!r} is scored on turn records: pass turns=")
        return [TURN_SCORES[name](trajectory_turns) for trajectory_turns in turns]
    raise ValueError(f"unknown reward {name!r} in the reward weights; use one of {list(REWARD_NAMES)}")


def weighted_reward(
    weights: dict[str, float],
    responses: Sequence[str],
    golden_answers: Sequence[Sequence[str]],
    *,
    normalization: str = "unicode",
    answers: Sequence[str | None] | None = None,
    turns: Sequence[Sequence[Turn]] | None = None,
) -> RewardOutput:
    """Weighted sum of reward components, e.g. SSRL's `{"em": 0.9, "ssrl_format": 0.1}`.

    Args:
        weights: Weight per component name, from `REWARD_NAMES`; at least one.
        responses: Response texts, one per example (non-empty batch).
        golden_answers: Gold answers, one list per example.
        normalization: How answer components normalize answers, a name from
            `simsearch.eval.metrics.NORMALIZATIONS`.
        answers: The answer of each response when the caller read it already (the tool-call
            protocol reads it from the final assistant message); None = `extract_answer(response)`.
        turns: Each response's turn records, for `TURN_SCORES` components.

    Returns:
        The totals, the unweighted component values and their batch means.

    Raises:
        ValueError: On an unknown component name or normalization, a non-finite weight, no
            weights, an empty batch, or mismatched batch lengths.
    """
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization={normalization!r} is not one of {', '.join(NORMALIZATIONS)}")
    if not weights:
        raise ValueError(f"reward weights are empty; give at least one of {list(REWARD_NAMES)}")
    if not responses:
        raise ValueError("cannot score an empty batch of responses")
    _check_batch(responses, golden_answers)
    for name, weight in weights.items():
        if not math.isfinite(weight):
            raise ValueError(f"reward weight for {name!r} must be finite, got {weight}")
    if answers is not None:
        _check_batch(answers, golden_answers)  # type: ignore[arg-type]  # only the lengths are compared
    if turns is not None:
        _check_batch(turns, golden_answers)  # type: ignore[arg-type]  # only the lengths are compared
    components = {name: _component(name, responses, golden_answers, normalization, answers, turns) for name in weights}
    total = [sum(weights[name] * values[i] for name, values in components.items()) for i in range(len(responses))]
    stats = {"reward/mean": sum(total) / len(total)}
    for name, values in components.items():
        stats[f"reward/{name}"] = sum(values) / len(values)
    return RewardOutput(total=total, components=components, stats=stats)


def overlong_penalty(length: int, max_length: int, buffer: int, penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment of one response (Yu et al. 2025, eq. 13), scaled by `penalty`.

    0 up to max_length - buffer, then falling linearly to -penalty at max_length:
    penalty x (max_length - buffer - length) / buffer; -penalty beyond max_length. verl's
    `DAPORewardManager` (`verl/workers/reward_manager/dapo.py`) computes the same inside the
    buffer (its responses never exceed the limit). What `length` and `max_length` count is the
    caller's choice (`simsearch train`: see `policy.step.step_rewards`).

    Args:
        length: Tokens of the response.
        max_length: The limit L_max (> buffer).
        buffer: Tokens before the limit where the penalty grows (L_cache); 0 = no penalty.
        penalty: The penalty at and beyond the limit (>= 0).

    Returns:
        The penalty, in [-penalty, 0].
    """
    if buffer < 0 or penalty < 0 or not math.isfinite(penalty):
        raise ValueError(f"overlong_penalty needs buffer >= 0 and a finite penalty >= 0, got {buffer} and {penalty}")
    if buffer == 0:
        return 0.0
    if buffer >= max_length:
        raise ValueError(f"overlong_penalty: buffer={buffer} must be below max_length={max_length}")
    if length > max_length:
        return -penalty
    return min(penalty * (max_length - buffer - length) / buffer, 0.0)


def shape_overlong(
    output: RewardOutput, lengths: Sequence[int], max_length: int, buffer: int, penalty: float = 1.0
) -> RewardOutput:
    """`output` with DAPO's `overlong_penalty` of each response added to its total.

    Args:
        output: The rewards of a batch (`weighted_reward`).
        lengths: Tokens of each response, in `output`'s order.
        max_length: The limit L_max.
        buffer: The overlong buffer (0 returns `output` unchanged).
        penalty: The penalty at the limit.

    Returns:
        The shaped totals; `reward/mean` of the shaped totals, plus `reward/overlong` (mean
        penalty) and `reward/overlong_share` (share of responses penalized). The components stay
        the unshaped scores.
    """
    if buffer == 0:
        return output
    if len(lengths) != len(output.total):
        raise ValueError(f"shape_overlong got {len(lengths)} lengths for {len(output.total)} rewards")
    penalties = [overlong_penalty(length, max_length, buffer, penalty) for length in lengths]
    total = [reward + extra for reward, extra in zip(output.total, penalties)]
    stats = {
        **output.stats,
        "reward/mean": sum(total) / len(total),
        "reward/overlong": sum(penalties) / len(penalties),
        "reward/overlong_share": sum(extra < 0 for extra in penalties) / len(penalties),
    }
    return RewardOutput(total=total, components=output.components, stats=stats)


def score_trajectories(
    trajectories: Sequence[Trajectory], weights: dict[str, float], *, normalization: str = "unicode"
) -> RewardOutput:
    """Scores trajectories with `weighted_reward` on their response text.

    Args:
        trajectories: Finished trajectories.
        weights: Reward component weights, e.g. `{"f1": 1.0}` or `{"em": 0.9, "ssrl_format": 0.1}`.
        normalization: How answers are normalized (`simsearch.eval.metrics.NORMALIZATIONS`).

    Returns:
        Per-trajectory totals and components, plus `reward/...` batch means.

    The answer components score `Trajectory.answer` (the protocol's answer: for the tag protocol
    the last answer of the response, for tool-call the answer of the final assistant message).
    """
    return weighted_reward(
        weights,
        [trajectory.response_text for trajectory in trajectories],
        [trajectory.example.golden_answers for trajectory in trajectories],
        normalization=normalization,
        answers=[trajectory.answer for trajectory in trajectories],
        turns=[trajectory.turns for trajectory in trajectories],
    )
