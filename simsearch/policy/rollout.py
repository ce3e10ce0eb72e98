"""The batched multi-turn agent loop, at the token level.

`generate_trajectories` runs the policy on a batch of questions, `group_size` rollouts each:

1. Render each question's prompt and tokenize it once.
2. Each turn, ask the policy to continue every unfinished trajectory in ONE `generate` call
   (one per stop list when rollouts differ in it), stopping at the protocol's stop strings; the
   protocol reads each turn (search, answer or invalid) and gives the loss mask of its ids.
3. Answer every search of the turn in ONE `SearchEngine.search` call (the curriculum's `noise`
   decides how many of each call's documents must be noisy); the protocol renders and tokenizes
   the results, appended with loss mask 0. An invalid turn gets the protocol's correction (mask 0).
   An answer ends the trajectory.
4. After `max_turns` such turns, one final turn in which a search is not run.

How a search is written, read and answered is the protocol's (`policy.protocol.AgentProtocol`:
Search-R1's tags, chat-template tool calls, or either self-searched); this loop never asks which.
Loss masks are built from the token ids of each appended segment as it is appended: generated
ids get the protocol's mask, inserted ids 0; nothing is decoded and re-tokenized to find them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from transformers import PreTrainedTokenizerBase

from simsearch.data.rendering import RenderStyle
from simsearch.data.templates import TEMPLATE_NAMES
from simsearch.errors import DataError, NonFiniteError
from simsearch.generation.base import GenerationEngine
from simsearch.policy.protocol import AgentProtocol, TokenCache
from simsearch.policy.protocols import make_protocol
from simsearch.policy.recipe import RolloutConfig
from simsearch.policy.trajectories import Clock, Rollout, batch_metrics, freeze
from simsearch.retrieval.base import SearchEngine
from simsearch.types import Completion, Document, QAExample, SamplingParams, SearchRequest, Trajectory, Turn

ROLLOUT_TEMPLATES: tuple[str, ...] = tuple(name for name in TEMPLATE_NAMES if name != "rag")
"""Templates a rollout can start from ("rag" needs documents in the prompt and is not one)."""


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
        search: Answers the searches; None only when none can run (`max_turns=0`, self-search alone).
        settings: The loop's limits, template and rendering.
        sampling: Per-turn sampling; `stop` and `n` left at their defaults (the rollout sets them);
            `max_new_tokens` is per turn; with a `seed`, generate call c uses seed + c.
        group_size: Rollouts per example (GRPO's G).
        noise: `noise(top_k)`: how many documents of one search must be noisy (None: always 0).
        rng: Draws the questions that use real search (needed when 0 < `self_search_real_share` < 1).
        should_stop: Asked at each turn boundary, before each turn (a preemption's early stop).

    Returns:
        The trajectories and the batch's metrics (`trajectories.batch_metrics`, then the protocol's).

    Raises:
        DataError: an example whose prompt leaves no room under `max_context_tokens`.
        NonFiniteError: the policy's logits were inf or nan (names the call and the questions).
        RolloutStopped: `should_stop()` said True at a turn boundary; nothing is returned.
        ValueError: an argument the loop cannot honour, or an engine's result count or a `noise`
            count out of range.
    """
    protocol = make_protocol(settings.rollout)
    _check_arguments(examples, tokenizer, search, settings, sampling, group_size, rng, protocol)
    clock = Clock(started=time.perf_counter())
    tokens = TokenCache(tokenizer, settings.rollout.max_obs_tokens)
    rollouts = _start(examples, tokens, settings, protocol, group_size, rng, sampling.logprobs)

    for turn in range(settings.rollout.max_turns + 1):
        active = [rollout for rollout in rollouts if rollout.finish is None]
        if not active:
            break
        if should_stop is not None and should_stop():
            raise RolloutStopped(turn)
        completions = _generate_turn(policy, active, sampling, settings, group_size, turn == 0, clock)
        searches: list[tuple[Rollout, Turn]] = []
        for rollout, completion in zip(active, completions):
            if _take_turn(rollout, completion, tokens, settings, turn == settings.rollout.max_turns):
                searches.append((rollout, rollout.turns[-1]))
        if searches:
            assert search is not None  # _check_arguments: searches happen only with an engine
            _run_searches(searches, search, tokens, settings, noise, clock)

    return _finish(rollouts, tokens, settings, protocol, clock)


