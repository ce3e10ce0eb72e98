"""How the policy asks for a search and reads its results: the `AgentProtocol` interface.

A protocol owns everything of the agent loop that depends on how a search is written: the prompt,
the stop strings of a turn, the reading of a turn (search, answer or invalid) and the loss mask of
what the policy generated, the correction after an invalid turn, the queries of a search turn, the
observation that carries the results back (rendered and tokenized; inserted with loss mask 0), and
the answer of a finished trajectory. `policy.rollout` runs every protocol through this interface.

The protocols, by their recipe name (`rollout.protocol`), are in `policy.protocols.PROTOCOLS`:
`tags` (Search-R1's tags, `policy.tags`) and `tool-call` (the chat template's tool calls,
`policy.toolcalls`). With `rollout.template=self-search` the chosen one is wrapped in `SelfSearch`
(`policy.selfsearch`): the policy writes its own results in that protocol's spelling (SSRL). A new
protocol is a class in its own module with the methods of `SelfSearchable`, and one entry in
`PROTOCOLS`.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Protocol, cast

from simsearch.data.rendering import EMPTY_OBSERVATION, OBSERVATION_TAIL, RenderStyle, encodable
from simsearch.types import Completion, Document, QAExample, Trajectory, Turn

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class RolloutChoices(Protocol):
    """What a protocol reads of the recipe's rollout section (`policy.recipe.RolloutConfig`)."""

    protocol: str
    template: str
    tool_format: str
    chat_template_kwargs: dict[str, Any]
    self_search_real_share: float


class AgentProtocol(Protocol):
    """One way of searching in text. `state` is what one trajectory keeps between turns (the
    protocol's own; None when it keeps nothing); `tokens` holds the policy's tokenizer."""

    stops: tuple[str, ...]
    """Where one generated turn ends (empty: at the model's end-of-turn token)."""
    uses_engine: bool
    """Whether its search turns are run by the search engine."""

    def check(self, tokenizer: Any) -> None:
        """Raises a `RecipeError` when the tokenizer cannot render the protocol."""
        ...

    def for_question(self, rng: random.Random | None) -> AgentProtocol:
        """The protocol one question's rollouts use (itself, or one it wraps)."""
        ...

    def prompt(self, tokens: TokenCache, example: QAExample) -> list[int]:
        """The prompt's token ids."""
        ...

    def start(self, tokens: TokenCache, example: QAExample) -> Any:
        """A fresh trajectory's state."""
        ...

    def read(
        self, tokens: TokenCache, state: Any, ids: list[int], completion: Completion, cut: bool
    ) -> tuple[Turn, list[int]]:
        """The turn generated as `ids` (`completion`'s, cut to the room left when `cut`) and their loss mask."""
        ...

    def correction(self, tokens: TokenCache, state: Any, turn: Turn) -> list[int]:
        """The ids inserted after the invalid `turn` (loss mask 0)."""
        ...

    def queries(self, turn: Turn) -> list[str]:
        """The queries a search turn asks the engine, in order."""
        ...

    def observe(
        self, tokens: TokenCache, searches: list[tuple[Any, Turn, list[list[Document]]]], rendering: RenderStyle
    ) -> list[list[int]]:
        """Records each search's results (one list per query) on its turn; the ids inserted after each (mask 0)."""
        ...

    def answer(self, turns: list[Turn], text: str) -> str | None:
        """The answer of a finished trajectory (`text`: its whole response)."""
        ...

    def metrics(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """The protocol's own batch metrics."""
        ...


class SelfSearchable(AgentProtocol, Protocol):
    """A protocol of `PROTOCOLS`: also says how a policy writes its own results in it (`SelfSearch`)."""

    own_stops: tuple[str, ...]
    """Where a turn ends when the policy writes its own results after its search."""
    own_results: tuple[str, str]
    """The opening and closing tags the policy writes its own results in."""

    def turn_text(self, tokens: TokenCache, state: Any, ids: list[int], completion: Completion, cut: bool) -> str:
        """The turn's text, as `read` reads it."""
        ...

    def parse_own(self, text: str) -> Turn:
        """The turn read outside the results the policy wrote; `self_queries` its own queries."""
        ...


class TokenCache:
    """The policy's tokenizer, and the ids of the fixed texts protocols insert, encoded once.

    Raises:
        ValueError: `max_obs_tokens` (every protocol's bound on one observation) cannot hold even
            an empty `<information>` block.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_obs_tokens: int) -> None:
        self.tokenizer = tokenizer
        self._fixed: dict[str, list[int]] = {}
        head = EMPTY_OBSERVATION[: -len(OBSERVATION_TAIL)]
        smallest = len(self.encode(head)) + len(self.fixed(OBSERVATION_TAIL))
        if max_obs_tokens < smallest:
            raise ValueError(
                f"max_obs_tokens={max_obs_tokens} cannot hold even an empty information block "
                f"({smallest} tokens with this tokenizer); raise it"
            )
        self.max_obs_tokens = max_obs_tokens
        # (opening, closing) tags -> their single-token ids, looked up once per pair
        self.tag_ids: dict[tuple[str, str], tuple[int | None, int | None]] = {}

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(encodable(text), add_special_tokens=False)

    def fixed(self, text: str) -> list[int]:
        """`encode(text)`, encoded once (do not change the list)."""
        if text not in self._fixed:
            self._fixed[text] = self.encode(text)
        return self._fixed[text]

    def decode(self, ids: list[int]) -> str:
        # Special tokens are kept: the tiny tokenizer's tags are special tokens.
        return cast(str, self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))
