"""Mutation testing: does the suite catch a plausible bug in the curriculum, masks, rewards, losses, resume?

    python -m benchmarks.mutations                        # every mutant of `MUTANTS`
    python -m benchmarks.mutations --only f1_no_factor_2 em_first_gold_only
    python -m benchmarks.mutations --list                 # the table, nothing run

Each mutant is one small, plausible bug: a text of one file of `simsearch/` (found exactly once,
else the table is wrong and the run stops naming the mutant) replaced by another. The runner
copies the repository (`COPIED`) to a temporary directory, checks that Python there imports the
copy's `simsearch` (not an editable install), runs the union of the covering tests once unmutated
(`--no-baseline` skips it: a failing baseline would make every mutant look caught), then applies
one mutant at a time, runs its covering tests with `python -m pytest -q -x -p no:cacheprovider`
in the copy, and puts the file back.

A mutant is `caught` when pytest reports a failure (exit status 1, or 2 for an error while
collecting), `survived` when its tests pass, `timeout` after `--timeout` seconds (not counted as
caught), and `error` when pytest could not run the tests asked for (exit status 3, 4 or 5: a node
id that does not exist, no test collected). The table on stdout; as the last line one JSON object:
`mutants`, `caught`, `survivors` (names), `timeouts`, `errors` (names), `wall_s`, `command`,
`provenance`.

What it measured, with the machine and commit: docs/reliability.md, "Mutation testing".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.benchlib import provenance

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("simsearch", "tests", "benchmarks", "recipes", "docs", ".ci", "pyproject.toml", "README.md")
"""What the temporary copy holds: the package, the suite and every file a test reads."""
PYTEST = ("-m", "pytest", "-q", "-x", "-p", "no:cacheprovider")
DEFAULT_TIMEOUT_S = 1200.0
WIRING = ("tests/commands/test_train_wiring.py",)
SCHEDULES = ("tests/curriculum/test_schedules.py",)
METRICS = ("tests/eval/test_metrics.py", "tests/policy/test_rewards.py")
ADVANTAGES = ("tests/policy/test_advantages.py",)
LOSSES = ("tests/policy/test_losses.py", "tests/policy/test_batch.py")
ROLLOUT = ("tests/policy/test_rollout.py",)
REPORT = ("tests/eval/test_report.py",)
RESUME = ("tests/commands/test_train.py::test_resume_continues_the_run_exactly",)
VALIDATION = ("tests/policy/test_validation.py",)


@dataclass(frozen=True)
class Mutant:
    """One plausible bug: `old` (exactly once in `path`) replaced by `new`; `tests` should catch it."""

    name: str
    path: str  # relative to the repository root
    old: str
    new: str
    tests: tuple[str, ...]  # pytest node ids or files, relative to the repository root
    bug: str  # what a reader of the table needs to know


STEP, TRAIN = "simsearch/policy/step.py", "simsearch/commands/train.py"
CURRICULUM, ROLLOUT_PY = "simsearch/curriculum/schedules.py", "simsearch/policy/rollout.py"
EVAL_METRICS, ADV_PY = "simsearch/eval/metrics.py", "simsearch/policy/advantages.py"
LOSSES_PY, ACTOR_PY = "simsearch/policy/losses.py", "simsearch/policy/actor_loss.py"

MUTANTS: tuple[Mutant, ...] = (
    # -- the curriculum reaches search, and resumes (issue 57's four)
    Mutant("p_noise_zero_in_search", STEP, "num_noisy(p_noise, top_k,", "num_noisy(0.0, top_k,", WIRING,
           "a step's searches get p_noise 0 whatever the schedule says"),
    Mutant("granularity_ignored", STEP, "top_k, r.granularity, noise_rng)", 'top_k, "call", noise_rng)', WIRING,
           "curriculum.granularity ignored: always one flip per call"),
    Mutant("curriculum_not_restored", TRAIN, 'schedule.load_state_dict(run.state["curriculum"])', "pass", WIRING,
           "a resumed run starts the adaptive curriculum afresh"),
    Mutant("rng_not_restored", TRAIN, "    run.restore_rng()\n", "", WIRING,
           "a resumed run does not put back the checkpoint's RNG states"),
    Mutant("schedule_one_step_ahead", TRAIN, "p_noise = t.schedule(step)", "p_noise = t.schedule(step + 1)",
           WIRING, "step i searches with the schedule's p of step i + 1"),
    # -- the schedules
    Mutant("exponential_unnormalized", CURRICULUM, "(base**progress - 1.0) / (base - 1.0)",
           "(base**progress - 1.0) / base", SCHEDULES, "exponential curve divided by b instead of b - 1"),
    Mutant("linear_ignores_p_start", CURRICULUM, "p_start + progress * (p_end - p_start)",
           "p_start + progress * p_end", SCHEDULES, "linear curve moves by p_end instead of p_end - p_start"),
    Mutant("cosine_without_half", CURRICULUM, "(1.0 - math.cos(math.pi * progress)) / 2.0",
           "(1.0 - math.cos(math.pi * progress))", SCHEDULES, "cosine curve overshoots: (1 - cos) not halved"),
    Mutant("step_milestone_late", CURRICULUM, "if step >= milestone:", "if step > milestone:", SCHEDULES,
           "a piecewise value applies one step after its milestone"),
    Mutant("document_flip_inverted", CURRICULUM, "rng.random() < p for _ in range(top_k)",
           "rng.random() > p for _ in range(top_k)", SCHEDULES,
           "per-document granularity flips with probability 1 - p"),
    Mutant("adaptive_target_strict", CURRICULUM, "if mean >= self.target_reward:", "if mean > self.target_reward:",
           SCHEDULES, "the adaptive schedule does not raise p at exactly the target reward"),
    Mutant("adaptive_window_not_saved", CURRICULUM, '"recent": list(self._recent)}', '"recent": []}', SCHEDULES,
           "the adaptive schedule's reward window is not checkpointed"),
    # -- rollout masks and the agent loop
    Mutant("last_result_token_trained", ROLLOUT_PY, "rollout.append(ids, [0] * len(ids), None)",
           "rollout.append(ids, [0] * (len(ids) - 1) + [1], None)", ROLLOUT,
           "the last inserted token (end of </information>) is left in the loss"),
    Mutant("first_result_token_trained", ROLLOUT_PY, "rollout.append(ids, [0] * len(ids), None)",
           "rollout.append(ids, [1] + [0] * (len(ids) - 1), None)", ROLLOUT,
           "the first inserted token (<information>) is left in the loss"),
    Mutant("self_search_close_tag_trained", "simsearch/policy/selfsearch.py",
           "        mask.append(0 if inside else 1)\n        if token == close_id:\n            inside = False\n",
           "        if token == close_id:\n            inside = False\n        mask.append(0 if inside else 1)\n",
           ROLLOUT, "self-search: the policy's own </information> token is trained on"),
    Mutant("max_turns_off_by_one", ROLLOUT_PY, "for turn in range(settings.rollout.max_turns + 1):",
           "for turn in range(settings.rollout.max_turns):", ROLLOUT,
           "no final answer turn after max_turns searches"),
    Mutant("top_k_ignored", ROLLOUT_PY, "top_k=settings.top_k,\n", "top_k=5,\n", ROLLOUT,
           "search requests ask for 5 documents whatever search.top_k says"),
    Mutant("logits_shifted_by_one", "simsearch/policy/collate.py", "return out.logits[:, :-1]",
           "return out.logits[:, 1:]", ("tests/policy/test_batch.py",),
           "each response token scored by the logits one position late"),
    # -- rewards and answer scoring
    Mutant("em_first_gold_only", EVAL_METRICS, "float(any(prediction == gold for gold in normalized_golds))",
           "float(prediction == normalized_golds[0]) if normalized_golds else 0.0", METRICS,
           "EM compares with the first gold answer only"),
    Mutant("f1_no_factor_2", EVAL_METRICS, "return 2 * precision * recall / (precision + recall)",
           "return precision * recall / (precision + recall)", METRICS, "F1 without its factor 2"),
    Mutant("f1_recall_over_prediction", EVAL_METRICS, "recall = overlap / len(gold_tokens)",
           "recall = overlap / len(prediction_tokens)", METRICS, "F1's recall divides by the prediction's length"),
    Mutant("articles_a_kept", EVAL_METRICS, r'_ARTICLES = re.compile(r"\b(a|an|the)\b")',
           r'_ARTICLES = re.compile(r"\b(an|the)\b")', METRICS, "normalization keeps the article 'a'"),
    Mutant("unicode_punctuation_kept", EVAL_METRICS,
           'return char in _ASCII_PUNCTUATION or unicodedata.category(char).startswith("P")',
           "return char in _ASCII_PUNCTUATION", METRICS, "unicode normalization keeps non-ASCII punctuation"),
    Mutant("squad_case_kept", EVAL_METRICS, "    text = text.lower()\n", "", METRICS,
           "squad normalization is case-sensitive"),
    Mutant("first_answer_scored", EVAL_METRICS, "close = text.rfind(ANSWER_CLOSE)",
           "close = text.find(ANSWER_CLOSE)", METRICS, "the first <answer> is scored instead of the last"),
    Mutant("answer_inside_information", EVAL_METRICS, 'text = _INFORMATION_BLOCK.sub(" ", response)',
           "text = response", METRICS, "an <answer> inside inserted documents is scored"),
    # -- advantages
    Mutant("grpo_biased_std", ADV_PY, "torch.sqrt(sq_sum / (self.count - 1))", "torch.sqrt(sq_sum / self.count)",
           ADVANTAGES, "GRPO's group std divides by n instead of n - 1"),
    Mutant("rloo_divides_by_n", ADV_PY, "(group.sum[group.index] - rewards) / (n - 1)",
           "(group.sum[group.index] - rewards) / n", ADVANTAGES, "RLOO's leave-one-out mean divides by n"),
    Mutant("reinforce_pp_not_whitened", ADV_PY, "advantages = masked_whiten(returns, loss_mask)",
           "advantages = returns", ADVANTAGES, "REINFORCE++ returns not whitened over the batch"),
    Mutant("gae_value_undiscounted", ADV_PY, "token_rewards[:, t] + gamma * next_value - values[:, t]",
           "token_rewards[:, t] + next_value - values[:, t]", ADVANTAGES, "GAE's delta does not discount V_next"),
    Mutant("gae_lambda_dropped", ADV_PY, "a = delta + gamma * lam * carry", "a = delta + gamma * carry",
           ADVANTAGES, "GAE ignores lambda"),
    # -- losses
    Mutant("clip_bounds_swapped", ACTOR_PY, "ratio.clamp(1.0 - clip_low, 1.0 + clip_high)",
           "ratio.clamp(1.0 - clip_high, 1.0 + clip_low)", LOSSES, "clip_low and clip_high swapped"),
    Mutant("kl_term_subtracted", ACTOR_PY, "loss = loss + kl_term", "loss = loss - kl_term", LOSSES,
           "the KL penalty rewards moving away from the reference"),
    Mutant("entropy_bonus_sign", ACTOR_PY, "loss = loss - entropy_term", "loss = loss + entropy_term", LOSSES,
           "the entropy bonus penalises entropy"),
    Mutant("k3_reversed", LOSSES_PY, "log_ratio = (ref_logp - logp).clamp(", "log_ratio = (logp - ref_logp).clamp(",
           LOSSES, "k3 estimates KL(ref || policy) instead of KL(policy || ref)"),
    Mutant("seq_mean_sums_tokens", LOSSES_PY,
           "_mean_over_rows(masked_mean(loss_mat, loss_mask, dim=-1), loss_mask, denominator)",
           "_mean_over_rows(masked_sum(loss_mat, loss_mask, dim=-1), loss_mask, denominator)", LOSSES,
           "seq-mean-token-mean sums each row's tokens"),
    # -- resume
    Mutant("data_position_not_restored", TRAIN, 'int(run.state["data_position"]) if run.state else 0', "0", RESUME,
           "a resumed run starts the data stream from the beginning"),
    # -- evaluation
    Mutant("report_not_in_percent", "simsearch/eval/report.py", 'f"{100.0 * value:.2f}"', 'f"{value:.2f}"', REPORT,
           "score tables print fractions where percentages belong"),
    Mutant("average_sums_scores", "simsearch/eval/report.py",
           "float(sum(values)) if metric in SUMMED_METRICS else _mean(values)", "float(sum(values))", REPORT,
           "the average over datasets sums EM instead of averaging it"),
    Mutant("val_em_f1_swapped", "simsearch/policy/validation.py", 'names = ("val/em", "val/f1",',
           'names = ("val/f1", "val/em",', VALIDATION, "validation logs F1 as val/em and EM as val/f1"),
)  # fmt: skip
"""Every mutant the benchmark runs, by area; each name is unique."""


@dataclass(frozen=True)
class Outcome:
    """How one mutant ended: `status` caught, survived, timeout or error; `detail` says why (error, survivor)."""

    mutant: Mutant
    status: str
    seconds: float
    detail: str = ""


def apply(mutant: Mutant, root: Path) -> str:
    """Writes `mutant` into `root`'s copy of its file; returns the original text to put back.

    Raises:
        ValueError: The old text is not found exactly once (the table is out of date).
    """
    path = root / mutant.path
    if not path.is_file():
        raise ValueError(f"mutant {mutant.name}: {mutant.path} does not exist")
    original = path.read_text(encoding="utf-8")
    found = original.count(mutant.old)
    if found != 1:
        raise ValueError(
            f"mutant {mutant.name}: its old text occurs {found} times in {mutant.path} (need exactly 1); "
            f"update the table: {mutant.old!r}"
        )
    path.write_text(original.replace(mutant.old, mutant.new), encoding="utf-8")
    return original


def copy_repository(destination: Path) -> Path:
    """`COPIED` of the repository under `destination` (caches, run directories and virtual environments left out)."""
    ignore = shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.pyc", "runs", ".venv", "*.egg-info")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, destination / name, ignore=ignore)
        elif source.is_file():
            shutil.copy2(source, destination / name)
    return destination


def copy_environment(root: Path) -> dict[str, str]:
    """The environment the covering tests run in: `root` first on the import path (for child processes
    too), and no bytecode written, so a mutant and its restored original are never confused through
    a cached `.pyc` of the same size and second."""
    return {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}


def check_imports_the_copy(root: Path) -> None:
    """Raises RuntimeError unless Python started in `root` with `copy_environment` imports `root`'s simsearch."""
    code = "import simsearch; print(simsearch.__file__)"
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=copy_environment(root), capture_output=True,
                          text=True, check=True)  # fmt: skip
    imported = Path(done.stdout.strip()).resolve()
    if not imported.is_relative_to(root.resolve()):
        raise RuntimeError(f"the copy in {root} imports simsearch from {imported}; the mutants would not be tested")


