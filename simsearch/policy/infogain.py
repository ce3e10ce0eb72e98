"""IGPO's information gains: how much each turn raised the policy's probability of the gold answer.

A response is cut into turns (`turn_starts`, from the loss mask): a generated span and the span
inserted after it. With turn k starting at response position s_k (s_0 = 0),

    p_k = exp( mean_j log pi(a_j | prompt, response[:s_k], <answer>, a_<j) ),   k = 0 .. n - 1

by teacher forcing on the first golden answer a (Wang et al. 2025), with log-probs of
softmax(logits / temperature). Turn k's gain is p_{k+1} - p_k (k < n - 1); the final turn keeps
the outcome reward (`advantages.igpo_advantages`). Departures: docs/protocols.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from simsearch.policy.collate import collate_trajectories, logprobs_in_micro_batches, response_logits
from simsearch.policy.masked import masked_mean
from simsearch.policy.tags import ANSWER_OPEN  # the answer form every template asks for: <answer> gold </answer>
from simsearch.types import QAExample, Trajectory


@dataclass(frozen=True)
class GoldQuery:
    """One teacher-forced measurement: the gold answer after a prefix of one trajectory.

    Attributes:
        row: The trajectory (its row in the batch).
        turn: k: the prefix ends where turn k starts (k = 0: the prompt alone).
        context: Prompt ids + the response ids before turn k.
        answer: `<answer>` ids, then the gold answer's ids.
        scored: 1 at the gold answer's ids, 0 at the tag's.
    """

    row: int
    turn: int
    context: list[int]
    answer: list[int]
    scored: list[int]


def turn_starts(loss_mask: Sequence[int]) -> list[int]:
    """Response positions where turns start: 0, then every generated token that follows an inserted one."""
    return [0] + [j for j in range(1, len(loss_mask)) if loss_mask[j] and not loss_mask[j - 1]]


def turn_index(trajectories: Sequence[Trajectory], width: int) -> torch.Tensor:
    """`[B, width]` turn of each response token (`turn_starts`), -1 past each response's end."""
    out = torch.full((len(trajectories), width), -1, dtype=torch.long)
    for b, trajectory in enumerate(trajectories):
        bounds = [*turn_starts(trajectory.loss_mask), len(trajectory.response_ids)]
        for k in range(len(bounds) - 1):
            out[b, bounds[k] : bounds[k + 1]] = k
    return out


def answer_ids(tokenizer: Any, gold: str) -> tuple[list[int], list[int]]:
    """(ids of `<answer>`, ids of ` gold`) of the answer form, tokenized apart; no gold ids for an empty answer."""
    tag = tokenizer.encode(ANSWER_OPEN, add_special_tokens=False)
    gold = gold.strip()
    return tag, tokenizer.encode(" " + gold, add_special_tokens=False) if gold else []


def gold_queries(trajectories: Sequence[Trajectory], tokenizer: Any, fill: bool = False) -> list[GoldQuery]:
    """The measurements IGPO needs: every turn start of every trajectory of two turns or more.

    Args:
        trajectories: The step's trajectories, in batch row order.
        tokenizer: The policy's tokenizer (for the gold answers).
        fill: With nothing to measure, return one query all the same (the first trajectory's
            prompt; its result is unused): under ZeRO-3 every process must run forward passes.

    Returns:
        Queries in row order, then turn order.
    """
    queries = []
    for b, trajectory in enumerate(trajectories):
        starts = turn_starts(trajectory.loss_mask)
        golden = trajectory.example.golden_answers
        tag, gold = answer_ids(tokenizer, golden[0] if golden else "")
        if len(starts) < 2 or not gold:
            continue
        for k, start in enumerate(starts):
            context = trajectory.prompt_ids + trajectory.response_ids[:start]
            queries.append(GoldQuery(b, k, context, tag + gold, [0] * len(tag) + [1] * len(gold)))
    if fill and not queries and trajectories:
        first = trajectories[0]
        tag, _ = answer_ids(tokenizer, "")
        queries.append(GoldQuery(0, 0, list(first.prompt_ids), tag, [0] * len(tag)))
    return queries


