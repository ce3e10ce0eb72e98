"""Per-step metrics of a run: JSONL always, TensorBoard and Weights & Biases on request.

Keys are flat and namespaced (`reward/mean`, `losses/policy`, `curriculum/p_noise`). On resume
the JSONL is cut back to the resumed step, so curves never hold a step twice.

A training run also appends sampled trajectories, one JSON object per line with its `step`, to
`trajectories.jsonl` (`log_trajectories`; `simsearch view` reads them), cut back on resume too.
A run resumed under a changed recipe (`resume: force`) records the change in `recipe_changes.jsonl`.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
TRAJECTORIES_FILE = "trajectories.jsonl"
RECIPE_CHANGES_FILE = "recipe_changes.jsonl"


def log_recipe_change(run_dir: str | os.PathLike, step: int, changes: dict[str, tuple[Any, Any]]) -> Path:
    """Appends one row to `recipe_changes.jsonl`: a run resumed at `step` under a changed recipe.

    Args:
        run_dir: The run directory.
        step: The step the run resumed from (the change applies to the steps after it).
        changes: Dotted key -> (value in the saved recipe, value now).

    Returns:
        The file's path.
    """
    path = Path(run_dir) / RECIPE_CHANGES_FILE
    row = {"step": step, "changes": {key: {"was": old, "now": new} for key, (old, new) in changes.items()}}
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(row, default=str) + "\n")
    return path


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """All logged rows of a run, in order."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class RunLogger:
    """Appends one JSON row per step to `run_dir/metrics.jsonl` (and TensorBoard / wandb)."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        resume_step: int = 0,
        tensorboard: bool = False,
        wandb_project: str = "",
        config: dict[str, Any] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        kept = [row for row in read_metrics(self.run_dir) if row.get("step", 0) <= resume_step]
        self.path.write_text("".join(json.dumps(row) + "\n" for row in kept))
        self.trajectories_path = self.run_dir / TRAJECTORIES_FILE
        if self.trajectories_path.is_file():
            lines = self.trajectories_path.read_text(encoding="utf-8").splitlines()
            kept_lines = [line for line in lines if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            self.trajectories_path.write_text("".join(line + "\n" for line in kept_lines), encoding="utf-8")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=resume_step + 1)
        self._wandb = None
        if wandb_project:
            try:
                import wandb
            except ImportError as err:
                raise ImportError(
                    "wandb_project is set but wandb is not installed: pip install 'simsearch[wandb]'"
                ) from err
            self._wandb = wandb.init(project=wandb_project, dir=str(self.run_dir), config=config, resume="allow")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record `metrics` for `step` (non-finite values are kept in the JSONL as null)."""
        row = {"step": step, **{k: (float(v) if math.isfinite(float(v)) else None) for k, v in metrics.items()}}
        with self.path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for key, value in metrics.items():
                self._tb.add_scalar(key, float(value), step)
        if self._wandb is not None:
            self._wandb.log(dict(metrics), step=step)

    def log_trajectories(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Appends sampled trajectories of `step` (JSON objects) to `trajectories.jsonl`, in one write."""
        if not rows:
            return
        lines = [json.dumps({"step": step, **row}, ensure_ascii=False) + "\n" for row in rows]
        with self.trajectories_path.open("a", encoding="utf-8") as handle:
            handle.write("".join(lines))

    def close(self) -> None:
        """Flush and close the writers."""
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
