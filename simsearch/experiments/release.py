"""The default world's released models: built here once, shipped with the package, installed by the quickstart.

    python -m simsearch.experiments.release runs/release   # build stages 1-4 of the default quickstart, then ship them

The quickstart's base pretraining and simulator SFT depend only on the world and the recipe, and take
most of its time on a CPU. So the default recipe's base and simulator ship in
`simsearch/tinyworld/release/`, each under the fingerprint of the stage that built it; the quickstart
installs one where its own stage has that very fingerprint (`pipeline.install_released`), as a user
loads a hub model, and builds every other world or setting itself (`released=false`: every stage).
`release.json` names, for each, the commit, CPU and library versions that built it. The simulator's
checkpoint ships without its optimizer state: it is a finished stage, never resumed.

    python -m simsearch.experiments.release runs/release --keep-released   # the released stages kept, the rest built

`--keep-released` installs each stage the release holds under the very fingerprint the recipe gives it and
builds the others (a new simulator ships on the same base bytes, which a base built on another CPU would
not have); each stage keeps the provenance of the machine that built it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

import torch

from simsearch.config import QuickstartRecipe, load_recipe
from simsearch.experiments import pipeline, quickstart
from simsearch.fingerprints import stage_fingerprint
from simsearch.training.checkpoint import STATE_FILE, latest_checkpoint

BASE_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
              "tokenizer_config.json", "chat_template.jinja")  # fmt: skip
"""What a tiny model folder holds (`models.save_tiny`): the files shipped of each model."""


def build(run_dir: Path, release: Path = pipeline.RELEASE, *, keep_released: bool = False) -> dict:
    """Stages 1-4 of the default quickstart in `run_dir` (every stage built, or with `keep_released` those the
    release holds installed), then their base and simulator copied into `release` with `release.json`; returns
    what it holds."""
    commit = _commit()  # the code that builds them, before anything can change it
    released = "true" if keep_released else "false"
    recipe = load_recipe(QuickstartRecipe, None, [f"run_dir={run_dir}", f"released={released}"])
    pipeline.through_simulator(recipe)
    return ship(Path(recipe.run_dir), release, commit=commit)


def ship(run: Path, release: Path, *, commit: str) -> dict:
    """The finished base and simulator of the quickstart run `run` (built by the code of `commit`) copied into
    `release`, with `release.json`."""
    shutil.rmtree(release, ignore_errors=True)
    (release / "base").mkdir(parents=True)
    for name in BASE_FILES:
        shutil.copy2(run / "base" / name, release / "base" / name)
    checkpoint = latest_checkpoint(run / "simulator")
    if checkpoint is None:
        raise FileNotFoundError(f"{run / 'simulator'}: no finished checkpoint to ship")
    shipped = release / "simulator" / "checkpoints" / checkpoint.name
    (shipped / "model").mkdir(parents=True)
    for name in BASE_FILES:
        shutil.copy2(checkpoint / "model" / name, shipped / "model" / name)
    state = torch.load(checkpoint / STATE_FILE, weights_only=True)
    torch.save({key: value for key, value in state.items() if key != "optimizer"}, shipped / STATE_FILE)
    shutil.copy2(run / "simulator" / "metrics.jsonl", release / "simulator" / "metrics.jsonl")
    here = {**quickstart.machine(), "cpu_capability": torch.backends.cpu.get_cpu_capability(), "commit": commit}
    index = {
        "stages": {
            stage: {"fingerprint": stage_fingerprint(run / stage), "folder": stage, "built": _built(run / stage, here)}
            for stage in ("base", "simulator")
        }
    }
    (release / "release.json").write_text(json.dumps(index, indent=2) + "\n")
    return index


def _built(stage: Path, here: dict) -> dict:
    """Where the model of the finished `stage` was built: where the release that installed it says, else `here`."""
    marker = stage / pipeline.RELEASED
    if not marker.is_file():
        return here
    return {key: value for key, value in json.loads(marker.read_text()).items() if key != "stage"}


def _commit() -> str:
    """The source checkout's commit ("unknown" outside git; "+ uncommitted changes" when tracked files differ)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip

    try:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "--short", "HEAD") + (" + uncommitted changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="where the stages are built (kept: a rerun reuses them)")
    parser.add_argument("--keep-released", action="store_true", help="install the stages the release holds")
    args = parser.parse_args(argv)
    index = build(args.run_dir, keep_released=args.keep_released)
    print(json.dumps(index, indent=2))


if __name__ == "__main__":
    main()
