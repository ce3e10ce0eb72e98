"""simsearch/experiments/probes.py: each probe on a run directory (or engine) written by hand."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from simsearch.config import TrainRecipe, load_recipe, save_recipe
from simsearch.experiments import probes
from simsearch.tinyworld.world import build_world
from simsearch.training.checkpoint import CHECKPOINTS, STATE_FILE
from simsearch.types import Document, SearchRequest

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "quickstart"
WORLD = build_world(seed=0, n_entities=12, n_train_entities=6)


def test_every_checkpoint_is_kept_though_the_run_prunes_all_but_the_last(tmp_path: Path) -> None:
    run, keep = tmp_path / "train", tmp_path / "kept"

    def save(step: int, weights: str) -> None:
        checkpoint = run / CHECKPOINTS / f"step_{step:07d}"
        (checkpoint / "model").mkdir(parents=True)
        (checkpoint / "model" / "weights").write_text(weights)
        (checkpoint / STATE_FILE).write_text("done")  # written last: a checkpoint without it is unfinished

    with probes.keeping_checkpoints(run, keep, every_s=0.01):
        for step in (1, 2, 3):
            save(step, f"w{step}")
            time.sleep(0.3)
            if step > 1:  # the run keeps only its last checkpoint
                shutil.rmtree(run / CHECKPOINTS / f"step_{step - 1:07d}")
        (run / CHECKPOINTS / "step_0000004" / "model").mkdir(parents=True)  # unfinished: not kept
    assert sorted(p.name for p in keep.iterdir()) == [f"step_{s:07d}" for s in (1, 2, 3)]
    assert (keep / "step_0000002" / "weights").read_text() == "w2"
    # The run rebuilt: its step 3 is another checkpoint, and replaces the copy.
    shutil.rmtree(run / CHECKPOINTS / "step_0000003")
    time.sleep(0.01)
    save(3, "rebuilt")
    with probes.keeping_checkpoints(run, keep, every_s=0.01):
        pass
    assert (keep / "step_0000003" / "weights").read_text() == "rebuilt"


def _sample(query: str) -> dict:
    return {"turns": [], "response": f"<search> {query} </search>\n\n<answer> x </answer>"}


def test_probe_cells_split_the_em_by_whether_the_first_query_names_the_person(tmp_path: Path) -> None:
    ids = list(WORLD.facts)[:4]
    name = [WORLD.facts[i].entity for i in ids]
    rows = [  # two named (one right), one miscopied (right), one unnamed (wrong)
        {"id": ids[0], "samples": [_sample(f"{name[0]} born")], "scores": {"em": 1.0}},
        {"id": ids[1], "samples": [_sample(name[1])], "scores": {"em": 0.0}},
        {"id": ids[2], "samples": [_sample(name[2][:3] + "zz")], "scores": {"em": 1.0}},
        {"id": ids[3], "samples": [_sample("where born")], "scores": {"em": 0.0}},
    ]
    examples = tmp_path / "examples" / "none" / "train.jsonl"
    examples.parent.mkdir(parents=True)
    examples.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cells = probes.naming_cells(tmp_path, WORLD, "none", "train")
    assert cells["em"] == pytest.approx(50.0)
    assert cells["named_share"] == pytest.approx(0.5)
    assert cells["em_named"] == pytest.approx(0.5)
    assert cells["em_unnamed"] == pytest.approx(0.5)  # the miscopied one counts as not named


def test_training_naming_tallies_reward_by_naming_in_each_half(tmp_path: Path) -> None:
    ids = list(WORLD.facts)[:2]
    person = WORLD.facts[ids[0]].entity

    def row(step: int, query: str, reward: float) -> dict:
        return {"step": step, "id": ids[0], "reward": reward, "turns": [], "response": f"<search> {query} </search>"}

    rows = [row(1, "when", 0.0), row(2, person, 0.0), row(3, person, 1.0), row(4, person, 1.0), row(4, "x", 0.0)]
    (tmp_path / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    halves = probes.training_naming(tmp_path, WORLD)
    assert halves["first_half"] == {"samples": 2, "named_share": 0.5, "reward_named": 0.0, "reward_unnamed": 0.0}
    second = halves["second_half"]
    assert second["samples"] == 3 and second["named_share"] == pytest.approx(2 / 3)
    assert second["reward_named"] == 1.0 and second["reward_unnamed"] == 0.0


def test_unreadable_calls_are_counted_from_the_turn_records(tmp_path: Path) -> None:
    rows = [
        {"samples": [{"turns": [{"action": "search", "call_queries": ["a", "b"]},
                                {"action": "invalid", "call_reasons": ["not valid JSON"]},
                                {"action": "answer"}]}]},
        {"samples": [{"turns": [{"action": "invalid"}, {"action": "answer"}]}]},
    ]  # fmt: skip
    path = tmp_path / "examples.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert probes.tool_call_counts(path) == {"calls": 2, "unreadable_calls": 1, "turns": 5, "invalid_turns": 2}


def test_question_without_name_keeps_every_other_word() -> None:
    assert probes.question_without_name("In which year was the bakery of Ganlo founded?", "Ganlo") == (
        "In which year was the bakery of founded"
    )


class _Echo:
    """Writes the request's first gold answer when it is told it and the query is long, else nothing useful."""

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        return [
            [Document("t", r.golden_answers[0] if r.num_noisy == 0 and len(r.query.split()) > 1 else "nothing")]
            for r in requests
        ]


