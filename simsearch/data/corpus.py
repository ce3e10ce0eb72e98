"""Read retrieval corpora from JSONL, streaming or by random access.

One JSON object per line, either wiki-18's `{"id", "contents"}` (title: the first line of
`contents`, quotes kept; text: the rest) or `{"id", "title", "text"}`. A row with `contents` is
read as wiki-18; integer ids become strings; blank lines are skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from simsearch.errors import DataError
from simsearch.types import Passage

# How many passages `corpus_fingerprint` hashes; evenly spaced, first and last always included.
FINGERPRINT_SAMPLES = 1024

_FORMATS = 'each line must be a JSON object {"id", "contents"} (wiki-18) or {"id", "title", "text"}'


class CorpusFormatError(DataError):
    """A corpus file that cannot be read: the message names the file, line and key."""


def _check_path(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path} (pass the path of a JSONL corpus; {_FORMATS})")
    if path.suffix == ".gz":
        # Random access needs an uncompressed file, and streaming one is as easy to ask for.
        raise CorpusFormatError(
            f"{path}: compressed corpora are not read directly; run `gzip -dk {path}` and pass the .jsonl"
        )


def parse_passage(line: str | bytes, *, path: str | Path, line_no: int) -> Passage:
    """Parses one JSONL line of a corpus into a `Passage`; `path` and `line_no` (1-based) name it in errors.

    Raises:
        CorpusFormatError: invalid UTF-8 or JSON, not an object, a missing key or a wrong type.
    """
    where = f"{path}:{line_no}"
    try:
        row = json.loads(line)
    except UnicodeDecodeError as e:
        raise CorpusFormatError(f"{where}: not valid UTF-8 ({e.reason} at byte {e.start})") from e
    except json.JSONDecodeError as e:
        raise CorpusFormatError(f"{where}: malformed JSON ({e.msg}: column {e.colno}); {_FORMATS}") from e
    except (RecursionError, ValueError) as e:  # nesting too deep, an integer too long to convert
        raise CorpusFormatError(f"{where}: unreadable JSON ({type(e).__name__}: {str(e)[:100]}); {_FORMATS}") from e
    if not isinstance(row, dict):
        raise CorpusFormatError(f"{where}: expected a JSON object, got {type(row).__name__}; {_FORMATS}")
    if "id" not in row:
        raise CorpusFormatError(f"{where}: missing key 'id'; {_FORMATS}")
    pid = row["id"]
    # bool is an int subclass, but `true` is not a meaningful id.
    if isinstance(pid, bool) or not isinstance(pid, str | int):
        raise CorpusFormatError(f"{where}: key 'id' must be a string or an integer, got {type(pid).__name__}")
    if "contents" in row:
        contents = _string_field(row, "contents", where)
        # partition == Search-R1's split("\n")[0] / "\n".join(split("\n")[1:]).
        title, _, text = contents.partition("\n")
        return Passage(id=str(pid), title=title, text=text)
    pair = {"title": "text", "text": "title"}
    for key in ("title", "text"):
        if key not in row:
            raise CorpusFormatError(f"{where}: missing key 'contents' (or '{key}' beside '{pair[key]}'); {_FORMATS}")
    return Passage(id=str(pid), title=_string_field(row, "title", where), text=_string_field(row, "text", where))


def _string_field(row: dict[str, Any], key: str, where: str) -> str:
    value = row[key]
    if not isinstance(value, str):
        raise CorpusFormatError(f"{where}: key '{key}' must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:  # JSON can spell half an emoji ("\ud83d"); no writer takes it
        raise CorpusFormatError(f"{where}: key '{key}' holds an unpaired surrogate at character {e.start}") from e
    return value


def iter_passages(path: str | Path) -> Iterator[Passage]:
    """Streams the passages of a JSONL corpus in file order, reading lazily.

    Raises:
        FileNotFoundError: the file does not exist.
        CorpusFormatError: a malformed line, or no passage at all (raised when the stream ends).
    """
    path = Path(path)
    # Checked here, not inside the generator, so a wrong path fails at the call.
    _check_path(path)
    return _stream(path)


def _stream(path: Path) -> Iterator[Passage]:
    count = 0
    with path.open("rb") as f:
        for line_no, line in enumerate(f, start=1):
            if line.strip():
                count += 1
                yield parse_passage(line, path=path, line_no=line_no)
    if count == 0:
        raise CorpusFormatError(f"{path}: empty corpus (no passages); {_FORMATS}")


def load_passages(path: str | Path) -> list[Passage]:
    """Reads a whole JSONL corpus into memory; see `iter_passages` for formats and errors."""
    return list(iter_passages(path))


class JsonlCorpus(Sequence[Passage]):
    """A JSONL corpus read by position: `corpus[i]` parses line i from disk on demand; thread-safe.

    A malformed line is reported when it is first read.
    """

    def __init__(self, path: str | Path) -> None:
        """Opens `path` and indexes its non-blank lines.

        Raises:
            FileNotFoundError: the file does not exist.
            CorpusFormatError: the file holds no passage.
        """
        self.path = Path(path)
        _check_path(self.path)
        starts: list[int] = []
        ends: list[int] = []
        offset = 0
        with self.path.open("rb") as f:
            for line in f:
                if line.strip():
                    starts.append(offset)
                    ends.append(offset + len(line))
                offset += len(line)
        if not starts:
            raise CorpusFormatError(f"{self.path}: empty corpus (no passages); {_FORMATS}")
        self._starts = np.asarray(starts, dtype=np.int64)
        self._ends = np.asarray(ends, dtype=np.int64)
        self._file = self.path.open("rb")

    def __len__(self) -> int:
        return len(self._starts)

    @overload
    def __getitem__(self, index: int) -> Passage: ...

    @overload
    def __getitem__(self, index: slice) -> list[Passage]: ...

    def __getitem__(self, index: int | slice) -> Passage | list[Passage]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        start, end = int(self._starts[index]), int(self._ends[index])
        line = os.pread(self._file.fileno(), end - start, start)
        try:
            return parse_passage(line, path=self.path, line_no=-1)
        except CorpusFormatError:
            # Only on the error path: count newlines to name the line the user has to fix.
            with self.path.open("rb") as f:
                line_no = f.read(start).count(b"\n") + 1
            return parse_passage(line, path=self.path, line_no=line_no)

    def __iter__(self) -> Iterator[Passage]:
        # A sequential read is much faster than one pread per passage when indexing everything.
        return iter_passages(self.path)

    def close(self) -> None:
        self._file.close()


def corpus_fingerprint(passages: Sequence[Passage]) -> dict[str, Any]:
    """`{"num_passages": n, "sample_sha256": hex}` from the size and a hash of evenly spaced passages.

    Tells apart different, shuffled or truncated corpora; an edit to an unsampled passage goes unseen.
    """
    n = len(passages)
    positions = np.unique(np.linspace(0, n - 1, num=min(n, FINGERPRINT_SAMPLES)).round().astype(np.int64))
    digest = hashlib.sha256()
    for i in positions.tolist():
        p = passages[i]
        # NUL separators so ("ab", "c") and ("a", "bc") hash differently.
        digest.update(f"{i}\0{p.id}\0{p.title}\0{p.text}\0".encode())
    return {"num_passages": n, "sample_sha256": digest.hexdigest()}


def check_fingerprint(
    expected: dict[str, Any], passages: Sequence[Passage], *, index_dir: str | Path, corpus: str
) -> None:
    """Raises `DataError` (a `ValueError`) saying how and what to do when `passages` is not `expected`'s corpus.

    `index_dir` and `corpus` (a description of the offered corpus) are named in the message.
    """
    actual = corpus_fingerprint(passages)
    if actual == expected:
        return
    if actual["num_passages"] != expected["num_passages"]:
        how = f"it was built for {expected['num_passages']} passages, {corpus} has {actual['num_passages']}"
    else:
        how = f"same size ({actual['num_passages']} passages) but different passages or order"
    raise DataError(
        f"the index in {index_dir} was built for another corpus than {corpus}: {how}. "
        "Pass the corpus the index was built from, or rebuild the index for this corpus."
    )
