"""Atomic checkpoints of a training run: model (HF format), trainer state, RNG.

A checkpoint is written into a temporary directory and renamed when complete, and hidden before
it is deleted, so a killed run never leaves a half checkpoint visible. Trainer state loads with
`weights_only=True`, models with safetensors.
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from simsearch.errors import SimsearchError

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.pt"


class CheckpointError(SimsearchError):
    """A trainer state file that cannot be loaded (corrupt, or holding more than plain data)."""


def checkpoint_dir(run_dir: str | os.PathLike, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step_{step:07d}"


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The finished checkpoint with the highest step, or None."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return None
    done = [p for p in root.glob("step_*") if p.is_dir() and (p / STATE_FILE).is_file()]
    return max(done, key=lambda p: int(p.name.split("_")[1]), default=None)


def rng_state() -> dict[str, Any]:
    """Python and torch RNG states in a form `torch.load(weights_only=True)` accepts."""
    version, internal, gauss = random.getstate()
    return {"python": [version, list(internal), gauss], "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    *,
    model: Any,
    tokenizer: Any,
    state: dict[str, Any],
    keep_last: int = 2,
) -> Path:
    """Writes `model` (`save_pretrained`), `tokenizer` and `state` atomically; returns the directory.

    Args:
        step: The number of finished steps the checkpoint holds.
        state: Trainer state: tensors, numbers, strings, lists and dicts only.
        keep_last: Finished checkpoints to keep (older ones are deleted), 0 = all.
    """
    final = checkpoint_dir(run_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        model.save_pretrained(tmp / "model", safe_serialization=True)
        tokenizer.save_pretrained(tmp / "model")
        torch.save({**state, "step": step}, tmp / STATE_FILE)
        replaced = _hide(final) if final.exists() else None
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    if keep_last:
        finished = sorted(
            (p for p in final.parent.glob("step_*") if (p / STATE_FILE).is_file()),
            key=lambda p: int(p.name.split("_")[1]),
        )
        for old in finished[:-keep_last]:
            shutil.rmtree(_hide(old), ignore_errors=True)
    for stale in final.parent.glob(".step_*"):  # what runs killed mid-write or mid-delete left
        shutil.rmtree(stale, ignore_errors=True)
    return final


def _hide(checkpoint: Path) -> Path:
    """Renames a checkpoint to a hidden name (one atomic step), so deleting it is never seen."""
    # os.urandom, not `random`: the global RNG is part of the trainer state and must not move here.
    hidden = checkpoint.with_name(f".{checkpoint.name}.deleting.{os.urandom(4).hex()}")
    os.replace(checkpoint, hidden)
    return hidden


def load_state(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """The trainer state of a checkpoint, loaded without executing pickled code.

    Raises:
        FileNotFoundError: the checkpoint has no trainer state file.
        CheckpointError: the file is corrupt or needs code-executing unpickling, naming the file.
    """
    path = Path(checkpoint) / STATE_FILE
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        # torch's own message suggests weights_only=False; for a file of unknown origin that
        # runs whatever code it holds, so say what was refused instead.
        raise CheckpointError(
            f"{path}: refused: it holds objects other than tensors, numbers, strings, lists and dicts, "
            f"and loading those would run code stored in the file. simsearch never writes such a "
            f"state; do not load this file unless you trust where it came from ({str(err)[:200]})"
        ) from None
    except (RuntimeError, EOFError) as err:
        raise CheckpointError(
            f"{path}: cannot be read ({type(err).__name__}: {str(err)[:200]}); the file is corrupt: "
            f"delete {Path(checkpoint)} to resume from the checkpoint before it"
        ) from None