def run_tests(root: Path, tests: Sequence[str], timeout_s: float) -> tuple[str, str]:
    """(status, the output's last lines) of pytest on `tests` in `root`: see the module docstring."""
    try:
        done = subprocess.run([sys.executable, *PYTEST, *tests], cwd=root, env=copy_environment(root),
                              capture_output=True, text=True, timeout=timeout_s)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "timeout", f"over {timeout_s:.0f} s"
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-3:])
    if done.returncode == 0:
        return "survived", tail
    if done.returncode in (1, 2):
        return "caught", tail
    return "error", f"pytest exit status {done.returncode}: {tail}"


def run_mutant(mutant: Mutant, root: Path, timeout_s: float) -> Outcome:
    """Applies `mutant` in the copy `root`, runs its covering tests, and puts the file back."""
    began = time.perf_counter()
    original = apply(mutant, root)
    try:
        status, detail = run_tests(root, mutant.tests, timeout_s)
    finally:
        (root / mutant.path).write_text(original, encoding="utf-8")
    return Outcome(mutant, status, time.perf_counter() - began, detail)


def check_table(mutants: Sequence[Mutant], root: Path = ROOT) -> None:
    """Raises ValueError, naming the mutant, on a duplicate name or an old text not found exactly once in `root`."""
    names = [m.name for m in mutants]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"mutant names must be unique; repeated: {', '.join(duplicates)}")
    for mutant in mutants:
        text = (root / mutant.path).read_text(encoding="utf-8") if (root / mutant.path).is_file() else ""
        if text.count(mutant.old) != 1:
            raise ValueError(
                f"mutant {mutant.name}: its old text occurs {text.count(mutant.old)} times in {mutant.path} "
                f"(need exactly 1); update the table: {mutant.old!r}"
            )
        if mutant.old == mutant.new:
            raise ValueError(f"mutant {mutant.name}: its new text is its old text")


