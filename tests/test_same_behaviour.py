"""What a refactor must keep: the same numbers, trajectories and weights, bit for bit.

Three `simsearch train` steps per estimator family on the toy world of `tests.toy_world`, and the
quickstart's smoke pipeline, must give the metrics, trajectories and weights recorded in
`tests/data/fixtures/same_behaviour.json`. Both run through the CLI, so the test holds across any change of
the modules behind it.

Float results depend on the CPU (its model and vector instructions) and library versions, so each
record holds where it was made (it names the machine); the file keeps one record per machine, and on a
machine it has none for those two tests skip, saying so. The portable record
(`tests/data/fixtures/same_behaviour_portable.json`) holds on every machine and never skips: train
runs whose policy is `tests.scripted.ScriptedAgent` (its turns depend on no float) must ask the
same searches with the same noisy counts, train on the same tokens and masks, and log the same
rewards, curriculum and search counts. After a change meant to alter behaviour, record again on a
checkout of the change, on each machine: `python -m tests.test_same_behaviour --write` (it replaces
this machine's record, or adds one, and the portable record; `--only` drops the other machines'). A
record whose quickstart run a change made stale, on a machine not at hand, keeps its train runs and
loses its quickstart run, whose test then skips there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import tempfile
from pathlib import Path
from typing import Any

import pytest
import tokenizers
import torch
import transformers
from safetensors.torch import load_file

from simsearch.cli import main as cli
from tests import scripted
from tests.toy_world import TRAIN_SETTINGS, build_world

RECORD = Path(__file__).parent / "data" / "fixtures" / "same_behaviour.json"
PORTABLE_RECORD = RECORD.with_name("same_behaviour_portable.json")

COMMON = {**TRAIN_SETTINGS, "steps": 3, "save_every": 3, "threads": 1}
"""The settings every run shares: the toy world's, three steps, a checkpoint at the end, one thread."""

RUNS: dict[str, dict[str, object]] = {
    "grpo": {"algorithm.estimator": "grpo", "eval_every": 1, "algorithm.loss_agg": "seq-mean-token-mean"},
    "dr_grpo": {"algorithm.estimator": "dr_grpo", "algorithm.loss_agg": "seq-mean-token-sum-norm",
                "algorithm.entropy_coef": 0.01},
    "reinforce": {"algorithm.estimator": "reinforce"},
    "reinforce_baseline": {"algorithm.estimator": "reinforce_baseline"},
    "reinforce_pp": {"algorithm.estimator": "reinforce_pp", "algorithm.kl_in_reward": "true",
                     "algorithm.kl_estimator": "k2"},
    "rloo": {"algorithm.estimator": "rloo", "algorithm.ppo_epochs": 2, "algorithm.minibatch_size": 4,
             "gradient_checkpointing": "true", "algorithm.clip_ratio_c": 3.0},
    "ppo": {"algorithm.estimator": "ppo", "algorithm.ppo_epochs": 2, "algorithm.minibatch_size": 4},
    "stratified_grpo": {"algorithm.estimator": "stratified_grpo"},
    "igpo": {"algorithm.estimator": "igpo", "rollout.max_turns": 2},
    "gspo": {"algorithm.estimator": "grpo", "algorithm.ratio_level": "sequence", "algorithm.ppo_epochs": 2,
             "algorithm.minibatch_size": 4},
    "dapo": {"algorithm.estimator": "grpo", "algorithm.dynamic_sampling": "true", "algorithm.clip_high": 0.28,
             "algorithm.kl_coef": 0.0, "reward.overlong_buffer": 8},
}  # fmt: skip
"""One train run per estimator family, each with the options its family is known by."""

PORTABLE_RUNS: dict[str, tuple[int, dict[str, object]]] = {
    "grpo_exponential": (1, {"algorithm.estimator": "grpo", "curriculum.p_end": 1.0, "curriculum.total_steps": 2}),
    "dapo_linear_document": (1, {"algorithm.estimator": "grpo", "algorithm.dynamic_sampling": "true",
                                 "algorithm.kl_coef": 0.0, "curriculum.kind": "linear", "curriculum.p_end": 1.0,
                                 "curriculum.total_steps": 3, "curriculum.granularity": "document"}),
    "igpo_adaptive_two_turns": (1, {"algorithm.estimator": "igpo", "rollout.max_turns": 2,
                                    "curriculum.kind": "adaptive", "curriculum.window": 1,
                                    "curriculum.delta": 0.25, "curriculum.target_reward": 0.0,
                                    "curriculum.collapse_reward": -1.0, "curriculum.p_max": 1.0}),
}  # fmt: skip
"""Runs with the scripted policy: (its searches before answering, overrides); three documents a search."""

PORTABLE_METRICS = ("curriculum/", "search/", "rollout/", "reward/", "sampling/", "data/")
"""The metrics that follow from the rollouts alone: with a scripted policy, the same on every machine."""

