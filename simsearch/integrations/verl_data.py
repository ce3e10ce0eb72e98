"""QA data as the Parquet rows verl's tool agent loop trains on, the search tool's kwargs included.

Each row: `data_source`, `agent_name` (verl's `tool_agent`), `prompt` (the tool-call protocol's
user message, `data.chat.tool_call_messages`), `ability`, `reward_model.ground_truth.target` (the
gold answers) and `extra_info` with `tools_kwargs.search.create_kwargs = {question,
golden_answers}`, which verl hands the tool's `create`. A source verl's built-in exact-match reward
knows is written as its `searchR1_<name>`; any other keeps its name and needs verl's
`custom_reward_function`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from simsearch.data.chat import SEARCH_TOOL, tool_call_messages
from simsearch.types import QAExample

VERL_EM_SOURCES: tuple[str, ...] = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
"""The datasets verl's default reward scores by exact match, as `searchR1_<name>`."""

VERL_AGENT = "tool_agent"
"""verl's agent loop that calls tools."""


def verl_data_source(name: str) -> str:
    """`searchR1_<name>` for a dataset verl's default reward knows, else `name` unchanged."""
    return f"searchR1_{name}" if name in VERL_EM_SOURCES else name


def verl_row(example: QAExample, index: int, *, split: str, template: str = "search-r1") -> dict[str, Any]:
    """One verl row for `example` (the module docstring lists its fields); `template` picks the
    user message as `data.chat.tool_call_messages` does."""
    answers = list(example.golden_answers)
    return {
        "data_source": verl_data_source(example.data_source),
        "agent_name": VERL_AGENT,
        "prompt": tool_call_messages(example.question, template),
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
        "extra_info": {
            "split": split,
            "index": index,
            "id": example.id,
            "question": example.question,
            "need_tools_kwargs": True,
            "tools_kwargs": {SEARCH_TOOL: {"create_kwargs": {"question": example.question, "golden_answers": answers}}},
        },
    }


def write_verl_parquet(
    examples: Iterable[QAExample], path: str | os.PathLike[str], *, split: str, template: str = "search-r1"
) -> int:
    """Writes `verl_row` of each example to a Parquet file (folders created); returns the rows written.

    Raises:
        ValueError: No examples, or one without a gold answer (verl's reward would score it 0 always).
    """
    rows = []
    for index, example in enumerate(examples):
        if not any(answer.strip() for answer in example.golden_answers):
            raise ValueError(f"example {index} (id {example.id!r}) has no gold answer; drop it or fix the data")
        rows.append(verl_row(example, index, split=split, template=template))
    if not rows:
        raise ValueError("no examples to write; check the QA file and its split")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return len(rows)