def run_mutants(mutants: Sequence[Mutant], timeout_s: float, baseline: bool = True) -> list[Outcome]:
    """Each mutant in one temporary copy of the repository, one at a time, printing a line as each ends.

    Raises:
        ValueError: The table is out of date (`check_table`).
        RuntimeError: The copy would import another simsearch, or (with `baseline`) the covering
            tests fail before any mutant is applied.
    """
    check_table(mutants)
    with tempfile.TemporaryDirectory(prefix="simsearch-mutants-") as directory:
        root = copy_repository(Path(directory))
        check_imports_the_copy(root)
        if baseline:
            union = list(dict.fromkeys(test for mutant in mutants for test in mutant.tests))
            status, detail = run_tests(root, union, timeout_s)
            if status != "survived":
                raise RuntimeError(f"the covering tests must pass before any mutant is applied; unmutated: {detail}")
        outcomes = []
        for mutant in mutants:
            outcomes.append(run_mutant(mutant, root, timeout_s))
            print(row(outcomes[-1]), flush=True)
        return outcomes


def row(outcome: Outcome) -> str:
    """One line of the table: mutant, file, status, seconds."""
    m = outcome.mutant
    return f"{m.name:<32} {m.path.removeprefix('simsearch/'):<26} {outcome.status:<9} {outcome.seconds:7.1f}"