QUICKSTART_FILES = ("*.jsonl", "report.json", "summary.json", "model.safetensors")
"""What of the quickstart's smoke run is compared (recipes and stage records hold paths and hashes of code)."""


def machine() -> dict[str, str]:
    """What the float results depend on: the CPU model and the library versions."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if "model name" in line]
        cpu = names[0] if names else cpu
    # tokenizers trains the tiny worlds' BPE tokenizers, so its version is part of what the record holds for.
    # The model name can be as vague as "AMD EPYC"; the vector instructions torch's kernels use tell more.
    return {"cpu": cpu, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}  # fmt: skip


def _varies(key: str) -> bool:
    """A key whose value differs between two runs of the same code: a time, rate, latency or memory
    figure, or a fingerprint (it hashes paths and the recipe's classes)."""
    timing = key.startswith(("time/", "wall")) or key.endswith(("_s", "per_s", "_gb", "_mb")) or "latency" in key
    return timing or "fingerprint" in key


def _scrub(value: Any, roots: list[str]) -> Any:
    """`value` less the entries that vary between runs, with the run's directories written as `<run>`."""
    if isinstance(value, dict):
        return {k: _scrub(v, roots) for k, v in value.items() if not _varies(k)}
    if isinstance(value, list):
        return [_scrub(v, roots) for v in value]
    if isinstance(value, str):
        for root in roots:
            value = value.replace(root, "<run>")
    return value


def _digest(path: Path, roots: list[str]) -> str:
    sha = hashlib.sha256()
    if path.suffix == ".safetensors":
        for name, tensor in sorted(load_file(path).items()):
            sha.update(name.encode())
            sha.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
    elif path.suffix == ".jsonl":
        for line in path.read_text().splitlines():
            sha.update(json.dumps(_scrub(json.loads(line), roots), sort_keys=True).encode())
    else:
        sha.update(json.dumps(_scrub(json.loads(path.read_text()), roots), sort_keys=True).encode())
    return sha.hexdigest()[:16]


def _digests(run: Path, patterns: tuple[str, ...], roots: list[str]) -> dict[str, str]:
    files = sorted({p for pattern in patterns for p in run.rglob(pattern)})
    return {str(p.relative_to(run)): _digest(p, roots) for p in files}


def train_runs(root: Path) -> dict[str, dict[str, Any]]:
    """Each of RUNS trained on a fresh toy world under `root`: its metrics rows and file digests."""
    torch.set_num_threads(1)
    (root / "world").mkdir()
    world = build_world(root / "world")
    (root / "recipe.yaml").write_text("{}\n")  # every setting is an override
    out = {}
    for name, extra in RUNS.items():
        run = root / name
        paths = {"run_dir": run, "policy.model.path": world / "policy", "search.corpus": world / "corpus.jsonl",
                 "data.train": f"[{world / 'train.jsonl'}]", "data.val": f"[{world / 'val.jsonl'}]"}  # fmt: skip
        keys = {**COMMON, **paths, **extra}
        assert cli(["train", str(root / "recipe.yaml"), *(f"{k}={v}" for k, v in keys.items())]) == 0, name
        roots = [str(run), str(world)]
        rows = [_scrub(json.loads(line), roots) for line in (run / "metrics.jsonl").read_text().splitlines()]
        files = _digests(run, ("trajectories.jsonl", "model.safetensors"), roots)
        out[name] = {"metrics": rows, "files": files}
    return out


def quickstart_run(root: Path) -> dict[str, str]:
    """The quickstart's smoke pipeline under `root`: the digests of its records and weights."""
    run = root / "quickstart"
    assert cli(["quickstart", "--smoke", f"run_dir={run}"]) == 0
    return _digests(run, QUICKSTART_FILES, [str(run)])


def portable_runs(root: Path) -> dict[str, list[dict[str, Any]]]:
    """Each of PORTABLE_RUNS on a fresh toy world under `root`: per step, what does not depend on floats."""
    torch.set_num_threads(1)
    (root / "world").mkdir()
    world = build_world(root / "world")
    (root / "recipe.yaml").write_text("{}\n")
    out = {}
    for name, (searches, extra) in PORTABLE_RUNS.items():
        run = root / name
        paths = {"run_dir": run, "policy.model.path": world / "policy", "search.corpus": world / "corpus.jsonl",
                 "data.train": f"[{world / 'train.jsonl'}]"}  # fmt: skip
        keys = {**COMMON, **paths, "search.top_k": 3, "sampling.max_new_tokens": 32, "rollout.max_obs_tokens": 128,
                **extra}  # fmt: skip
        with pytest.MonkeyPatch.context() as monkeypatch:
            log = scripted.install(monkeypatch, searches=searches)
            assert cli(["train", str(root / "recipe.yaml"), *(f"{k}={v}" for k, v in keys.items())]) == 0, name
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        out[name] = [_portable_step(row, log, step) for step, row in enumerate(rows)]
    return out


def _portable_step(row: dict[str, Any], log: scripted.SearchLog, step: int) -> dict[str, Any]:
    """One step's float-free record: its metrics (rounded), its searches, a digest of its trajectories."""
    metrics = {k: round(v, 12) for k, v in row.items() if k.startswith(PORTABLE_METRICS) and not _varies(k)}
    searches = [[r.query, r.top_k, r.num_noisy] for r in log.calls(step)]
    tokens = [[t.prompt_ids, t.response_ids, t.loss_mask, t.answer, t.finish] for t in log.trajectories[step]]
    digest = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]
    return {"metrics": metrics, "searches": searches, "trajectories": digest}


