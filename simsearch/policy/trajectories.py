"""A rollout's growing trajectories: their state while the agent loop runs, then the records and batch metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simsearch.policy.protocol import AgentProtocol
from simsearch.types import FINISHES, UNFINISHED, QAExample, Trajectory, TrajectoryFinish, Turn


@dataclass
class Rollout:
    """The growing state of one trajectory."""

    prompt_id: int
    example: QAExample
    prompt_ids: list[int]
    protocol: AgentProtocol  # the protocol this question's rollouts use
    state: Any  # the protocol's own state of this trajectory
    logprobs: list[float] | None
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    num_invalid: int = 0
    over_budget: bool = False
    finish: TrajectoryFinish | None = None

    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def context(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def append(self, ids: list[int], mask: list[int], logprobs: list[float] | None) -> None:
        """Appends a segment of ids with its loss mask (log-probs 0 where the segment has none)."""
        self.response_ids.extend(ids)
        self.loss_mask.extend(mask)
        if self.logprobs is not None:
            self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


@dataclass
class Clock:
    """Time and token counters of one rollout."""

    started: float
    generate_s: float = 0.0
    search_s: float = 0.0
    generate_calls: int = 0
    prompt_tokens: int = 0
    decoded_tokens: int = 0


def freeze(rollouts: list[Rollout], tokenizer: Any) -> list[Trajectory]:
    """The finished rollouts as trajectories, their responses decoded in one call."""
    texts = tokenizer.batch_decode(
        [rollout.response_ids for rollout in rollouts],
        skip_special_tokens=False,
        clean_up_tokenization_spaces=False,
    )
    trajectories = []
    for rollout, text in zip(rollouts, texts):
        assert rollout.finish is not None  # the final turn finishes every rollout
        executed = sum(len(rollout.protocol.queries(turn)) for turn in rollout.turns if turn.executed)
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
                answer=rollout.protocol.answer(rollout.turns, text),
                num_searches=executed + self_answered,
                num_invalid=rollout.num_invalid,
                finish=rollout.finish,
                logprobs=rollout.logprobs,
            )
        )
    return trajectories


def batch_metrics(
    trajectories: list[Trajectory], rollouts: list[Rollout], top_k: int, clock: Clock
) -> dict[str, float]:
    """The batch's statistics every protocol shares (`search/...`, `rollout/...`, `perf/...`)."""
    count = len(trajectories)
    executed = [(r.protocol, turn) for r in rollouts for turn in r.turns if turn.executed]
    searched = sum(len(protocol.queries(turn)) for protocol, turn in executed)
    metrics = {
        "search/calls_per_traj": sum(t.num_searches for t in trajectories) / count,
        "search/noisy_share": (sum(turn.num_noisy for _, turn in executed) / (searched * top_k) if executed else 0.0),
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
    return metrics
