"""The batched multi-turn agent loop, at the token level.

`generate_trajectories` runs the policy on a batch of questions, `group_size` rollouts each:

1. Render each question with the policy template and tokenize it once.
2. Each turn, ask the policy to continue every unfinished trajectory in ONE `generate` call,
   stopping at `</search>` or `</answer>`; parse each turn with `tags.parse_action`.
3. Answer every search of the turn in ONE `SearchEngine.search` call (the curriculum's `noise`
   decides how many of each call's documents must be noisy), render the documents, tokenize the
   observation on its own and append its ids with loss mask 0. An invalid turn gets the
   corrective message (mask 0). An answer ends the trajectory.
4. After `max_turns` such turns, one final turn in which a search is not run.

With `protocol="tool-call"` the same loop runs in the model's own chat format: the prompt is the
chat template's rendering of the question with the search tool offered (`data.chat`), each turn
is generated up to the end-of-turn token and read by `toolcalls.parse_turn`, every call of every
row of the turn goes in the one `search` call, and the text the template adds after a turn (the
end of the assistant message, one tool message per call, the next assistant header) is
tokenized and appended with mask 0. An unreadable turn gets `TOOL_CALL_CORRECTION` as a tool
message (mask 0), so the context stays the template's rendering of the conversation.

Loss masks are built from the token ids of each appended segment as it is appended: generated
ids get 1, inserted ids 0; nothing is decoded and re-tokenized to find them.

Self-search (SSRL): with template "self-search" the policy writes its query, its own
`<information>` and its answer in one generation (stop only at `</answer>`), and the
information it wrote gets mask 0. With `self_search_real_share` > 0, that share of the questions
(all rollouts of a question together) stop at `</search>` instead and get real results from
`search`: the sim-to-real bridge during training. At share 1 every search is real, which is
how `simsearch eval` runs a self-search policy on a real engine (SSRL's sim-to-real evaluation:
generation cut at `</search>`, real results inserted, up to `max_turns` searches).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from transformers import PreTrainedTokenizerBase

from simsearch.data.chat import ToolConversation, check_tool_support, search_tool_schema, tool_call_messages
from simsearch.data.rendering import (
    INFORMATION_CLOSE,
    INFORMATION_OPEN,
    RenderStyle,
    encodable,
    render_documents,
    wrap_information,
)
from simsearch.data.templates import TEMPLATE_NAMES, encode_prompt
from simsearch.errors import DataError, NonFiniteError
from simsearch.eval.metrics import extract_answer
from simsearch.generation.base import GenerationEngine
from simsearch.policy.recipe import RolloutConfig
from simsearch.policy.rewards import RewardOutput, weighted_reward
from simsearch.policy.tags import (
    ANSWER_STOP,
    INVALID_ACTION_MESSAGE,
    SEARCH_STOP,
    extract_queries,
    information_spans,
    parse_action,
)
from simsearch.policy.toolcalls import TOOL_RESPONSE_TAGS, parse_self_search_turn, parse_turn
from simsearch.retrieval.base import SearchEngine
from simsearch.types import (
    FINISHES,
    UNFINISHED,
    Completion,
    QAExample,
    SamplingParams,
    SearchRequest,
    Trajectory,
    TrajectoryFinish,
    Turn,
)

ROLLOUT_TEMPLATES: tuple[str, ...] = tuple(name for name in TEMPLATE_NAMES if name != "rag")
"""Templates a rollout can start from ("rag" needs documents in the prompt and is not one)."""

SEARCH_STOPS: tuple[str, ...] = (SEARCH_STOP, ANSWER_STOP)
SELF_SEARCH_STOPS: tuple[str, ...] = (ANSWER_STOP,)

# wrap_information(block) == _OBSERVATION_HEAD + block + _OBSERVATION_TAIL; derived from the
# compat wrapper rather than spelled out, so the two cannot disagree.
_EMPTY_OBSERVATION = wrap_information("")
_OBSERVATION_TAIL = _EMPTY_OBSERVATION[_EMPTY_OBSERVATION.index(INFORMATION_CLOSE) :]

TOOL_CALL_CORRECTION = (
    "Your reply could not be used ({reasons}). To search, call the search tool; to answer, "
    "put the answer between <answer> and </answer>."
)
"""The tool message an unreadable tool-call turn gets (the tag protocol's INVALID_ACTION_MESSAGE)."""


@dataclass(frozen=True)
class RolloutSettings:
    """How the agent loop runs: the recipe's rollout section on one search engine.

    Attributes:
        rollout: The recipe's section as it is (checked with the recipe); `group_size` is unused
            here (`generate_trajectories` takes it).
        top_k: Documents per search (the engine's `SearchConfig.top_k`).
        rendering: How documents are shown to the policy (`SearchConfig.rendering`).
    """

    rollout: RolloutConfig
    top_k: int
    rendering: RenderStyle

    @property
    def self_search(self) -> bool:
        """Whether the policy answers its own searches."""
        return self.rollout.template == "self-search"

    @property
    def tool_call(self) -> bool:
        """Whether the policy calls the search tool in its chat template's format."""
        return self.rollout.protocol == "tool-call"


@dataclass
class RolloutResult:
    """Trajectories of one rollout batch and what to log about them.

    Attributes:
        trajectories: `group_size` consecutive trajectories per example, in example order.
        metrics: Deterministic batch statistics with namespaced keys (`search/...`,
            `rollout/...`, `perf/...`); see `generate_trajectories`.
        timings: Wall-clock seconds (`time/generate_s`, `time/search_s`, `time/assembly_s`,
            `time/total_s`).
    """

    trajectories: list[Trajectory]
    metrics: dict[str, float]
    timings: dict[str, float]


class RolloutStopped(Exception):
    """`generate_trajectories` stopped at a turn boundary because its `should_stop` said so.

    Attributes:
        turn: The turn that was about to start (0-based; 0: before the first).
    """

    def __init__(self, turn: int) -> None:
        super().__init__(f"rollout stopped before turn {turn}")
        self.turn = turn


def generate_trajectories(
    examples: Sequence[QAExample],
    *,
    policy: GenerationEngine,
    tokenizer: PreTrainedTokenizerBase,
    search: SearchEngine | None,
    settings: RolloutSettings,
    sampling: SamplingParams,
    group_size: int = 1,
    noise: Callable[[int], int] | None = None,
    rng: random.Random | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> RolloutResult:
    """Rolls the policy out on every example, `group_size` times each.

    Args:
        examples: The questions; trajectory `prompt_id` is the index into this list.
        policy: Generates the policy's turns; called with token-id prompts.
        tokenizer: The policy's tokenizer: renders prompts, observations and messages to ids.
        search: Answers the searches; may be None only when no search can be run (self-search
            without a real share, or `max_turns=0`).
        settings: The loop's limits, template and rendering.
        sampling: Per-turn sampling; `stop` and `n` left at their defaults (the rollout sets them);
            `max_new_tokens` is per turn; with a `seed`, generate call c uses seed + c.
        group_size: Rollouts per example (GRPO's G).
        noise: `noise(top_k)`: how many documents of one search must be noisy (None: always 0).
        rng: Draws the questions that use real search (needed when 0 < `self_search_real_share` < 1).
        should_stop: Asked at each turn boundary, before each turn (a preemption's early stop).

    Returns:
        The trajectories and the batch's metrics (`_metrics` lists their keys).

    Raises:
        DataError: an example whose prompt leaves no room under `max_context_tokens`.
        NonFiniteError: the policy's logits were inf or nan (names the call and the questions).
        RolloutStopped: `should_stop()` said True at a turn boundary; nothing is returned.
        ValueError: an argument the loop cannot honour, or an engine's result count or a `noise`
            count out of range.
    """
    _check_arguments(examples, tokenizer, search, settings, sampling, group_size, rng)
    clock = _Clock(started=time.perf_counter())
    tokens = _TokenCache(tokenizer, settings.rollout.max_obs_tokens)
    rollouts = _start(examples, tokens, settings, group_size, rng, sampling.logprobs)

    for turn in range(settings.rollout.max_turns + 1):
        active = [rollout for rollout in rollouts if rollout.finish is None]
        if not active:
            break
        if should_stop is not None and should_stop():
            raise RolloutStopped(turn)
        completions = _generate_turn(policy, active, sampling, settings, group_size, turn == 0, clock)
        searches: list[tuple[_Rollout, Turn]] = []
        for rollout, completion in zip(active, completions):
            if _take_turn(rollout, completion, tokens, settings, turn == settings.rollout.max_turns):
                searches.append((rollout, rollout.turns[-1]))
        if searches:
            assert search is not None  # _check_arguments: searches happen only with an engine
            _run_searches(searches, search, tokens, settings, noise, clock)

    return _finish(rollouts, tokens, settings, clock)


def score_trajectories(
    trajectories: Sequence[Trajectory], weights: dict[str, float], *, normalization: str = "unicode"
) -> RewardOutput:
    """Scores trajectories with `rewards.weighted_reward` on their response text.

    Args:
        trajectories: Finished trajectories.
        weights: Reward component weights, e.g. `{"f1": 1.0}` or `{"em": 0.9, "ssrl_format": 0.1}`.
        normalization: How answers are normalized (`simsearch.eval.metrics.NORMALIZATIONS`).

    Returns:
        Per-trajectory totals and components, plus `reward/...` batch means.

    The answer components score `Trajectory.answer` (for the tag protocol, the last answer of the
    response; for tool-call, the answer of the final assistant message).
    """
    return weighted_reward(
        weights,
        [trajectory.response_text for trajectory in trajectories],
        [trajectory.example.golden_answers for trajectory in trajectories],
        normalization=normalization,
        answers=[trajectory.answer for trajectory in trajectories],
        turns=[trajectory.turns for trajectory in trajectories],
    )


# --------------------------------------------------------------------------- state


@dataclass
class _Rollout:
    """The growing state of one trajectory."""

    prompt_id: int
    example: QAExample
    prompt_ids: list[int]
    self_search: bool  # answers its own searches (stops only at </answer>)
    logprobs: list[float] | None
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    num_invalid: int = 0
    over_budget: bool = False
    finish: TrajectoryFinish | None = None
    conversation: ToolConversation | None = None  # the tool-call protocol's chat, else None
    pending: tuple[str, str] = ("", "")  # tool-call: the last turn's (generated text, message content)

    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def context(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def stops(self) -> tuple[str, ...]:
        if self.conversation is not None:
            return ()  # a tool-call turn ends at the model's end-of-turn token
        return SELF_SEARCH_STOPS if self.self_search else SEARCH_STOPS

    def append(self, ids: list[int], mask: list[int], logprobs: list[float] | None) -> None:
        self.response_ids.extend(ids)
        self.loss_mask.extend(mask)
        if self.logprobs is not None:
            self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


@dataclass
class _Clock:
    """Time and token counters of one rollout."""

    started: float
    generate_s: float = 0.0
    search_s: float = 0.0
    generate_calls: int = 0
    prompt_tokens: int = 0
    decoded_tokens: int = 0


class _TokenCache:
    """The tokenizer plus the ids of the fixed texts the rollout inserts."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_obs_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.invalid_ids = self.encode(INVALID_ACTION_MESSAGE)
        self.tail_ids = self.encode(_OBSERVATION_TAIL)
        head = _EMPTY_OBSERVATION[: -len(_OBSERVATION_TAIL)]
        smallest = len(self.encode(head)) + len(self.tail_ids)
        if max_obs_tokens < smallest:
            raise ValueError(
                f"max_obs_tokens={max_obs_tokens} cannot hold even an empty information block "
                f"({smallest} tokens with this tokenizer); raise it"
            )
        self.max_obs_tokens = max_obs_tokens
        # (opening, closing) tags -> their single-token ids, looked up once per pair
        self._tag_ids: dict[tuple[str, str], tuple[int | None, int | None]] = {}

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(encodable(text), add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        # Special tokens are kept: the tiny tokenizer's tags are special tokens.
        return cast(str, self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))

    def _single_token(self, tag: str) -> int | None:
        """The id of `tag` when the tokenizer holds it as one added (never split) token."""
        ids = self.encode(tag)
        if len(ids) == 1 and tag in self.tokenizer.get_added_vocab():
            return ids[0]
        return None

    def observations(self, blocks: list[str]) -> list[list[int]]:
        """Token ids of each wrapped block, cut to `max_obs_tokens` keeping the closing tag.

        Each observation is tokenized on its own, never jointly with the context before it,
        and the closing `</information>\\n\\n` is tokenized apart from the head so a cut
        keeps it whole.
        """
        heads = [encodable(wrap_information(block)[: -len(_OBSERVATION_TAIL)]) for block in blocks]
        room = self.max_obs_tokens - len(self.tail_ids)
        head_ids = self.tokenizer(heads, add_special_tokens=False)["input_ids"]
        return [ids[:room] + self.tail_ids for ids in head_ids]

    def cut_text(self, text: str) -> str:
        """`text` cut to its first `max_obs_tokens` tokens (a tool message's result)."""
        ids = self.encode(text)
        return encodable(text) if len(ids) <= self.max_obs_tokens else self.decode(ids[: self.max_obs_tokens])

    def self_search_mask(
        self, ids: list[int], tags: tuple[str, str] = (INFORMATION_OPEN, INFORMATION_CLOSE)
    ) -> list[int]:
        """Loss mask of one self-search generation: 0 on the `<information>` (or `tags`) blocks it wrote.

        When both tags are single tokens and the text holds no other spelling of them, the
        blocks are found by id. Otherwise character spans of the blocks are mapped to tokens
        through incremental decoding offsets; a token that overlaps a block at all is masked,
        so no imagined document text reaches the loss.
        """
        opening, closing = tags
        if tags not in self._tag_ids:
            self._tag_ids[tags] = (self._single_token(opening), self._single_token(closing))
        open_id, close_id = self._tag_ids[tags]
        if open_id is not None and close_id is not None:
            text = self.decode(ids)
            if text.count(opening) == ids.count(open_id) and text.count(closing) == ids.count(close_id):
                return _mask_by_id(ids, open_id, close_id)
        text, ends = _decode_offsets(self.decode, ids)
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


def _decode_offsets(decode: Callable[[list[int]], str], ids: list[int]) -> tuple[str, list[int]]:
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


# --------------------------------------------------------------------------- the loop


def _check_arguments(
    examples: Sequence[QAExample],
    tokenizer: PreTrainedTokenizerBase,
    search: SearchEngine | None,
    settings: RolloutSettings,
    sampling: SamplingParams,
    group_size: int,
    rng: random.Random | None,
) -> None:
    if not examples:
        raise ValueError("generate_trajectories got no examples")
    if group_size < 1:
        raise ValueError(f"group_size={group_size} must be >= 1")
    if sampling.n != 1:
        raise ValueError(f"SamplingParams.n={sampling.n}: leave n at 1 and set group_size for samples per question")
    if sampling.stop:
        raise ValueError(f"SamplingParams.stop={sampling.stop}: leave it empty, the rollout sets the stop strings")
    cfg = settings.rollout
    if cfg.template not in ROLLOUT_TEMPLATES:  # the recipe checks its own; evaluate's baselines add "direct"
        raise ValueError(f"template={cfg.template!r} is not one of {', '.join(ROLLOUT_TEMPLATES)}")
    can_search = cfg.max_turns > 0 and (not settings.self_search or cfg.self_search_real_share > 0)
    if search is None and can_search:
        raise ValueError(
            f"template={cfg.template!r} with max_turns={cfg.max_turns} runs searches: "
            "pass a search engine (or use template='self-search' with self_search_real_share=0)"
        )
    if 0 < cfg.self_search_real_share < 1 and rng is None:
        raise ValueError(
            "self_search_real_share is between 0 and 1: pass rng=random.Random(seed) to draw "
            "which questions use real search"
        )
    if settings.tool_call:
        check_tool_support(tokenizer, [search_tool_schema()], cfg.chat_template_kwargs)


def _start(
    examples: Sequence[QAExample],
    tokens: _TokenCache,
    settings: RolloutSettings,
    group_size: int,
    rng: random.Random | None,
    logprobs: bool,
) -> list[_Rollout]:
    """Tokenizes each prompt once and opens `group_size` rollouts per example."""
    rollouts = []
    for prompt_id, example in enumerate(examples):
        conversation = _conversation(tokens, example, settings)
        if conversation is not None:
            prompt_ids = tokens.encode(conversation.text)
        else:
            # Rendered and tokenized as the template's reference does (chat template, special tokens).
            prompt_ids = encode_prompt(example.question, template=settings.rollout.template, tokenizer=tokens.tokenizer)
        if len(prompt_ids) >= settings.rollout.max_context_tokens:
            raise DataError(
                f"example {prompt_id} (id {example.id!r}): the prompt has {len(prompt_ids)} tokens, "
                f"leaving no room under max_context_tokens={settings.rollout.max_context_tokens}; raise "
                "max_context_tokens or shorten the question"
            )
        share = settings.rollout.self_search_real_share
        real = share >= 1 or (share > 0 and rng is not None and rng.random() < share)
        for _ in range(group_size):
            rollouts.append(
                _Rollout(
                    prompt_id=prompt_id,
                    example=example,
                    prompt_ids=list(prompt_ids),  # each trajectory owns its lists
                    self_search=settings.self_search and not real,
                    logprobs=[] if logprobs else None,
                    conversation=_conversation(tokens, example, settings),
                )
            )
    return rollouts


def _conversation(tokens: _TokenCache, example: QAExample, settings: RolloutSettings) -> ToolConversation | None:
    """A fresh tool-call conversation, the question as the user message and the search tool offered; None for tags."""
    if not settings.tool_call:
        return None
    messages = tool_call_messages(example.question, settings.rollout.template)
    return ToolConversation(tokens.tokenizer, [search_tool_schema()], messages, settings.rollout.chat_template_kwargs)


def _generate_turn(
    policy: GenerationEngine,
    active: list[_Rollout],
    sampling: SamplingParams,
    settings: RolloutSettings,
    group_size: int,
    first: bool,
    clock: _Clock,
) -> list[Completion]:
    """One generate call per stop list among `active` (one call unless self-search is mixed)."""
    by_stops: dict[tuple[str, ...], list[int]] = {}
    for i, rollout in enumerate(active):
        by_stops.setdefault(rollout.stops(), []).append(i)
    completions: list[Completion | None] = [None] * len(active)
    for stops, indices in by_stops.items():
        rows = [active[i] for i in indices]
        # The call runs to the largest room any row has; rows with less are cut afterwards
        # (`_take_turn`), which keeps one call per turn.
        room = max(settings.rollout.max_context_tokens - row.length() for row in rows)
        params = replace(
            sampling,
            stop=list(stops),
            max_new_tokens=min(sampling.max_new_tokens, room),
            seed=None if sampling.seed is None else sampling.seed + clock.generate_calls,
        )
        if first and group_size > 1:
            # All rollouts are active in the first turn and a question's group shares its stop
            # list, so rows come in whole groups: one prompt per group, n samples each.
            prompts = [row.prompt_ids for row in rows[::group_size]]
            params = replace(params, n=group_size)
        else:
            prompts = [row.context() for row in rows]
        began = time.perf_counter()
        try:
            out = policy.generate(prompts, params)
        except NonFiniteError as err:
            questions = sorted({rows[row].example.id for row in err.rows})
            raise NonFiniteError(
                f"rollout turn {clock.generate_calls + 1}, questions {questions}: {err}", err.rows
            ) from err
        clock.generate_s += time.perf_counter() - began
        clock.generate_calls += 1
        if len(out) != len(rows):
            raise ValueError(
                f"the policy engine returned {len(out)} completions for {len(prompts)} prompts "
                f"x n={params.n}; expected {len(rows)}"
            )
        clock.prompt_tokens += sum(len(prompt) for prompt in prompts)
        clock.decoded_tokens += sum(len(completion.token_ids) for completion in out)
        for i, completion in zip(indices, out):
            if sampling.logprobs and completion.logprobs is None:
                raise ValueError("sampling.logprobs is set but the policy engine returned no logprobs")
            completions[i] = completion
    return completions  # type: ignore[return-value]  # every slot is filled above


def _take_turn(
    rollout: _Rollout,
    completion: Completion,
    tokens: _TokenCache,
    settings: RolloutSettings,
    final: bool,
) -> bool:
    """Appends one generated turn and acts on it; True when it asks for a search to be run."""
    if rollout.conversation is not None:
        return _take_tool_turn(rollout, completion, tokens, settings, final)
    ids, logprobs, cut = _fit(rollout, completion, settings)
    text = tokens.decode(ids) if cut else completion.text
    mask = tokens.self_search_mask(ids) if rollout.self_search else [1] * len(ids)
    rollout.append(ids, mask, logprobs)

    action = parse_action(text)
    kind = action.kind
    if rollout.self_search and kind == "search":
        kind = "invalid"  # the generation ended after its own search without answering
    turn = Turn(
        text=text,
        action=kind,
        query=action.payload if kind == "search" else "",
        self_queries=extract_queries(text) if rollout.self_search else [],
    )
    rollout.turns.append(turn)
    outcome = _settle(rollout, kind, cut, final, completion)
    if outcome == "retry":
        _insert(rollout, tokens.invalid_ids, settings)
    return outcome == "search"


def _fit(
    rollout: _Rollout, completion: Completion, settings: RolloutSettings
) -> tuple[list[int], list[float] | None, bool]:
    """The turn's ids and log-probs cut to the room left in the context, and whether they were cut."""
    room = settings.rollout.max_context_tokens - rollout.length()
    ids, logprobs = completion.token_ids, completion.logprobs
    if len(ids) <= room:
        return ids, logprobs, False
    return ids[:room], None if logprobs is None else logprobs[:room], True


def _settle(rollout: _Rollout, kind: str, cut: bool, final: bool, completion: Completion) -> str:
    """Sets the finish a turn of `kind` gives: "search" (to run), "retry" (invalid, turns left) or "done"."""
    if cut:
        rollout.finish = "context"
    elif kind == "answer":
        rollout.finish = "answer"
    elif kind == "search" and final:
        rollout.over_budget = True  # not run: the turn budget is spent
        rollout.finish = "max_turns"
    elif kind == "search":
        return "search"
    else:
        rollout.num_invalid += 1
        if not final:
            return "retry"
        rollout.finish = "length" if completion.finish_reason == "length" else "gave_up"
    return "done"


def _take_tool_turn(
    rollout: _Rollout, completion: Completion, tokens: _TokenCache, settings: RolloutSettings, final: bool
) -> bool:
    """`_take_turn` for the tool-call protocol: one assistant message, read by `parse_turn`."""
    ids, logprobs, cut = _fit(rollout, completion, settings)
    # A self-search policy's own results (<tool_response> blocks it wrote) stay out of the loss.
    rollout.append(ids, tokens.self_search_mask(ids, TOOL_RESPONSE_TAGS) if rollout.self_search else [1] * len(ids),
                   logprobs)  # fmt: skip
    # The context's text grows by exactly the decoded ids; the message content is that less the
    # end-of-turn token the template writes itself.
    generated = tokens.decode(ids)
    eos = tokens.tokenizer.eos_token
    content = generated[: -len(eos)] if eos and generated.endswith(eos) else generated
    rollout.pending = (generated, content)
    own: list[str] = []
    if rollout.self_search:
        parsed, own = parse_self_search_turn(content, settings.rollout.tool_format)
    else:
        parsed = parse_turn(content, settings.rollout.tool_format)
    rollout.turns.append(
        Turn(
            text=content,
            action=parsed.kind,
            call_queries=[call.query for call in parsed.calls],
            call_reasons=list(parsed.reasons),
            self_queries=own,
        )
    )
    outcome = _settle(rollout, parsed.kind, cut, final, completion)
    if outcome == "retry":
        assert rollout.conversation is not None  # _take_turn sends only tool-call rollouts here
        correction = TOOL_CALL_CORRECTION.format(reasons="; ".join(parsed.reasons))
        _insert(rollout, tokens.encode(rollout.conversation.add_turn(generated, content, [correction])), settings)
    return outcome == "search"


def _insert(rollout: _Rollout, ids: list[int], settings: RolloutSettings) -> None:
    """Appends inserted ids (mask 0) if at least one token of room stays; else ends the rollout."""
    if rollout.length() + len(ids) >= settings.rollout.max_context_tokens:
        rollout.finish = "context"
        return
    rollout.append(ids, [0] * len(ids), None)


def _run_searches(
    searches: list[tuple[_Rollout, Turn]],
    search: SearchEngine,
    tokens: _TokenCache,
    settings: RolloutSettings,
    noise: Callable[[int], int] | None,
    clock: _Clock,
) -> None:
    """Runs all searches of a turn, every call of every row, in one engine call; inserts the results."""
    requests = []
    for rollout, turn, query in _queries(searches):
        num_noisy = 0 if noise is None else noise(settings.top_k)
        if not 0 <= num_noisy <= settings.top_k:
            raise ValueError(f"noise({settings.top_k}) returned {num_noisy}; it must lie in [0, top_k]")
        turn.num_noisy += num_noisy
        requests.append(
            SearchRequest(
                query=query,
                top_k=settings.top_k,
                question=rollout.example.question,
                golden_answers=list(rollout.example.golden_answers),
                num_noisy=num_noisy,
            )
        )
    began = time.perf_counter()
    results = search.search(requests)
    clock.search_s += time.perf_counter() - began
    if len(results) != len(requests):
        raise ValueError(f"the search engine returned {len(results)} result lists for {len(requests)} requests")
    blocks = [render_documents(documents, settings.rendering) for documents in results]
    tagged = [i for i, (rollout, _, _) in enumerate(_queries(searches)) if rollout.conversation is None]
    observations = dict(zip(tagged, tokens.observations([blocks[i] for i in tagged]))) if tagged else {}
    position = 0
    for rollout, turn in searches:
        turn.executed = True
        if rollout.conversation is None:
            turn.documents = list(results[position])
            _insert(rollout, observations[position], settings)
            position += 1
            continue
        calls = range(position, position + len(turn.call_queries))
        position += len(turn.call_queries)
        turn.call_documents = [list(results[i]) for i in calls]
        added = rollout.conversation.add_turn(*rollout.pending, [tokens.cut_text(blocks[i]) for i in calls])
        _insert(rollout, tokens.encode(added), settings)


def _queries(searches: list[tuple[_Rollout, Turn]]) -> list[tuple[_Rollout, Turn, str]]:
    """Every query to run, in order: a tag turn's one query, each call of a tool-call turn."""
    return [
        (rollout, turn, query)
        for rollout, turn in searches
        for query in (turn.call_queries if rollout.conversation is not None else [turn.query])
    ]


def _finish(rollouts: list[_Rollout], tokens: _TokenCache, settings: RolloutSettings, clock: _Clock) -> RolloutResult:
    """Freezes the rollouts into trajectories and computes the batch metrics."""
    texts = tokens.tokenizer.batch_decode(
        [rollout.response_ids for rollout in rollouts],
        skip_special_tokens=False,
        clean_up_tokenization_spaces=False,
    )
    trajectories = []
    for rollout, text in zip(rollouts, texts):
        assert rollout.finish is not None  # the final turn finishes every rollout
        executed = sum(max(1, len(turn.call_queries)) for turn in rollout.turns if turn.executed)
        self_answered = sum(len(turn.self_queries) for turn in rollout.turns)
        trajectories.append(
            Trajectory(
                prompt_id=rollout.prompt_id,
                example=rollout.example,
                prompt_ids=rollout.prompt_ids,
                response_ids=rollout.response_ids,
                loss_mask=rollout.loss_mask,
                turns=rollout.turns,
                response_text=text,
                answer=_answer(rollout, text, settings),
                num_searches=executed + self_answered,
                num_invalid=rollout.num_invalid,
                finish=rollout.finish,
                logprobs=rollout.logprobs,
            )
        )
    metrics = _metrics(trajectories, rollouts, settings, clock)
    total = time.perf_counter() - clock.started
    timings = {
        "time/generate_s": clock.generate_s,
        "time/search_s": clock.search_s,
        "time/assembly_s": total - clock.generate_s - clock.search_s,
        "time/total_s": total,
    }
    return RolloutResult(trajectories=trajectories, metrics=metrics, timings=timings)


def _answer(rollout: _Rollout, text: str, settings: RolloutSettings) -> str | None:
    """The tag protocol's last answer of the response; tool-call's answer of the final assistant message."""
    if rollout.conversation is None:
        return extract_answer(text)
    last = rollout.turns[-1] if rollout.turns else None
    if last is None or last.action != "answer":
        return None
    return parse_turn(last.text, settings.rollout.tool_format).answer


def _metrics(
    trajectories: list[Trajectory], rollouts: list[_Rollout], settings: RolloutSettings, clock: _Clock
) -> dict[str, float]:
    count = len(trajectories)
    executed = [turn for t in trajectories for turn in t.turns if turn.executed]
    searched = sum(max(1, len(turn.call_queries)) for turn in executed)
    metrics = {
        "search/calls_per_traj": sum(t.num_searches for t in trajectories) / count,
        "search/noisy_share": (
            sum(turn.num_noisy for turn in executed) / (searched * settings.top_k) if executed else 0.0
        ),
        "rollout/invalid_actions": sum(t.num_invalid for t in trajectories) / count,
        "rollout/over_budget_searches": sum(r.over_budget for r in rollouts) / count,
        "rollout/answer_rate": sum(t.answer is not None for t in trajectories) / count,
        "rollout/response_len": sum(len(t.response_ids) for t in trajectories) / count,
        "rollout/policy_tokens": sum(sum(t.loss_mask) for t in trajectories) / count,
        "rollout/turns": sum(len(t.turns) for t in trajectories) / count,
        "perf/prompt_tokens": float(clock.prompt_tokens),
        "perf/decoded_tokens": float(clock.decoded_tokens),
    }
    for reason in FINISHES:
        metrics[f"rollout/finish_{reason}"] = sum(t.finish == reason for t in trajectories) / count
    metrics["rollout/unfinished_share"] = sum(t.finish in UNFINISHED for t in trajectories) / count
    if settings.tool_call:
        metrics["rollout/call_errors"] = sum(len(turn.call_reasons) for t in trajectories for turn in t.turns) / count
    if settings.self_search:
        metrics["search/self_calls_per_traj"] = (
            sum(len(turn.self_queries) for t in trajectories for turn in t.turns) / count
        )
    return metrics
