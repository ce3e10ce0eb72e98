"""Stage directories are reused only under the fingerprint they were built from."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from simsearch.fingerprints import building, claim_stage, digest, finish_stage, path_identity, stage_fingerprint


def test_digest_is_stable_and_order_free() -> None:
    assert digest({"a": 1, "b": [2, 3]}) == digest({"b": [2, 3], "a": 1})
    assert digest({"a": 1}) != digest({"a": 2})
    assert len(digest("x")) == 16


def test_a_stage_is_kept_under_its_fingerprint_and_wiped_under_another(tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    assert claim_stage(stage, "one") is False  # new: run it
    (stage / "output.txt").write_text("partial")
    assert claim_stage(stage, "one") is False  # claimed, not finished: run again (resume)
    assert (stage / "output.txt").read_text() == "partial"  # the partial work is kept for the resume
    finish_stage(stage, "one")
    assert claim_stage(stage, "one") is True  # finished under the same inputs: skip
    assert stage_fingerprint(stage) == "one"
    assert claim_stage(stage, "two") is False  # other inputs: nothing of the old stage survives
    assert not (stage / "output.txt").exists()
    assert stage_fingerprint(stage) == "two"


def test_a_directory_of_unknown_origin_is_not_reused(tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "model.bin").write_text("who made me?")
    assert claim_stage(stage, "one") is False
    assert not (stage / "model.bin").exists()


def test_path_identity_changes_when_a_file_is_rewritten(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights").write_bytes(b"12")
    before = path_identity(model)
    assert path_identity(model) == before
    (model / "weights").write_bytes(b"34")
    assert path_identity(model) != before
    assert path_identity(tmp_path / "missing") is None and path_identity("") is None


def test_a_stage_built_with_an_error_is_not_marked_finished(tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    with pytest.raises(RuntimeError), building(stage, "one") as todo:
        assert todo
        raise RuntimeError("the build failed")
    with building(stage, "one") as todo:
        assert todo  # claimed, never finished: built again
    with building(stage, "one") as todo:
        assert not todo  # finished by the block before
    assert stage_fingerprint(stage) == "one"


def test_a_second_process_waits_for_a_stage_in_progress_and_finds_it_done(tmp_path: Path, capfd: Any) -> None:
    stage, started, release = tmp_path / "stage", tmp_path / "started", tmp_path / "release"
    builder = f"""
import time
from pathlib import Path
from simsearch.fingerprints import building
stage = Path({str(stage)!r})
with building(stage, "one") as todo:
    assert todo
    Path({str(started)!r}).write_text("")
    for _ in range(600):  # at most 60 s
        if Path({str(release)!r}).exists():
            break
        time.sleep(0.1)
    (stage / "output.txt").write_text("built")
"""
    other = subprocess.Popen([sys.executable, "-c", builder])
    for _ in range(600):
        if started.exists() or other.poll() is not None:
            break
        time.sleep(0.1)
    assert started.exists(), "the builder never claimed the stage"
    threading.Timer(1.0, release.write_text, args=("",)).start()
    with building(stage, "one") as todo:  # waits for the builder, which is still building
        assert not todo  # finished there: nothing to build
    assert (stage / "output.txt").read_text() == "built"
    assert other.wait(timeout=60) == 0
    assert "another process is building this stage; waiting for it" in capfd.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["release", "stage", "started"]  # no lock file here