def records() -> list[dict[str, Any]]:
    """The saved records, one per machine."""
    if not RECORD.is_file():
        pytest.fail(f"{RECORD} is missing: record it with `python -m tests.test_same_behaviour --write`")
    return json.loads(RECORD.read_text())["records"]


def record() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        return {"machine": machine(), "train": train_runs(root), "quickstart": quickstart_run(root)}


@pytest.fixture(autouse=True)
def _threads_kept():
    """The runs set torch's thread count to 1; the tests after these get theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    saved = records()
    here = machine()
    for entry in saved:
        if entry["machine"] == here:
            return entry
    made_on = "; ".join(str(entry["machine"]) for entry in saved)
    pytest.skip(f"the records were made on {made_on}, this is {here}: floats differ between machines")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_scripted_runs_give_the_portable_record_on_every_machine(tmp_path: Path) -> None:
    saved = json.loads(PORTABLE_RECORD.read_text())["runs"]
    now = portable_runs(tmp_path)
    assert sorted(now) == sorted(saved)
    for name, steps in saved.items():
        assert len(now[name]) == len(steps), name
        for step, (then, mine) in enumerate(zip(steps, now[name]), 1):
            changed = {k: (then["metrics"].get(k), mine["metrics"].get(k))
                       for k in then["metrics"].keys() | mine["metrics"].keys()
                       if then["metrics"].get(k) != mine["metrics"].get(k)}  # fmt: skip
            assert not changed, f"{name}, step {step}: metrics (recorded, now) {changed}"
            assert mine["searches"] == then["searches"], f"{name}, step {step}: searches (query, top_k, noisy) differ"
            assert mine["trajectories"] == then["trajectories"], f"{name}, step {step}: tokens or masks differ"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_train_runs_give_the_recorded_metrics_trajectories_and_weights(recorded, tmp_path: Path) -> None:
    runs = train_runs(tmp_path)
    assert sorted(runs) == sorted(recorded["train"])
    for name, saved in recorded["train"].items():
        for step, (now, then) in enumerate(zip(runs[name]["metrics"], saved["metrics"], strict=True), 1):
            changed = {k: (then.get(k), now.get(k)) for k in then.keys() | now.keys() if then.get(k) != now.get(k)}
            assert not changed, f"{name}, step {step}: metrics (recorded, now) {changed}"
        assert runs[name]["files"] == saved["files"], f"{name}: trajectories or weights differ"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_quickstart_smoke_pipeline_gives_the_recorded_files(recorded, tmp_path: Path) -> None:
    if "quickstart" not in recorded:
        pytest.skip("this machine's record holds no quickstart run since the quickstart's default changed (the knowing "
                    "simulator): record one on it with `python -m tests.test_same_behaviour --write`")  # fmt: skip
    now = quickstart_run(tmp_path)
    then = recorded["quickstart"]
    differ = sorted(k for k in now.keys() | then.keys() if now.get(k) != then.get(k))
    assert not differ, f"these files differ from the record: {differ}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Record the runs of this test on this machine.")
    parser.add_argument("--write", action="store_true", help=f"write this machine's record into {RECORD}")
    parser.add_argument("--out", type=Path, help="write the records here instead")
    parser.add_argument("--only", action="store_true", help="keep no other machine's record (after a behaviour change)")
    args = parser.parse_args()
    if not (args.write or args.out):
        parser.error("say where: --write or --out PATH")
    out = args.out or RECORD
    new = record()
    kept = [] if args.only or not RECORD.is_file() else [r for r in records() if r["machine"] != new["machine"]]
    out.write_text(json.dumps({"records": [*kept, new]}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}: {len(kept) + 1} record(s), this machine's {new['machine']}")
    portable_out = out.with_name(PORTABLE_RECORD.name)
    with tempfile.TemporaryDirectory() as tmp:
        portable = {"made_on": machine(), "runs": portable_runs(Path(tmp))}
    portable_out.write_text(json.dumps(portable, indent=1, sort_keys=True) + "\n")
    print(f"wrote {portable_out}: the scripted runs' record (every machine)")
