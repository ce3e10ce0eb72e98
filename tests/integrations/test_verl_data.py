"""The verl export and the tool's /retrieve client, without verl: rows, bodies, rendering, the tool config."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from simsearch.data.chat import search_tool_schema
from simsearch.data.qa import load_qa
from simsearch.integrations.search_client import SampleContext, render_answer, retrieve_body
from simsearch.integrations.verl_data import verl_row, write_verl_parquet
from simsearch.types import QAExample

ROOT = Path(__file__).resolve().parents[2]


def test_a_verl_row_carries_the_prompt_the_reward_and_the_tools_kwargs() -> None:
    row = verl_row(QAExample("q7", "Where was Ada born?", ["Lyon", "Lyons"], "hotpotqa"), 3, split="train")
    assert row == {
        "data_source": "searchR1_hotpotqa",  # verl's default reward scores this name by exact match
        "agent_name": "tool_agent",
        "prompt": [
            {
                "role": "user",
                "content": "Answer the given question. You can call the search tool as many times as you want to "
                "find the facts you need. When you know the answer, give it inside <answer> and </answer>, without "
                "detailed illustrations, for example <answer> Beijing </answer>. Question: Where was Ada born?",
            }
        ],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": ["Lyon", "Lyons"]}},
        "extra_info": {
            "split": "train",
            "index": 3,
            "id": "q7",
            "question": "Where was Ada born?",
            "need_tools_kwargs": True,
            "tools_kwargs": {
                "search": {"create_kwargs": {"question": "Where was Ada born?", "golden_answers": ["Lyon", "Lyons"]}}
            },
        },
    }
    assert verl_row(QAExample("1", "Q?", ["A"], "mine"), 0, split="test")["data_source"] == "mine"


def test_the_parquet_reads_back_as_the_same_questions(tmp_path: Path) -> None:
    examples = [QAExample("0", "Where was Ada born?", ["Lyon"], "nq"), QAExample("1", "Who won?", ["Bo", "B."], "nq")]
    assert write_verl_parquet(examples, tmp_path / "out" / "train.parquet", split="train") == 2
    back = load_qa(tmp_path / "out" / "train.parquet")
    assert [(e.question, e.golden_answers, e.data_source) for e in back] == [
        ("Where was Ada born?", ["Lyon"], "searchR1_nq"),
        ("Who won?", ["Bo", "B."], "searchR1_nq"),
    ]
    with pytest.raises(ValueError, match=r"example 1 \(id 'b'\) has no gold answer"):
        write_verl_parquet(
            [QAExample("a", "Q?", ["A"]), QAExample("b", "Q?", [" "])], tmp_path / "x.parquet", split="x"
        )


def test_the_retrieve_body_sends_only_what_is_known() -> None:
    context = SampleContext.from_kwargs({"question": "Where was Ada born?", "golden_answers": "Lyon"})
    assert retrieve_body(["ada", "ada vance"], topk=3, context=context, step=12, client="run-a") == {
        "queries": ["ada", "ada vance"],
        "topk": 3,
        "return_scores": True,
        "question": ["Where was Ada born?", "Where was Ada born?"],
        "golden_answers": [["Lyon"], ["Lyon"]],
        "step": 12,
        "client": "run-a",
    }
    # Nothing known: exactly Search-R1's request.
    assert retrieve_body(["ada"], topk=3, context=SampleContext()) == {
        "queries": ["ada"],
        "topk": 3,
        "return_scores": True,
    }
    with pytest.raises(ValueError, match="golden_answers must be strings"):
        SampleContext.from_kwargs({"golden_answers": [3]})


def test_an_answer_renders_as_search_r1_shows_it() -> None:
    answer = {
        "result": [
            [
                {"document": {"id": "1", "contents": "Paris\nParis is in France."}, "score": 2.0},
                {"document": {"id": "2", "contents": "Lyon\nLyon is on the Rhone.\nIt is old."}, "score": 1.0},
            ]
        ],
        "p_noise": 0.2,
    }
    assert render_answer(answer) == (
        "Doc 1(Title: Paris) Paris is in France.\nDoc 2(Title: Lyon) Lyon is on the Rhone.\nIt is old."
    )
    plain = {"result": [[{"id": "1", "contents": "Paris\nParis is in France."}]]}
    assert render_answer(plain) == "Doc 1(Title: Paris) Paris is in France."


def test_the_shipped_tool_config_names_the_tool_class_and_its_schema() -> None:
    config = yaml.safe_load((ROOT / "integrations" / "verl" / "search_tool.yaml").read_text())
    (tool,) = config["tools"]
    module, _, name = tool["class_name"].rpartition(".")
    source = (ROOT / Path(*module.split("."))).with_suffix(".py")
    assert name in {node.name for node in ast.parse(source.read_text()).body if isinstance(node, ast.ClassDef)}
    assert tool["tool_schema"] == search_tool_schema()  # the schema the tool falls back to
    assert tool["config"]["type"] == "native"
