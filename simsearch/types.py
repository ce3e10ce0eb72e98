"""Records that cross module boundaries.

Every dataclass here is plain data: no behaviour beyond small derived properties, so any module
can build or read them without importing another area of the package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

FinishReason = Literal["stop", "length"]


@dataclass
class SamplingParams:
    """How a `GenerationEngine` samples.

    `temperature == 0` means greedy decoding. `stop` strings end a sequence; the text after the
    first stop string is never returned, the stop string itself is (so `</search>` stays in the
    trajectory). `n` samples per prompt are returned consecutively: prompt 0's n completions,
    then prompt 1's, and so on.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    n: int = 1
    seed: int | None = None
    logprobs: bool = False


@dataclass
class Completion:
    """One generated continuation of one prompt."""

    token_ids: list[int]
    text: str
    finish_reason: FinishReason
    stop: str | None = None  # the stop string that ended it, if any
    logprobs: list[float] | None = None  # per generated token, when asked for


@dataclass
class Document:
    """A search result as the policy sees it."""

    title: str
    text: str
    score: float | None = None
    source: str = ""  # which engine produced it: "bm25", "dense", "simulator", "serper", ...
    id: str | None = None
    noisy: bool = False  # the simulator wrote it as a noisy document (real engines: always False)


@dataclass
class SearchRequest:
    """One query, plus the context a simulator may use.

    `num_noisy` is how many of the `top_k` documents must be noisy; the curriculum decides it,
    engines obey it (real retrievers ignore it). ZeroSearch uses 0 or `top_k` per call.
    """

    query: str
    top_k: int = 3
    question: str | None = None
    golden_answers: list[str] = field(default_factory=list)
    num_noisy: int = 0


@dataclass
class QAExample:
    """A question with its gold answers, from any supported dataset format."""

    id: str
    question: str
    golden_answers: list[str]
    data_source: str = ""  # dataset name, kept so evaluation reports per dataset
    prompt: str | None = None  # the already-templated prompt of verl-style rows, when present


@dataclass
class Passage:
    """A corpus passage."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """Search-R1's `contents` field: the title line, then the text."""
        return f"{self.title}\n{self.text}"


ActionKind = Literal["search", "answer", "invalid"]
TrajectoryFinish = Literal["answer", "max_turns", "gave_up", "context", "length"]
FINISHES: tuple[TrajectoryFinish, ...] = get_args(TrajectoryFinish)
"""Every finish, in the order the rollout's `rollout/finish_<reason>` metrics are logged.

"answer": an answer ended it. "max_turns": the final turn asked for a search, which is not run.
"gave_up": the final turn ended (a stop, not the token cap) with neither a search nor an answer.
"context": the context ran out. "length": `max_new_tokens` cut the final turn."""

UNFINISHED: frozenset[TrajectoryFinish] = frozenset({"max_turns", "gave_up", "context"})
"""Finishes without an answer because the turns ("max_turns", "gave_up") or the context
("context") ran out; `rollout/unfinished_share` counts them. "length" (the final turn cut by
`max_new_tokens`) is not one: a final turn that outgrows the per-turn cap would outgrow it at
evaluation too, so its reward of 0 is trained on."""

OVER_TURN: frozenset[TrajectoryFinish] = frozenset({"max_turns", "context"})
"""What `algorithm.mask_unfinished` (Mini-o3's over-turn masking) leaves out of the loss: the
trajectories still calling a tool when the turns or the context ran out. A give-up ("gave_up")
joins them only with `algorithm.mask_gave_up`."""


@dataclass
class Turn:
    """One policy generation within a rollout, and what the rollout did with it.

    `documents` are what the search engine returned for `query`; `executed` is False for a
    search the rollout refused to run (one made in the final answer turn, over the turn budget).
    In self-search mode `self_queries` lists the queries the policy answered with its own
    `<information>` inside this generation. In the tool-call protocol a search turn may make
    several calls: `call_queries` holds their queries and `call_documents` their results, in order
    (`query` and `documents` stay empty), and `call_reasons` says why a call could not be read.
    """

    text: str  # the generated text, ending with the stop string that ended it
    action: ActionKind
    query: str = ""
    documents: list[Document] = field(default_factory=list)
    num_noisy: int = 0  # how many of the documents the engine was asked to make noisy
    executed: bool = False  # the search was run (action == "search" only)
    self_queries: list[str] = field(default_factory=list)
    call_queries: list[str] = field(default_factory=list)  # tool-call protocol: the queries of its readable calls
    call_documents: list[list[Document]] = field(default_factory=list)  # tool-call: results per call
    call_reasons: list[str] = field(default_factory=list)  # tool-call: why calls could not be read


@dataclass
class Trajectory:
    """One multi-turn rollout of the policy on one question, at the token level.

    `response_ids` is everything after the prompt: the tokens the policy generated and the
    tokens the rollout inserted (search results, corrective messages), in order. `loss_mask[i]`
    is 1 when `response_ids[i]` was generated by the policy and trained on, 0 when it was
    inserted (or, in self-search, is part of the policy's own `<information>` block).
    `logprobs`, when the rollout asked for them, are the generation-time log-probabilities
    aligned with `response_ids` (0.0 at inserted tokens).
    """

    prompt_id: int  # index of the example in the rollout's batch; shared by its group
    example: QAExample
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    turns: list[Turn]
    response_text: str  # decode of response_ids
    answer: str | None  # the last <answer> of the response, None without one
    num_searches: int  # searches run by the engine, plus self-answered queries in self-search
    num_invalid: int  # turns that neither searched nor answered
    finish: TrajectoryFinish
    logprobs: list[float] | None = None
