"""The agent's tag language: `<think>`, `<search>`, `<information>`, `<answer>`.

The policy writes `<think>…</think>`, then either `<search>query</search>` (the rollout answers
with `<information>documents</information>`) or `<answer>…</answer>`. Generation of one turn
stops at the first `</search>` or `</answer>` (`STOP_STRINGS`). Patterns match across lines;
`parse_action` reads the turn's last complete block; an empty query is an invalid action.
`TagProtocol` is this language as the agent loop's protocol (`policy.protocol`): each observation
is tokenized on its own and appended with loss mask 0, as is `INVALID_ACTION_MESSAGE` after an
invalid turn. Departures from Search-R1 / ZeroSearch: docs/protocols.md.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from simsearch.data.rendering import (
    INFORMATION_CLOSE,
    INFORMATION_OPEN,
    OBSERVATION_TAIL,
    RenderStyle,
    encodable,
    render_documents,
    wrap_information,
)
from simsearch.data.templates import encode_prompt
from simsearch.eval.metrics import ANSWER_CLOSE, extract_answer
from simsearch.eval.metrics import ANSWER_OPEN as ANSWER_OPEN  # the agent's too (re-exported)
from simsearch.types import Completion, Document, QAExample, Trajectory, Turn

if TYPE_CHECKING:
    from simsearch.policy.protocol import AgentProtocol, RolloutChoices, TokenCache

SEARCH_STOP = "</search>"
ANSWER_STOP = ANSWER_CLOSE
STOP_STRINGS: tuple[str, ...] = (SEARCH_STOP, ANSWER_STOP)
"""Where one policy turn ends; pass `list(STOP_STRINGS)` as `SamplingParams.stop`."""

TAG_NAMES: tuple[str, ...] = ("think", "search", "information", "answer")

INVALID_ACTION_MESSAGE = (
    "\nMy last action was not valid. To search, I need to put the query inside the search "
    "tags. To give the final answer, I need to put it inside the answer tags. I will try "
    "again.\n"
)
"""Appended to the trajectory after a turn that neither searched nor answered.

