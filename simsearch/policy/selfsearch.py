"""Self-search (SSRL): the policy writes its own search results, in the spelling of the protocol it wraps.

With `rollout.template=self-search` the policy writes its query, its own results (`<information>`
under the tag protocol, `<tool_response>` under tool calls) and its answer in one generation
(with tags, stopping only at `</answer>`), and the results it wrote get loss mask 0. A turn that
ends after its own search without answering is invalid. With `self_search_real_share` > 0, that
share of the questions (all rollouts of a question together) use the wrapped protocol as it is
instead: their searches stop the turn and get real results from the engine, the sim-to-real bridge
during training. At share 1 every search is real, which is how `simsearch eval` runs a self-search
policy on a real engine (SSRL's sim-to-real evaluation: generation cut at `</search>`, real results
inserted, up to `max_turns` searches).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from simsearch.data.rendering import RenderStyle
from simsearch.policy.tags import information_spans
from simsearch.types import Completion, Document, QAExample, Trajectory, Turn

if TYPE_CHECKING:
    from simsearch.policy.protocol import AgentProtocol, SelfSearchable, TokenCache


SELF_SEARCH_TEMPLATE = "self-search"
"""The `rollout.template` under which the policy answers its own searches."""


class SelfSearch:
    """`searching`, with the policy writing its own results; `real_share` of the questions search for real."""

    uses_engine: bool

    def __init__(self, searching: SelfSearchable, real_share: float) -> None:
        self.searching = searching
        self.real_share = real_share
        self.stops = searching.own_stops
        self.uses_engine = real_share > 0

    def check(self, tokenizer: Any) -> None:
        self.searching.check(tokenizer)

    def for_question(self, rng: random.Random | None) -> AgentProtocol:
        """The wrapped protocol for a question drawn to search for real, else self-search."""
        share = self.real_share
        real = share >= 1 or (share > 0 and rng is not None and rng.random() < share)
        return self.searching if real else self

    def prompt(self, tokens: TokenCache, example: QAExample) -> list[int]:
        return self.searching.prompt(tokens, example)

    def start(self, tokens: TokenCache, example: QAExample) -> Any:
        return self.searching.start(tokens, example)

    def read(
        self, tokens: TokenCache, state: Any, ids: list[int], completion: Completion, cut: bool
    ) -> tuple[Turn, list[int]]:
        """The turn, and a loss mask with 0 on the results the policy wrote itself."""
        mask = self_search_mask(tokens, ids, self.searching.own_results)
        return self.searching.parse_own(self.searching.turn_text(tokens, state, ids, completion, cut)), mask

    def correction(self, tokens: TokenCache, state: Any, turn: Turn) -> list[int]:
        return self.searching.correction(tokens, state, turn)

    def queries(self, turn: Turn) -> list[str]:
        return self.searching.queries(turn)

    def observe(
        self, tokens: TokenCache, searches: list[tuple[Any, Turn, list[list[Document]]]], rendering: RenderStyle
    ) -> list[list[int]]:
        return self.searching.observe(tokens, searches, rendering)  # never called: no self-search turn searches

    def answer(self, turns: list[Turn], text: str) -> str | None:
        return self.searching.answer(turns, text)

    def metrics(self, trajectories: list[Trajectory]) -> dict[str, float]:
        own = sum(len(turn.self_queries) for t in trajectories for turn in t.turns)
        return {**self.searching.metrics(trajectories), "search/self_calls_per_traj": own / len(trajectories)}


def self_search_mask(tokens: TokenCache, ids: list[int], tags: tuple[str, str]) -> list[int]:
    """Loss mask of one self-search generation: 0 on the `tags` blocks (`<information>`…) it wrote.

    When both tags are single tokens and the text holds no other spelling of them, the blocks
    are found by id. Otherwise character spans of the blocks are mapped to tokens through
    incremental decoding offsets; a token that overlaps a block at all is masked, so no imagined
    document text reaches the loss.
    """
    opening, closing = tags
    if tags not in tokens.tag_ids:
        tokens.tag_ids[tags] = (_single_token(tokens, opening), _single_token(tokens, closing))
    open_id, close_id = tokens.tag_ids[tags]
    if open_id is not None and close_id is not None:
        text = tokens.decode(ids)
        if text.count(opening) == ids.count(open_id) and text.count(closing) == ids.count(close_id):
            return _mask_by_id(ids, open_id, close_id)
    text, ends = decode_offsets(tokens.decode, ids)
    spans = information_spans(text, tags)
    mask = []
    start = 0
    for end in ends:
        # A token covering no character yet (a partial UTF-8 byte) belongs to the
        # character that starts at `end`.
        covered = (start, end) if end > start else (end, end + 1)
        mask.append(0 if any(s < covered[1] and covered[0] < e for s, e in spans) else 1)
        start = end
    return mask


def _single_token(tokens: TokenCache, tag: str) -> int | None:
    """The id of `tag` when the tokenizer holds it as one added (never split) token."""
    ids = tokens.encode(tag)
    if len(ids) == 1 and tag in tokens.tokenizer.get_added_vocab():
        return ids[0]
    return None


def _mask_by_id(ids: list[int], open_id: int, close_id: int) -> list[int]:
    """0 from each `open_id` through the next `close_id` (or the end), 1 elsewhere."""
    mask = []
    inside = False
    for token in ids:
        if token == open_id:
            inside = True
        mask.append(0 if inside else 1)
        if token == close_id:
            inside = False
    return mask


def decode_offsets(decode: Callable[[list[int]], str], ids: list[int]) -> tuple[str, list[int]]:
    """Decodes ids incrementally: the text and, per token, the text length after it.

    Each step decodes a short window (the previous token onwards) and keeps only the new
    characters, so the cost is linear in the length. A token that ends inside a multi-byte
    character decodes to U+FFFD; its characters are credited to the token that completes them.
    """
    text = ""
    ends: list[int] = []
    prefix = read = 0  # window start; first token whose characters are not yet in `text`
    for i in range(len(ids)):
        before = decode(ids[prefix:read])
        after = decode(ids[prefix : i + 1])
        if after.endswith("\ufffd") and i + 1 < len(ids):
            ends.append(len(text))
            continue
        text += after[len(before) :]
        ends.append(len(text))
        prefix, read = read, i + 1
    return text, ends
