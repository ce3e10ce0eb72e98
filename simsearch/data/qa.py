"""Load question-answer data into `QAExample`s, and write our own.

Files are JSONL, JSON or Parquet (by extension), a directory of `{split}.jsonl|json|parquet`,
or a Hugging Face Hub dataset when online. Rows are FlashRAG's `{"id", "question",
"golden_answers"}` or verl-style (`prompt`, `reward_model.ground_truth`, `extra_info`), whose
question is the `question` column, the text after the prompt's last `Question: `, or a user
message that is the bare question.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from simsearch.errors import DataError
from simsearch.types import QAExample

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
ANSWER_SPLIT = "<|answer_split|>"
"""Joins several gold answers in one `reward_model.ground_truth` string (IGPO's verl files)."""
QUESTION_MARKER = "Question: "
"""Where Search-R1's template (and all of ours) put the question: the prompt ends with it."""
# Instructions name the protocol's tags; a bare question does not.
_TEMPLATE_TAG = re.compile(r"</?(?:answer|search|think|information)>")
# FlashRAG names files by split; the directory above names the dataset (`nq/test.jsonl` -> nq).
SPLIT_NAMES = ("train", "dev", "val", "valid", "validation", "test")


class QADataError(DataError):
    """A QA file or row that cannot be read: names the file, the line or row, and the key."""


def load_qa(
    path_or_name: str | os.PathLike[str],
    *,
    split: str | None = None,
    data_source: str | None = None,
) -> list[QAExample]:
    """Loads a QA dataset as `QAExample`s, in file order.

    Args:
        path_or_name: A `.jsonl`, `.json` or `.parquet` file; a directory holding
            `{split}.jsonl|json|parquet`; or, without a file suffix, a Hub dataset name.
        split: For a directory or hub dataset, which split; None for a file.
        data_source: Label for rows without a `data_source` column. Default: the file's stem, or
            its directory's name when the stem is a split name.

    Returns:
        One example per row; `id` is the row's, else `{data_source}_{index}`.

    Raises:
        FileNotFoundError: A missing file, or a directory without the requested split.
        QADataError: An unreadable file or row, naming the file, the line or row, and the key.
        ValueError: `split` given for a file, or missing for a directory or hub dataset.
    """
    path = Path(path_or_name)
    if path.is_dir():
        path = _split_file(path, split)
    elif path.is_file():
        if split is not None:
            raise ValueError(
                f"{path}: split={split!r} selects a file inside a directory; a file is one split "
                "already, so pass split=None (or pass the directory holding the split files)"
            )
    elif path.suffix in FILE_SUFFIXES or path.is_absolute() or str(path_or_name).startswith("."):
        raise FileNotFoundError(f"{path}: QA file not found")
    else:
        return _load_hub(str(path_or_name), split=split, data_source=data_source)

    if path.suffix not in FILE_SUFFIXES:
        raise QADataError(f"{path}: unknown QA file type {path.suffix!r}; use one of {', '.join(FILE_SUFFIXES)}")
    default_source = data_source or _source_from_path(path)
    examples = [
        _to_example(row, where=f"{path}: {place}", index=index, data_source=default_source)
        for index, (place, row) in enumerate(_read_rows(path))
    ]
    if not examples:
        raise QADataError(f"{path}: the file holds no rows; a QA file needs at least one question")
    return examples


def write_qa_jsonl(examples: Iterable[QAExample], path: str | os.PathLike[str]) -> None:
    """Writes examples as FlashRAG JSONL rows that `load_qa` reads back unchanged."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for ex in examples:
            row: dict[str, Any] = {
                "id": ex.id,
                "question": ex.question,
                "golden_answers": list(ex.golden_answers),
                "data_source": ex.data_source,
            }
            if ex.prompt is not None:
                row["prompt"] = ex.prompt
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def as_answer_list(value: object, *, where: str) -> list[str]:
    """The non-empty answers of a string or a sequence of strings; `QADataError` (at `where`) otherwise."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    answers = [value] if isinstance(value, str) else value
    if not isinstance(answers, (list, tuple)) or not all(isinstance(a, str) for a in answers):
        raise QADataError(f"{where}: golden answers must be a string or a list of strings, got {value!r}")
    # An empty gold answer would match an empty prediction under EM, so it is dropped.
    kept = [a for a in answers if a.strip()]
    if not kept:
        raise QADataError(f"{where}: no golden answers ({value!r}); every question needs at least one")
    return kept


# --------------------------------------------------------------------------- reading files


def _split_file(directory: Path, split: str | None) -> Path:
    if split is None:
        raise ValueError(f"{directory} is a directory: pass split= to choose one of its files (e.g. split='test')")
    candidates = [directory / f"{split}{suffix}" for suffix in FILE_SUFFIXES]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{directory}: no file for split {split!r}; looked for {', '.join(c.name for c in candidates)}"
    )