def test_answer_leakage_counts_sets_holding_the_answer() -> None:
    world = build_world(seed=0, n_entities=6, n_train_entities=4)
    leak = probes.answer_leakage(_Echo(), world, n=4, top_k=3)
    # Every no-name query still has several words, so each set holds the answer; noisy sets never do.
    assert leak == {"no_name": 1.0, "noisy": 0.0}


def test_answer_in_results_counts_executed_searches_whose_results_hold_a_gold_answer(tmp_path: Path) -> None:
    def turn(action: str, texts: list[str], executed: bool = True) -> dict:
        return {"action": action, "executed": executed, "documents": [{"text": t} for t in texts]}

    rows = [
        {"golden_answers": ["Glass-blower"], "turns": [turn("search", ["Roru is a glassblower."]),
                                                      turn("search", ["Roru was born in Ulm."]),
                                                      turn("answer", ["glassblower"])]},
        {"golden_answers": ["1859"], "turns": [turn("search", ["In 1859 Kesh founded a bank."], executed=False),
                                               turn("search", [])]},
    ]  # fmt: skip
    noisy = [{"text": "Kesh founded a bank in ___.", "noisy": True}, {"text": "Kesh was a baker.", "noisy": True}]
    rows[1]["turns"][1]["documents"] = [*noisy, {"text": "Kesh founded a bank in 1860.", "noisy": False}]
    (tmp_path / "trajectories.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    # Three executed searches; one showed the answer (normalized: the hyphen does not hide it); of the
    # two noisy documents, one had an answer taken out.
    shown = {"share": 0.333, "searches": 3, "noisy_docs": 2, "noisy_redacted": 0.5}
    assert probes.answer_in_results(tmp_path) == shown


def test_rl_metrics_average_the_logged_steps_and_fall_back_to_the_recipes_prompts(tmp_path: Path) -> None:
    rows = [{"step": 1, "sampling/flat_share": 0.5, "time/step_s": 2.0, "search/calls_per_traj": 1.0},
            {"step": 2, "sampling/flat_share": 0.25, "time/step_s": 4.0, "search/calls_per_traj": 2.0}]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    recipe = load_recipe(TrainRecipe, RECIPES / "train.yaml", [f"run_dir={tmp_path}", "prompts_per_step=7"])
    save_recipe(recipe, tmp_path)
    metrics = probes.rl_metrics(tmp_path)
    assert metrics == {"flat_share": 0.375, "step_s": 3.0, "searches": 1.5, "prompts_per_step": 7.0, "steps": 2.0}


def test_searches_by_kind_reads_the_runs_cost_record(tmp_path: Path) -> None:
    engines = {"a": {"kind": "simulator", "searches": 12}, "b": {"kind": "bm25", "searches": 3}}
    (tmp_path / "cost.json").write_text(json.dumps({"engines": engines}))
    assert probes.searches_by_kind(tmp_path) == {"simulator": 12, "bm25": 3}