def _check_arguments(
    examples: Sequence[QAExample],
    tokenizer: PreTrainedTokenizerBase,
    search: SearchEngine | None,
    settings: RolloutSettings,
    sampling: SamplingParams,
    group_size: int,
    rng: random.Random | None,
    protocol: AgentProtocol,
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
    can_search = cfg.max_turns > 0 and protocol.uses_engine
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
    protocol.check(tokenizer)


def _start(
    examples: Sequence[QAExample],
    tokens: TokenCache,
    settings: RolloutSettings,
    protocol: AgentProtocol,
    group_size: int,
    rng: random.Random | None,
    logprobs: bool,
) -> list[Rollout]:
    """Tokenizes each prompt once and opens `group_size` rollouts per example."""
    rollouts = []
    for prompt_id, example in enumerate(examples):
        prompt_ids = protocol.prompt(tokens, example)
        if len(prompt_ids) >= settings.rollout.max_context_tokens:
            raise DataError(
                f"example {prompt_id} (id {example.id!r}): the prompt has {len(prompt_ids)} tokens, "
                f"leaving no room under max_context_tokens={settings.rollout.max_context_tokens}; raise "
                "max_context_tokens or shorten the question"
            )
        speaks = protocol.for_question(rng)
        for _ in range(group_size):
            rollouts.append(
                Rollout(
                    prompt_id=prompt_id,
                    example=example,
                    prompt_ids=list(prompt_ids),  # each trajectory owns its lists
                    protocol=speaks,
                    state=speaks.start(tokens, example),
                    logprobs=[] if logprobs else None,
                )
            )
    return rollouts


def _generate_turn(
    policy: GenerationEngine,
    active: list[Rollout],
    sampling: SamplingParams,
    settings: RolloutSettings,
    group_size: int,
    first: bool,
    clock: Clock,
) -> list[Completion]:
    """One generate call per stop list among `active` (one call unless the rollouts' protocols differ in it)."""
    by_stops: dict[tuple[str, ...], list[int]] = {}
    for i, rollout in enumerate(active):
        by_stops.setdefault(rollout.protocol.stops, []).append(i)
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
    rollout: Rollout,
    completion: Completion,
    tokens: TokenCache,
    settings: RolloutSettings,
    final: bool,
) -> bool:
    """Appends one generated turn and acts on it; True when it asks for a search to be run."""
    ids, logprobs, cut = _fit(rollout, completion, settings)
    turn, mask = rollout.protocol.read(tokens, rollout.state, ids, completion, cut)
    rollout.append(ids, mask, logprobs)
    rollout.turns.append(turn)
    outcome = _settle(rollout, turn.action, cut, final, completion)
    if outcome == "retry":
        _insert(rollout, rollout.protocol.correction(tokens, rollout.state, turn), settings)
    return outcome == "search"


def _fit(
    rollout: Rollout, completion: Completion, settings: RolloutSettings
) -> tuple[list[int], list[float] | None, bool]:
    """The turn's ids and log-probs cut to the room left in the context, and whether they were cut."""
    room = settings.rollout.max_context_tokens - rollout.length()
    ids, logprobs = completion.token_ids, completion.logprobs
    if len(ids) <= room:
        return ids, logprobs, False
    return ids[:room], None if logprobs is None else logprobs[:room], True


def _settle(rollout: Rollout, kind: str, cut: bool, final: bool, completion: Completion) -> str:
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


def _insert(rollout: Rollout, ids: list[int], settings: RolloutSettings) -> None:
    """Appends inserted ids (mask 0) if at least one token of room stays; else ends the rollout."""
    if rollout.length() + len(ids) >= settings.rollout.max_context_tokens:
        rollout.finish = "context"
        return
    rollout.append(ids, [0] * len(ids), None)


def _run_searches(
    searches: list[tuple[Rollout, Turn]],
    search: SearchEngine,
    tokens: TokenCache,
    settings: RolloutSettings,
    noise: Callable[[int], int] | None,
    clock: Clock,
) -> None:
    """Runs all searches of a turn, every query of every row, in one engine call; inserts the results."""
    requests = []
    for rollout, turn in searches:
        for query in rollout.protocol.queries(turn):
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
    # Each protocol renders its rows' results together (one tokenizer call for the tag protocol's).
    by_protocol: dict[AgentProtocol, list[tuple[Rollout, Turn, list[list[Document]]]]] = {}
    position = 0
    for rollout, turn in searches:
        turn.executed = True
        count = len(rollout.protocol.queries(turn))
        by_protocol.setdefault(rollout.protocol, []).append((rollout, turn, results[position : position + count]))
        position += count
    for protocol, rows in by_protocol.items():
        inserted = protocol.observe(tokens, [(row.state, turn, found) for row, turn, found in rows], settings.rendering)
        for (rollout, _, _), ids in zip(rows, inserted):
            _insert(rollout, ids, settings)


def _finish(rollouts: list[Rollout], tokens: TokenCache, settings: RolloutSettings, protocol: AgentProtocol,
            clock: Clock) -> RolloutResult:  # fmt: skip
    """Freezes the rollouts into trajectories and computes the batch metrics."""
    trajectories = freeze(rollouts, tokens.tokenizer)
    metrics = batch_metrics(trajectories, rollouts, settings.top_k, clock) | protocol.metrics(trajectories)
    total = time.perf_counter() - clock.started
    timings = {
        "time/generate_s": clock.generate_s,
        "time/search_s": clock.search_s,
        "time/assembly_s": total - clock.generate_s - clock.search_s,
        "time/total_s": total,
    }
    return RolloutResult(trajectories=trajectories, metrics=metrics, timings=timings)