def _source_from_path(path: Path) -> str:
    if path.stem.lower() in SPLIT_NAMES and path.parent.name:
        return path.parent.resolve().name
    return path.stem


def _read_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(place, row) pairs, place being 'line N' (1-based) or 'row i' (0-based)."""
    if path.suffix == ".parquet":
        yield from _read_parquet(path)
        return
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        bad_line = data.count(b"\n", 0, err.start) + 1
        raise QADataError(f"{path}: line {bad_line}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    if path.suffix == ".json" and text.lstrip().startswith("["):
        rows = _parse_json(text, path, "the file")
        for i, row in enumerate(rows):
            yield f"row {i}", row
        return
    # JSON lines (also accepted in a `.json` file, as `datasets` does); blank lines are skipped.
    # Lines end at "\n" only: str.splitlines would also split at U+2028, U+0085, \x1c, ...,
    # which JSON allows unescaped inside strings (and json.dumps(ensure_ascii=False) writes).
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        yield f"line {lineno}", _parse_json(line, path, f"line {lineno}")


def _parse_json(text: str, path: Path, place: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        where = place if place.startswith("line") else f"line {err.lineno}"
        raise QADataError(f"{path}: {where}: not valid JSON ({err.msg}: column {err.colno})") from None
    except RecursionError:
        raise QADataError(f"{path}: {place}: JSON nested too deeply to be a QA row") from None
    except ValueError as err:  # e.g. an integer of more than 4300 digits
        raise QADataError(f"{path}: {place}: unreadable JSON value ({err})") from None


def _read_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as err:  # pyarrow raises several types (ArrowInvalid, OSError); name the file
        raise QADataError(f"{path}: cannot read as Parquet ({type(err).__name__}: {err})") from err
    for i, row in enumerate(rows):
        yield f"row {i}", row


def _load_hub(name: str, *, split: str | None, data_source: str | None) -> list[QAExample]:
    import datasets

    if split is None:
        raise ValueError(f"{name!r} is not a local file or directory; to load it from the Hugging Face Hub pass split=")
    try:
        table = datasets.load_dataset(name, split=split)
    except Exception as err:  # offline, unknown name, unknown split: all end here with the cause
        raise QADataError(
            f"{name!r} is not a local file or directory, and loading it from the Hugging Face Hub "
            f"(split={split!r}) failed: {type(err).__name__}: {err}. Check the path, or go online."
        ) from err
    source = data_source or name.rstrip("/").split("/")[-1]
    examples = [
        _to_example(row, where=f"{name} [{split}]: row {i}", index=i, data_source=source) for i, row in enumerate(table)
    ]
    if not examples:
        raise QADataError(f"{name!r} split {split!r} holds no rows")
    return examples


# --------------------------------------------------------------------------- rows


def _to_example(row: Any, *, where: str, index: int, data_source: str) -> QAExample:
    if not isinstance(row, dict):
        raise QADataError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
    source = _optional_str(row, "data_source", where) or data_source
    extra = row.get("extra_info")
    if extra is not None and not isinstance(extra, dict):
        raise QADataError(f"{where}: key 'extra_info' must be an object, got {type(extra).__name__}")
    prompt = _prompt_text(row, where)

    question = row.get("question")
    if question is None:
        if prompt is None:
            raise QADataError(
                f"{where}: key 'question' is missing; FlashRAG rows need 'question', verl rows a "
                "'prompt' whose user message ends with 'Question: ...' or is the bare question"
            )
        question = _question_from_prompt(prompt, chat=isinstance(row["prompt"], list), where=where)
    elif not isinstance(question, str):
        raise QADataError(f"{where}: key 'question' must be a string, got {type(question).__name__}")
    if not question.strip():
        raise QADataError(f"{where}: key 'question' is empty")

    if row.get("golden_answers") is not None:
        answers = as_answer_list(row["golden_answers"], where=f"{where}: key 'golden_answers'")
    else:
        answers = _answers_from_reward_model(row, where)

    raw_id = row.get("id")
    if raw_id is None:
        extra_index = extra.get("index") if extra else None
        raw_id = f"{source}_{extra_index if extra_index is not None else index}"
    elif not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool):
        raise QADataError(f"{where}: key 'id' must be a string or an integer, got {raw_id!r}")
    texts = {"id": str(raw_id), "question": question, "data_source": source, "prompt": prompt or ""}
    texts |= {f"golden_answers[{i}]": answer for i, answer in enumerate(answers)}
    for key, value in texts.items():
        _check_unicode(value, key, where)
    return QAExample(id=str(raw_id), question=question, golden_answers=answers, data_source=source, prompt=prompt)


def _check_unicode(value: str, key: str, where: str) -> None:
    # JSON can spell a lone UTF-16 surrogate (`"\ud83d"`, an emoji cut in half); Python reads it
    # into a str that no tokenizer or UTF-8 writer accepts, so it would fail far from this row.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise QADataError(
            f"{where}: key {key!r} holds an unpaired surrogate {value[err.start]!r} at character "
            f"{err.start}, which is not text (half of an emoji?); fix or drop the row"
        ) from None


def _optional_str(row: dict[str, Any], key: str, where: str) -> str | None:
    value = row.get(key)
    if value is not None and not isinstance(value, str):
        raise QADataError(f"{where}: key {key!r} must be a string, got {type(value).__name__}")
    return value


def _prompt_text(row: dict[str, Any], where: str) -> str | None:
    """The templated prompt: a plain string, or the last user message of a chat list."""
    prompt = row.get("prompt")
    if prompt is None or isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        user = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if user and isinstance(user[-1], str):
            return user[-1]
    raise QADataError(
        f"{where}: key 'prompt' must be a string or a chat list with a user message "
        f"([{{'role': 'user', 'content': ...}}]), got {prompt!r:.200}"
    )


def _question_from_prompt(prompt: str, *, chat: bool, where: str) -> str:
    """The text after the last `Question: `, else a chat user message that is a bare question."""
    cut = prompt.rfind(QUESTION_MARKER)
    if cut >= 0:
        return prompt[cut + len(QUESTION_MARKER) :].strip()
    if chat and not _TEMPLATE_TAG.search(prompt):
        return prompt.strip()
    raise QADataError(
        f"{where}: key 'question' is missing and the prompt has no 'Question: ' to recover it "
        "from (and is not a chat user message holding only the question); add a 'question' column"
    )


def _answers_from_reward_model(row: dict[str, Any], where: str) -> list[str]:
    reward_model = row.get("reward_model")
    if reward_model is None:
        raise QADataError(
            f"{where}: no golden answers: key 'golden_answers' is missing (FlashRAG) and so is "
            "'reward_model.ground_truth.target' (verl)"
        )
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        raise QADataError(
            f"{where}: key 'reward_model' must be an object with 'ground_truth', got {reward_model!r:.200}"
        )
    truth = reward_model["ground_truth"]
    # verl datasets store either {"target": [...]} (Search-R1, ZeroSearch, SSRL) or the answers,
    # possibly as one string joined by ANSWER_SPLIT (IGPO).
    if isinstance(truth, dict):
        if truth.get("target") is None:
            raise QADataError(f"{where}: key 'reward_model.ground_truth.target' is missing")
        key, truth = "reward_model.ground_truth.target", truth["target"]
    else:
        key = "reward_model.ground_truth"
    if isinstance(truth, str):
        truth = truth.split(ANSWER_SPLIT)
    return as_answer_list(truth, where=f"{where}: key {key!r}")
