"""QA loading: FlashRAG JSONL/JSON, verl-style Parquet, directories, errors, and our writer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simsearch.data import qa
from simsearch.data.qa import QADataError, as_answer_list, load_qa, write_qa_jsonl
from simsearch.data.templates import render_prompt
from simsearch.types import QAExample


def _write_jsonl(path: Path, rows: list[object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _verl_row(i: int, question: str, answers: list[str], source: str = "nq") -> dict:
    # The row layout Search-R1's data preparation writes (question/golden_answers dropped here).
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": render_prompt(question, template="search-r1")}],
        "ability": "fact-reasoning",
        "reward_model": {"ground_truth": {"target": answers}, "style": "rule"},
        "extra_info": {"index": i, "split": "test"},
    }


# --------------------------------------------------------------------------- FlashRAG


def test_flashrag_jsonl(tmp_path: Path) -> None:
    path = _write_jsonl(
        tmp_path / "nq" / "test.jsonl",
        [
            {"id": "test_0", "question": "who wrote hamlet?", "golden_answers": ["Shakespeare", "W. Shakespeare"]},
            {"id": "test_1", "question": "capital of peru?", "golden_answers": "Lima"},  # a bare string
        ],
    )
    examples = load_qa(path)
    assert examples == [
        QAExample("test_0", "who wrote hamlet?", ["Shakespeare", "W. Shakespeare"], data_source="nq"),
        QAExample("test_1", "capital of peru?", ["Lima"], data_source="nq"),
    ]


def test_numeric_looking_string_answers_stay_strings(tmp_path: Path) -> None:
    # datasets' JSON loader turns the string "1984" into an int when the column mixes types.
    path = _write_jsonl(
        tmp_path / "years.jsonl",
        [
            {"id": "a", "question": "q1", "golden_answers": ["x"]},
            {"id": "b", "question": "q2", "golden_answers": "1984"},
            {"id": "c", "question": "q3", "golden_answers": "true"},
        ],
    )
    assert [ex.golden_answers for ex in load_qa(path)] == [["x"], ["1984"], ["true"]]


def test_json_array_file_and_data_source_from_stem(tmp_path: Path) -> None:
    path = tmp_path / "popqa_small.json"
    path.write_text(json.dumps([{"id": 7, "question": "q", "golden_answers": ["a"]}]), encoding="utf-8")
    assert load_qa(path) == [QAExample("7", "q", ["a"], data_source="popqa_small")]


def test_data_source_argument_is_used_when_rows_have_none(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "test.jsonl", [{"id": "0", "question": "q", "golden_answers": ["a"]}])
    assert load_qa(path, data_source="bamboogle")[0].data_source == "bamboogle"


def test_directory_with_split(tmp_path: Path) -> None:
    _write_jsonl(tmp_path / "hotpotqa" / "dev.jsonl", [{"id": "d0", "question": "q", "golden_answers": ["a"]}])
    _write_jsonl(tmp_path / "hotpotqa" / "train.jsonl", [{"id": "t0", "question": "q", "golden_answers": ["a"]}])
    examples = load_qa(tmp_path / "hotpotqa", split="dev")
    assert [(ex.id, ex.data_source) for ex in examples] == [("d0", "hotpotqa")]
    with pytest.raises(FileNotFoundError, match="no file for split 'test'"):
        load_qa(tmp_path / "hotpotqa", split="test")
    with pytest.raises(ValueError, match="pass split="):
        load_qa(tmp_path / "hotpotqa")


def test_split_for_a_file_is_refused(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "nq.jsonl", [{"id": "0", "question": "q", "golden_answers": ["a"]}])
    with pytest.raises(ValueError, match="pass split=None"):
        load_qa(path, split="test")


def test_empty_golden_answers_are_dropped(tmp_path: Path) -> None:
    # An empty gold answer would give EM = 1 to an empty prediction.
    path = _write_jsonl(tmp_path / "x.jsonl", [{"id": "0", "question": "q", "golden_answers": ["", "Lima", " "]}])
    assert load_qa(path)[0].golden_answers == ["Lima"]


# --------------------------------------------------------------------------- verl Parquet


def test_verl_parquet_recovers_question_from_prompt(tmp_path: Path) -> None:
    rows = [_verl_row(0, "who wrote hamlet?", ["Shakespeare"]), _verl_row(1, "capital of peru?", ["Lima"], "triviaqa")]
    path = tmp_path / "search_r1_test.parquet"
    pd.DataFrame(rows).to_parquet(path)
    examples = load_qa(path)
    assert [ex.question for ex in examples] == ["who wrote hamlet?", "capital of peru?"]
    assert [ex.golden_answers for ex in examples] == [["Shakespeare"], ["Lima"]]
    # each row keeps its own data source, so evaluation can report per dataset
    assert [ex.data_source for ex in examples] == ["nq", "triviaqa"]
    assert [ex.id for ex in examples] == ["nq_0", "triviaqa_1"]
    assert examples[0].prompt == render_prompt("who wrote hamlet?", template="search-r1")


def test_verl_parquet_prefers_question_and_golden_answers_columns(tmp_path: Path) -> None:
    row = _verl_row(0, "who wrote hamlet?", ["from reward model"])
    row |= {"id": "test_0", "question": "Who wrote Hamlet", "golden_answers": np.array(["Shakespeare", "Will"])}
    path = tmp_path / "train.parquet"
    pd.DataFrame([row]).to_parquet(path)
    (ex,) = load_qa(path, data_source="ignored because the row has one")
    assert ex == QAExample(
        "test_0",
        "Who wrote Hamlet",
        ["Shakespeare", "Will"],
        data_source="nq",
        prompt=render_prompt("who wrote hamlet?", template="search-r1"),
    )


def test_flashrag_parquet(tmp_path: Path) -> None:
    path = tmp_path / "nq" / "test.parquet"
    path.parent.mkdir()
    pd.DataFrame({"id": ["a", "b"], "question": ["q1", "q2"], "golden_answers": [["x", "y"], ["z"]]}).to_parquet(path)
    assert [(ex.id, ex.golden_answers, ex.data_source) for ex in load_qa(path)] == [
        ("a", ["x", "y"], "nq"),
        ("b", ["z"], "nq"),
    ]


def test_ground_truth_given_directly_without_target(tmp_path: Path) -> None:
    path = _write_jsonl(
        tmp_path / "v.jsonl",
        [{"data_source": "nq", "prompt": "Question: q?\n", "reward_model": {"ground_truth": ["a", "b"]}}],
    )
    (ex,) = load_qa(path)
    assert (ex.question, ex.golden_answers, ex.prompt) == ("q?", ["a", "b"], "Question: q?\n")


def test_verl_parquet_with_bare_question_and_split_answers(tmp_path: Path) -> None:
    # IGPO's test split: the user message is the question itself, the answers one string.
    rows = [
        {
            "data_source": "nq",
            "prompt": [{"role": "user", "content": "who wrote hamlet?"}],
            "reward_model": {"ground_truth": "Shakespeare<|answer_split|>William Shakespeare", "style": "rule"},
            "extra_info": {"index": 7, "split": "test"},
        },
        {
            "data_source": "popqa",
            "prompt": [
                {"role": "system", "content": "Use <search> and <answer>."},
                {"role": "user", "content": " capital of peru? \n"},
            ],
            "reward_model": {"ground_truth": "Lima", "style": "rule"},
            "extra_info": {"index": 8, "split": "test"},
        },
    ]
    path = tmp_path / "igpo_test.parquet"
    pd.DataFrame(rows).to_parquet(path)
    examples = load_qa(path)
    assert [(ex.id, ex.question, ex.golden_answers) for ex in examples] == [
        ("nq_7", "who wrote hamlet?", ["Shakespeare", "William Shakespeare"]),
        ("popqa_8", "capital of peru?", ["Lima"]),
    ]


def test_answer_split_marker_in_target_and_empty_parts(tmp_path: Path) -> None:
    row = {"question": "q", "reward_model": {"ground_truth": {"target": "a<|answer_split|><|answer_split|>b"}}}
    (ex,) = load_qa(_write_jsonl(tmp_path / "v.jsonl", [row]))
    assert ex.golden_answers == ["a", "b"]  # an empty part is no answer


def test_as_answer_list_accepts_numpy_arrays() -> None:
    assert as_answer_list(np.array(["a", "b"], dtype=object), where="f") == ["a", "b"]
    assert as_answer_list("a", where="f") == ["a"]
    with pytest.raises(QADataError, match="f: golden answers must be"):
        as_answer_list(np.array([1, 2]), where="f")


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        ({"id": "2", "golden_answers": ["a"]}, r"line 3: key 'question' is missing"),
        ({"id": "2", "question": 5, "golden_answers": ["a"]}, r"line 3: key 'question' must be a string"),
        ({"id": "2", "question": "  ", "golden_answers": ["a"]}, r"line 3: key 'question' is empty"),
        ({"id": "2", "question": "q"}, r"line 3: no golden answers"),
        ({"id": "2", "question": "q", "golden_answers": []}, r"line 3: key 'golden_answers': no golden answers"),
        (
            {"id": "2", "question": "q", "golden_answers": ["a", 3]},
            r"line 3: key 'golden_answers': golden answers must be",
        ),
        ({"id": "2", "question": "q", "golden_answers": {"a": 1}}, r"line 3: key 'golden_answers'"),
        ({"id": ["x"], "question": "q", "golden_answers": ["a"]}, r"line 3: key 'id' must be"),
        (["not", "an", "object"], r"line 3: a row must be a JSON object"),
        (
            {"prompt": "no marker here", "reward_model": {"ground_truth": {"target": ["a"]}}},
            r"line 3: .*no 'Question: '",
        ),
        # a templated user message (it names the tags) without the marker is not a bare question
        (
            {
                "prompt": [{"role": "user", "content": "Answer in <answer> tags: q"}],
                "reward_model": {"ground_truth": "a"},
            },
            r"line 3: .*no 'Question: '",
        ),
        (
            {"question": "q", "reward_model": {"ground_truth": {"style": "rule"}}},
            r"line 3: key 'reward_model.ground_truth.target' is missing",
        ),
        (
            {"question": "q", "prompt": [{"role": "system", "content": "x"}], "golden_answers": ["a"]},
            r"line 3: key 'prompt'",
        ),
    ],
)
def test_bad_jsonl_row_names_file_line_and_key(tmp_path: Path, bad_row: object, message: str) -> None:
    # Line 2 is blank: the bad row sits on line 3 of the file, and the error must say so.
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"id": "1", "question": "q", "golden_answers": ["a"]})
    path.write_text(f"{good}\n\n{json.dumps(bad_row)}\n", encoding="utf-8")
    with pytest.raises(QADataError, match=message) as info:
        load_qa(path)
    assert str(info.value).startswith(f"{path}: line 3: ")


def test_invalid_json_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text(
        '{"id": "1", "question": "q", "golden_answers": ["a"]}\n{"id": "2", "question": \n', encoding="utf-8"
    )
    with pytest.raises(QADataError, match=r"broken.jsonl: line 2: not valid JSON"):
        load_qa(path)


def test_bad_parquet_row_names_the_row_index(tmp_path: Path) -> None:
    path = tmp_path / "v.parquet"
    pd.DataFrame({"question": ["q0", "q1", None], "golden_answers": [["a"], ["b"], ["c"]]}).to_parquet(path)
    with pytest.raises(QADataError, match=r"v.parquet: row 2: key 'question' is missing"):
        load_qa(path)


@pytest.mark.parametrize("content", ["", "\n\n"])
def test_empty_jsonl_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(QADataError, match=r"empty.jsonl: the file holds no rows"):
        load_qa(path)


def test_empty_parquet_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.parquet"
    pd.DataFrame({"question": pd.Series([], dtype=str)}).to_parquet(path)
    with pytest.raises(QADataError, match=r"empty.parquet: the file holds no rows"):
        load_qa(path)


def test_missing_and_unknown_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing.jsonl: QA file not found"):
        load_qa(tmp_path / "missing.jsonl")
    other = tmp_path / "data.csv"
    other.write_text("question,answer\n", encoding="utf-8")
    with pytest.raises(QADataError, match=r"unknown QA file type '.csv'"):
        load_qa(other)


# --------------------------------------------------------------------------- hub and writer


def test_hub_names_go_to_datasets_with_the_split(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    calls = []

    def fake_load_dataset(name: str, split: str) -> datasets.Dataset:
        calls.append((name, split))
        return datasets.Dataset.from_list([{"id": "0", "question": "q", "golden_answers": ["a"]}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert load_qa("someone/nq_open", split="validation") == [QAExample("0", "q", ["a"], data_source="nq_open")]
    assert calls == [("someone/nq_open", "validation")]
    with pytest.raises(ValueError, match="pass split="):
        load_qa("someone/nq_open")


def test_hub_failure_says_what_was_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    def offline(name: str, split: str) -> None:
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(QADataError, match=r"not a local file or directory.*ConnectionError: no network"):
        load_qa("data/nq", split="test")


def test_write_then_load_round_trips(tmp_path: Path) -> None:
    examples = [
        QAExample("0", "wer schrieb \u201eFaust\u201c?", ["Goethe"], data_source="mkqa"),
        QAExample("1", "q?", ["a", "b"], data_source="nq", prompt="Question: q?\n"),
    ]
    path = tmp_path / "out" / "predictions.jsonl"
    write_qa_jsonl(examples, path)
    assert load_qa(path) == examples
    assert json.loads(path.read_text(encoding="utf-8").splitlines()[0]) == {
        "id": "0",
        "question": "wer schrieb \u201eFaust\u201c?",
        "golden_answers": ["Goethe"],
        "data_source": "mkqa",
    }


def test_local_files_do_not_go_through_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # See the module docstring: datasets alters mixed-type JSON columns and fails on empty Parquet.
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", None)
    jsonl = _write_jsonl(tmp_path / "x.jsonl", [{"id": "0", "question": "q", "golden_answers": ["a"]}])
    parquet = tmp_path / "x.parquet"
    pd.DataFrame([_verl_row(0, "q?", ["a"])]).to_parquet(parquet)
    assert len(qa.load_qa(jsonl)) == 1
    assert len(qa.load_qa(parquet)) == 1


def test_corrupt_parquet_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(QADataError, match=r"corrupt.parquet: cannot read as Parquet"):
        load_qa(path)