def summary(outcomes: Sequence[Outcome], wall_s: float, argv: Sequence[str]) -> dict[str, Any]:
    """The JSON record of a run (module docstring)."""
    named = {status: [o.mutant.name for o in outcomes if o.status == status] for status in ("survived", "timeout")}
    return {
        "mutants": len(outcomes),
        "caught": sum(o.status == "caught" for o in outcomes),
        "survivors": named["survived"],
        "timeouts": named["timeout"],
        "errors": [o.mutant.name for o in outcomes if o.status == "error"],
        "wall_s": round(wall_s, 1),
        "command": " ".join(["python", "-m", "benchmarks.mutations", *argv]),
        "provenance": provenance(),
    }


def selected(only: Sequence[str] | None) -> list[Mutant]:
    """The mutants `--only` names (all without it), in table order; an unknown name is an error."""
    if not only:
        return list(MUTANTS)
    known = {m.name for m in MUTANTS}
    unknown = [name for name in only if name not in known]
    if unknown:
        raise SystemExit(f"mutations.py: unknown mutant(s) {', '.join(unknown)}; see --list")
    return [m for m in MUTANTS if m.name in only]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these mutants only")
    parser.add_argument("--list", action="store_true", help="print the table of mutants and run nothing")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per mutant's tests")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the covering tests")
    args = parser.parse_args(argv)
    mutants = selected(args.only)
    if args.list:
        for m in mutants:
            print(f"{m.name:<32} {m.path:<36} {m.bug}  [{' '.join(m.tests)}]")
        return {"mutants": len(mutants)}
    began = time.perf_counter()
    print(f"{'mutant':<32} {'file':<26} {'status':<9} {'seconds':>7}", flush=True)
    outcomes = run_mutants(mutants, args.timeout, baseline=not args.no_baseline)
    figures = summary(outcomes, time.perf_counter() - began, argv)
    for outcome in outcomes:
        if outcome.status != "caught":
            print(f"{outcome.mutant.name} {outcome.status}: {outcome.mutant.bug}; {outcome.detail}")
    print(f"caught {figures['caught']} / {figures['mutants']}")
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