def distinct(queries: Sequence[GoldQuery]) -> tuple[list[GoldQuery], list[int]]:
    """The queries worth a forward pass: each (context, answer) once, and every query's index among them.

    All trajectories of a group share their prompt-alone prefix, and often their first search, so
    a step holds far fewer distinct measurements than queries.
    """
    first: dict[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]], int] = {}
    unique: list[GoldQuery] = []
    index = []
    for q in queries:
        key = (tuple(q.context), tuple(q.answer), tuple(q.scored))
        if key not in first:
            first[key] = len(unique)
            unique.append(q)
        index.append(first[key])
    return unique, index


@torch.no_grad()
def gold_probabilities(
    model: nn.Module,
    queries: Sequence[GoldQuery],
    *,
    pad_id: int,
    device: torch.device | str,
    micro_batch_size: int,
    temperature: float = 1.0,
    passes: int = 0,
) -> torch.Tensor:
    """`[N]` exp(mean log-prob of each query's scored tokens), in length-sorted micro-batches.

    Every query given is run: pass the `distinct` ones and expand the result with its index, so a
    measurement shared by several trajectories (a group's prompt alone) costs one forward row.

    Args:
        model: The policy (a causal LM accepting `position_ids` and `logits_to_keep`); the caller
            chooses the autocast.
        queries: The measurements to run (`distinct` over `gold_queries`).
        pad_id: Any token id, written at padding.
        device: The model's device.
        micro_batch_size: Most queries per forward pass.
        temperature: The rollout's sampling temperature.
        passes: At least this many forward passes (`forward_passes` counts the needed ones): extra ones
            rerun the first query and are discarded (ZeRO-3 gathers weights in every pass, so every
            process runs as many).

    Returns:
        `[N]` float32 on CPU; 1.0 for a query without scored tokens.
    """
    if not queries:
        if passes > 0:
            raise ValueError("gold_probabilities: forward passes asked for, but no query to run (use fill=True)")
        return torch.zeros(0)
    records = [
        Trajectory(prompt_id=q.row, example=_NO_EXAMPLE, prompt_ids=q.context, response_ids=q.answer,
                   loss_mask=q.scored, turns=[], response_text="", answer=None, num_searches=0, num_invalid=0,
                   finish="answer")
        for q in queries
    ]  # fmt: skip
    # The update's layout: prefixes left-padded, answers right-padded, logits at the answers only.
    batch = collate_trajectories(records, pad_id).to(device)
    logp = logprobs_in_micro_batches(model, batch, micro_batch_size, temperature)  # [N, A]
    for _ in range(passes - forward_passes(len(queries), micro_batch_size)):
        response_logits(model, batch.select(torch.arange(1, device=batch.input_ids.device)))
    return torch.exp(masked_mean(logp, batch.loss_mask, dim=-1)).float().cpu()


def forward_passes(num_queries: int, micro_batch_size: int) -> int:
    """Forward passes `gold_probabilities` needs for `num_queries` queries: ceil(N / micro_batch_size)."""
    return -(-num_queries // micro_batch_size)


_NO_EXAMPLE = QAExample(id="", question="", golden_answers=[])


def information_gains(queries: Sequence[GoldQuery], probabilities: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """`[B, K - 1]` gain of each non-final turn, p_{k+1} - p_k; 0 where a probability was not measured.

    Args:
        queries: The measurements.
        probabilities: `[N]` their results (`gold_probabilities`).
        turns: `[B, L]` `turn_index` of the batch (K = its largest turn + 1).
    """
    rows = turns.shape[0]
    width = max(int(turns.max()) + 1, 1) if turns.numel() else 1  # K
    table = torch.zeros((rows, width), dtype=torch.float32)  # [B, K]
    measured = torch.zeros((rows, width), dtype=torch.bool)
    for q, p in zip(queries, probabilities.tolist(), strict=True):
        if q.turn < width:
            table[q.row, q.turn] = p
            measured[q.row, q.turn] = True
    both = measured[:, 1:] & measured[:, :-1]
    return torch.where(both, table[:, 1:] - table[:, :-1], torch.zeros_like(table[:, 1:]))
