"""Fingerprints: short, stable digests of what a result was built from.

A run directory is reused across invocations (resume), so every piece of stored work carries
the fingerprint of its inputs and is read back only under the same fingerprint: a cache entry,
an evaluation row, a quickstart stage. Local files enter a fingerprint by identity (size and
modification time in nanoseconds of every file, not their bytes: hashing a 14B model's weights
on every start would take minutes), so a model or corpus rewritten in place gets a new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # not POSIX: stages go unlocked
    fcntl = None  # type: ignore[assignment]


def digest(parts: Any) -> str:
    """A 16-hex-digit SHA-256 of `parts` (JSON; dict keys sorted; other objects by `str`)."""
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def path_identity(path: str | os.PathLike[str] | None) -> list[Any] | None:
    """What a local file or directory is now: `[[relative name, size, mtime_ns], ...]`.

    A directory lists every regular file below it (sorted), so a model directory changes
    identity when any of its weights, config or tokenizer files is rewritten. None for a path
    that does not exist locally (a hub name, a URL, an empty setting): its name alone must
    identify it.
    """
    if not path:
        return None
    root = Path(path)
    if root.is_file():
        stat = root.stat()
        return [[root.name, stat.st_size, stat.st_mtime_ns]]
    if not root.is_dir():
        return None
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return [[p.relative_to(root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns] for p in files]


STAGE_FILE = "stage.json"
"""In every stage directory: `{"fingerprint": ..., "done": bool}`, what it was built from."""


def claim_stage(directory: Path, fingerprint: str) -> bool:
    """Makes `directory` the home of the stage built from `fingerprint`; True if it finished there.

    A directory built from other inputs, or of unknown origin, is deleted, so none of its output
    can be resumed or read back as this stage's. The fingerprint is written before the stage
    runs, so an interrupted stage resumes under it; `finish_stage` marks it done.
    """
    mark = directory / STAGE_FILE
    if mark.is_file():
        kept = json.loads(mark.read_text())
        if kept.get("fingerprint") == fingerprint:
            return bool(kept.get("done"))
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    _mark(directory, fingerprint, done=False)
    return False


@contextlib.contextmanager
def stage_lock(directory: Path) -> Iterator[None]:
    """Holds `directory`'s lock, machine-wide, for the block (`building` takes it around a stage's claim and
    finish), so that a second process building the same stage waits (saying so) and then finds it done, rather
    than building it alongside. The lock file lives in the temp directory, never among a run's files."""
    if fcntl is None:
        yield
        return
    locks = Path(tempfile.gettempdir()) / f"simsearch-stage-locks-{os.getuid()}"
    locks.mkdir(mode=0o700, exist_ok=True)
    with (locks / f"{digest(str(Path(directory).resolve()))}.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"{directory}: another process is building this stage; waiting for it", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def building(directory: Path, fingerprint: str) -> Iterator[bool]:
    """A stage built under its lock (`stage_lock`): yields False when `directory` finished under `fingerprint`
    (nothing to build), else claims it (`claim_stage`), yields True and marks it finished when the block ends
    without an error."""
    with stage_lock(directory):
        todo = not claim_stage(directory, fingerprint)
        yield todo
        if todo:
            finish_stage(directory, fingerprint)


def finish_stage(directory: Path, fingerprint: str) -> None:
    """Marks the stage in `directory` (claimed with `claim_stage`) finished."""
    _mark(directory, fingerprint, done=True)


def stage_fingerprint(directory: Path) -> str:
    """The fingerprint a stage directory was claimed under."""
    return str(json.loads((directory / STAGE_FILE).read_text())["fingerprint"])


def _mark(directory: Path, fingerprint: str, *, done: bool) -> None:
    (directory / STAGE_FILE).write_text(json.dumps({"fingerprint": fingerprint, "done": done}) + "\n")
