"""`simsearch view RUN_DIR`: a run's trajectories as one self-contained HTML page.

An eval run shows every question with its trajectory per engine side by side; a train run
shows the trajectories it sampled (`trajectory_samples` every `trajectory_every` steps). The
page (`simsearch.eval.view`) needs no network and no server: open it in any browser.
"""

from __future__ import annotations

from pathlib import Path

from simsearch.eval.view import write_page


def main(run_dir: str, out: str = "") -> Path:
    """Writes the page (default `RUN_DIR/view.html`) and prints where it is."""
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(
            f"run directory {run_dir!r} not found: give the run_dir of a `simsearch eval` or `simsearch train` run"
        )
    path = write_page(run_dir, out or None)
    print(f"simsearch view: {path} (open it in a browser)", flush=True)
    return path
