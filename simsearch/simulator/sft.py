"""Supervised fine-tuning of the simulator: the SFT-specific pieces `simsearch simulator finetune` runs.

The loss is on response tokens only, averaged over a whole optimizer step; the prompt is
tokenized as the simulator engine tokenizes it at inference. Batches are a pure function of
(seed, step, rank).
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from simsearch.errors import DataError
from simsearch.simulator.prompts import as_chat

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

IGNORE_INDEX = -100


def read_pairs(path: str | Path) -> list[dict]:
    """SFT pairs from JSONL objects with string `prompt` and `response` (and optional `golden_answers`).

    Raises:
        DataError: The file is missing or empty, or a line is malformed, naming file and line.
    """
    source = Path(path)
    if not source.is_file():
        raise DataError(f"{source}: SFT pairs file not found (write it with `simsearch simulator collect`)")
    pairs = []
    with source.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{source}:{line_no}: not valid JSON ({err.msg})") from None
            for key in ("prompt", "response"):
                if not isinstance(row, dict) or not isinstance(row.get(key), str):
                    raise DataError(f"{source}:{line_no}: needs a string {key!r} field")
            answers = row.get("golden_answers", [])
            if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
                raise DataError(f"{source}:{line_no}: 'golden_answers' must be a list of strings")
            pairs.append({"prompt": row["prompt"], "response": row["response"], "golden_answers": answers})
    if not pairs:
        raise DataError(f"{source}: no pairs in the file")
    return pairs


@dataclass
class TokenizedPair:
    """One training sequence: prompt then response tokens, labels -100 on the prompt.

    `weights` per position: 0 on the prompt, 1 on the response, `answer_weight` on answer tokens.
    """

    input_ids: list[int]
    labels: list[int]
    weights: list[float]


def tokenize_pair(
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    response: str,
    *,
    chat_template: bool,
    max_length: int,
    answers: Sequence[str] = (),
    answer_weight: float = 1.0,
) -> TokenizedPair | None:
    """Tokenizes one pair as the simulator engine sees it, eos after the response; None if no response token fits.

    Args:
        chat_template: Send the prompt through the chat template (`prompts.as_chat`).
        max_length: Longest sequence; the response is cut to fit.
        answers: Gold answers; response tokens overlapping a whole-word occurrence get
            `answer_weight`.
    """
    if chat_template:
        prompt_ids = tokenizer(as_chat(prompt, tokenizer), add_special_tokens=False)["input_ids"]
    else:
        prompt_ids = tokenizer(prompt)["input_ids"]
    encoded = tokenizer(response, add_special_tokens=False, return_offsets_mapping=answer_weight != 1.0)
    response_ids = encoded["input_ids"] + [tokenizer.eos_token_id]
    weights = [1.0] * len(response_ids)
    if answer_weight != 1.0:
        spans = [m.span() for a in answers if a.strip() for m in re.finditer(rf"\b{re.escape(a)}\b", response)]
        for i, (start, end) in enumerate(encoded["offset_mapping"]):
            if any(start < span_end and end > span_start for span_start, span_end in spans):
                weights[i] = answer_weight
    if len(prompt_ids) >= max_length:
        return None
    kept = max_length - len(prompt_ids)
    return TokenizedPair(
        input_ids=prompt_ids + response_ids[:kept],
        labels=[IGNORE_INDEX] * len(prompt_ids) + response_ids[:kept],
        weights=[0.0] * len(prompt_ids) + weights[:kept],
    )


def tokenize_pairs(
    pairs: Sequence[dict[str, str]],
    tokenizer: PreTrainedTokenizerBase,
    *,
    chat_template: bool,
    max_length: int,
    answer_weight: float = 1.0,
) -> tuple[list[TokenizedPair], int]:
    """Tokenizes every pair (see `tokenize_pair`); returns (kept pairs, number dropped for length)."""
    out = [
        tokenize_pair(
            tokenizer,
            p["prompt"],
            p["response"],
            chat_template=chat_template,
            max_length=max_length,
            answers=p.get("golden_answers", ()),
            answer_weight=answer_weight,
        )
        for p in pairs
    ]
    kept = [t for t in out if t is not None]
    return kept, len(out) - len(kept)


def collate(batch: Sequence[TokenizedPair], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pads a batch: input ids (pad_id), attention mask, labels (-100 on padding), weights (0)."""
    width = max(len(item.input_ids) for item in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)  # [B, T]
    labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)  # [B, T]
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)  # [B, T]
    weights = torch.zeros((len(batch), width), dtype=torch.float32)  # [B, T]
    for b, item in enumerate(batch):
        n = len(item.input_ids)
        input_ids[b, :n] = torch.tensor(item.input_ids)
        labels[b, :n] = torch.tensor(item.labels)
        attention_mask[b, :n] = 1
        weights[b, :n] = torch.tensor(item.weights)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels, "weights": weights}


def count_targets(weights: torch.Tensor) -> float:
    """What a batch's loss is divided by: the summed weights of the positions after the one-token shift."""
    return float(weights[:, 1:].sum())


def response_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted sum of next-token cross-entropies: logits [B, T, V], labels [B, T] (-100: none), weights [B, T]."""
    shifted_logits = logits[:, :-1, :].float()  # [B, T-1, V]
    shifted_labels = labels[:, 1:]  # [B, T-1]
    token_loss = F.cross_entropy(
        shifted_logits.reshape(-1, shifted_logits.size(-1)),
        shifted_labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    )  # [B * (T-1)], 0 where ignored
    return (token_loss * weights[:, 1:].reshape(-1)).sum()


@lru_cache(maxsize=4)
def _permutation(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    order = list(range(n))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return tuple(order)


def step_batches(
    n: int,
    *,
    step: int,
    batch_size: int,
    grad_accum: int,
    rank: int,
    world_size: int,
    seed: int,
    lengths: Sequence[int] | None = None,
) -> list[list[int]]:
    """The `grad_accum` micro-batches (pair indices) of optimizer step `step` for one rank.

    Steps consume an endless stream of epochs, each a permutation seeded by (seed, epoch). With
    `lengths`, the rank's pairs are sorted longest first before being cut (same gradient).
    """
    chosen = []
    for a in range(grad_accum):
        start = ((step * grad_accum + a) * world_size + rank) * batch_size
        chosen += [_permutation(n, seed, p // n)[p % n] for p in range(start, start + batch_size)]
    if lengths is not None:
        chosen.sort(key=lambda i: lengths[i], reverse=True)
    return [chosen[i : i + batch_size] for i in range(0, len(chosen), batch_size)]


def eval_batches(n: int, *, batch_size: int, rank: int, world_size: int) -> list[tuple[list[int], bool]]:
    """A rank's share of a validation pass: (indices, counted) per batch, the same count on every rank."""
    chunks = [list(range(i, min(i + batch_size, n))) for i in range(0, n, batch_size)]
    per_rank = math.ceil(len(chunks) / world_size)
    out = []
    for j in range(per_rank):
        b = j * world_size + rank
        out.append((chunks[b], True) if b < len(chunks) else (chunks[0], False))
    return out
