"""`simsearch view RUN_DIR`: a run's trajectories as one self-contained HTML page.

An eval run shows every question with its trajectory per engine side by side; a train run
shows the trajectories it sampled (`trajectory_samples` every `trajectory_every` steps). The
page (`simsearch.eval.view`) needs no network and no server: open it in any browser.
"""

from __future__ import annotations

from pathlib import Path

from simsearch.eval.view import write_page

RUN_FILES = ("recipe.yaml", "metrics.jsonl", "examples", "trajectories.jsonl")
"""What an eval or train run directory holds (one is enough): anything else is no run to show."""


def main(run_dir: str, out: str = "") -> Path:
    """Writes the page (default `RUN_DIR/view.html`) and prints where it is."""
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(
            f"run directory {run_dir!r} not found: give the run_dir of a `simsearch eval` or `simsearch train` run"
        )
    if not any((Path(run_dir) / name).exists() for name in RUN_FILES):
        raise FileNotFoundError(
            f"{run_dir!r} is not a run directory (it holds none of {', '.join(RUN_FILES)}): give the run_dir of "
            "a `simsearch eval` or `simsearch train` run, e.g. runs/quickstart/eval/rl_search"
        )
    path = write_page(run_dir, out or None)
    print(f"simsearch view: {path} (open it in a browser)", flush=True)
    return path