It names the tags without writing them: ZeroSearch's message spells out `<answer> and
</answer>`, which any later answer extractor reads as the answer "and" (F1 0.5 against a gold
such as "Tom and Jerry" for a trajectory that never answered), and `<search> and </search>` as
a search.
"""

ActionKind = Literal["search", "answer", "invalid"]


@dataclass(frozen=True)
class Action:
    """What one generated turn asks for.

    `payload` is the query for a search, the answer text for an answer (both stripped of
    surrounding whitespace), and "" for an invalid turn.
    """

    kind: ActionKind
    payload: str = ""


_BLOCKS = {name: re.compile(rf"<{name}>(.*?)</{name}>", re.DOTALL) for name in TAG_NAMES}


def _last_block(text: str, name: str, end: int) -> tuple[int, str] | None:
    """The block of `name` closing at `end` (index of its closing tag) with the nearest opener."""
    opener = f"<{name}>"
    start = text.rfind(opener, 0, end)
    if start == -1:
        return None
    return start, text[start + len(opener) : end]


def parse_action(text: str) -> Action:
    """Reads the action of one generated turn.

    The last closing tag of either kind (`</search>` or `</answer>`) decides the action, and its
    content runs from the nearest matching opening tag before it. With stop strings that closing
    tag ends the turn; text after it (which a stop-string engine never returns) is ignored.

    Args:
        text: The text the policy generated in this turn (not the prompt or earlier turns).

    Returns:
        `Action("search", query)` for a complete, non-empty `<search>…</search>`;
        `Action("answer", answer)` for a complete `<answer>…</answer>` (an empty answer is still
        an answer: it ends the trajectory and scores 0); otherwise `Action("invalid")`.
    """
    search_end = text.rfind(SEARCH_STOP)
    answer_end = text.rfind(ANSWER_STOP)
    if search_end == -1 and answer_end == -1:
        return Action("invalid")
    if search_end > answer_end:
        block = _last_block(text, "search", search_end)
        if block is None or not block[1].strip():
            return Action("invalid")
        return Action("search", block[1].strip())
    block = _last_block(text, "answer", answer_end)
    if block is None:
        return Action("invalid")
    return Action("answer", block[1].strip())


def extract_queries(text: str) -> list[str]:
    """Returns every complete search query in order, stripped, empty ones dropped.

    Queries are read outside `<information>` blocks only, so a `<search>` tag that a search
    engine (or the self-searching policy) wrote inside its documents is not counted.

    Args:
        text: A whole trajectory response.

    Returns:
        The queries, first to last.
    """
    visible = _BLOCKS["information"].sub(" ", text)
    queries = (query.strip() for query in _BLOCKS["search"].findall(visible))
    return [query for query in queries if query]


def information_spans(
    text: str, tags: tuple[str, str] = (INFORMATION_OPEN, INFORMATION_CLOSE)
) -> list[tuple[int, int]]:
    """Character spans of `tags` blocks (`<information>…</information>` by default), tags included.

    Self-search rollouts use these to mask the policy's own imagined documents out of the loss.
    An `<information>` opened but never closed (generation ran out of tokens) runs to the end
    of the text, so a truncated block is masked too.

    Args:
        text: A response in which the policy may have written information blocks.

    Returns:
        `(start, end)` pairs, `text[start:end]` being the block, in order and non-overlapping.
    """
    opening, closing = tags
    spans: list[tuple[int, int]] = []
    position = 0
    while (start := text.find(opening, position)) != -1:
        close = text.find(closing, start + len(opening))
        end = len(text) if close == -1 else close + len(closing)
        spans.append((start, end))
        position = end
    return spans


def observation_ids(tokens: TokenCache, blocks: list[str]) -> list[list[int]]:
    """Token ids of each wrapped block, cut to `tokens.max_obs_tokens` keeping the closing tag.

    Each observation is tokenized on its own, never jointly with the context before it, and the
    closing `</information>\\n\\n` is tokenized apart from the head so a cut keeps it whole.
    """
    heads = [encodable(wrap_information(block)[: -len(OBSERVATION_TAIL)]) for block in blocks]
    tail_ids = tokens.fixed(OBSERVATION_TAIL)
    room = tokens.max_obs_tokens - len(tail_ids)
    head_ids = tokens.tokenizer(heads, add_special_tokens=False)["input_ids"]
    return [ids[:room] + tail_ids for ids in head_ids]


class TagProtocol:
    """Search-R1's protocol (`rollout.protocol=tags`): the prompt of `rollout.template`, a turn
    ending at `</search>` or `</answer>` and read by `parse_action`, the results in `<information>`.
    """

    stops: tuple[str, ...] = STOP_STRINGS
    uses_engine = True
    own_stops: tuple[str, ...] = (ANSWER_STOP,)
    """A self-searching policy's stops: it writes its own `<information>` after `</search>`."""
    own_results: tuple[str, str] = (INFORMATION_OPEN, INFORMATION_CLOSE)
    """The tags a self-searching policy writes its own results in."""

    def __init__(self, cfg: RolloutChoices) -> None:
        self.template = cfg.template

    def check(self, tokenizer: object) -> None:
        return None  # any tokenizer writes tags

    def for_question(self, rng: random.Random | None) -> AgentProtocol:
        return self

    def prompt(self, tokens: TokenCache, example: QAExample) -> list[int]:
        # Rendered and tokenized as the template's reference does (chat template, special tokens).
        return encode_prompt(example.question, template=self.template, tokenizer=tokens.tokenizer)

    def start(self, tokens: TokenCache, example: QAExample) -> None:
        return None

    def turn_text(self, tokens: TokenCache, state: None, ids: list[int], completion: Completion, cut: bool) -> str:
        """The turn's text: the engine's own unless the ids were cut."""
        return tokens.decode(ids) if cut else completion.text

    def parse(self, text: str) -> Turn:
        action = parse_action(text)
        return Turn(text=text, action=action.kind, query=action.payload if action.kind == "search" else "")

    def parse_own(self, text: str) -> Turn:
        """A self-searching turn: a search is invalid (it ended without answering); its own queries."""
        kind = parse_action(text).kind
        return Turn(text=text, action="invalid" if kind == "search" else kind, self_queries=extract_queries(text))

    def read(
        self, tokens: TokenCache, state: None, ids: list[int], completion: Completion, cut: bool
    ) -> tuple[Turn, list[int]]:
        return self.parse(self.turn_text(tokens, state, ids, completion, cut)), [1] * len(ids)

    def correction(self, tokens: TokenCache, state: None, turn: Turn) -> list[int]:
        return tokens.fixed(INVALID_ACTION_MESSAGE)

    def queries(self, turn: Turn) -> list[str]:
        return [turn.query]

    def observe(
        self, tokens: TokenCache, searches: list[tuple[None, Turn, list[list[Document]]]], rendering: RenderStyle
    ) -> list[list[int]]:
        """Each search's one result list in an `<information>` block, all tokenized in one call."""
        for _, turn, [documents] in searches:
            turn.documents = list(documents)
        return observation_ids(tokens, [render_documents(documents, rendering) for _, _, [documents] in searches])

    def answer(self, turns: list[Turn], text: str) -> str | None:
        """The last answer of the response."""
        return extract_answer(text)

    def metrics(self, trajectories: list[Trajectory]) -> dict[str, float]:
        return {}
