"""Simulator SFT data: judges, balancing, the split, and the three targets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simsearch.simulator.engine import parse_documents
from simsearch.simulator.sft_data import (
    LLMJudge,
    SearchRecord,
    balance_indices,
    build_sft_pairs,
    contains_answer,
    contrast_records,
    judge_prompt,
    noisy_documents,
    outcome_judge,
    parse_verdict,
    query_variants,
    records_from_trajectories,
    rule_judge,
    split_by_question,
    write_pairs,
)
from simsearch.types import Completion, Document, QAExample, SamplingParams, Trajectory, Turn

PARIS = Document("France", "The capital of France is Paris.")
LYON = Document("Lyon", "Lyon is a city on the Rhone.")
NICE = Document("Nice", "Nice lies on the Riviera.")
BERLIN = Document("Germany", "Berlin is the German capital.")


def _record(question: str, answer: str, query: str, docs: list[Document]) -> SearchRecord:
    return SearchRecord(question=question, golden_answers=[answer], query=query, documents=docs)


def test_contains_answer_is_normalized_and_whole_word() -> None:
    assert contains_answer([Document("t", "In 1995, THE Beatles...")], ["the beatles"])
    assert not contains_answer([Document("t", "In 1995")], ["5"])  # substring match would say yes
    assert contains_answer([Document("Paris", "x")], ["paris"])  # the title counts
    assert not contains_answer([PARIS], ["", "The"])  # golds that normalize to "" never match


def test_rule_judge() -> None:
    records = [_record("q", "Paris", "a", [PARIS, LYON]), _record("q", "Paris", "b", [LYON])]
    assert rule_judge(records) == [True, False]


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ("Yes", True),
        (" no.", False),
        ("**YES**", True),
        ("Answer: yes, they do", True),
        ("I don't know, no", False),
        ("maybe", None),
        ("", None),
        ("Not enough", False),
    ],
)
def test_parse_verdict(reply: str, verdict: bool | None) -> None:
    assert parse_verdict(reply) is verdict


class _ScriptedJudge:
    def __init__(self, replies: list[str]) -> None:
        self.replies = replies
        self.calls: list[tuple[list, SamplingParams]] = []

    def generate(self, prompts: list, params: SamplingParams) -> list[Completion]:
        self.calls.append((prompts, params))
        return [Completion([], r, "stop") for r in self.replies[: len(prompts)]]


def test_llm_judge_is_one_greedy_call() -> None:
    gen = _ScriptedJudge(["yes", "No", "hmm"])
    records = [_record("Capital of France?", "Paris", f"q{i}", [PARIS]) for i in range(3)]
    assert LLMJudge(gen)(records) == [True, False, None]
    assert len(gen.calls) == 1 and gen.calls[0][1].temperature == 0.0
    prompt = gen.calls[0][0][0]
    assert prompt == judge_prompt(records[0])
    assert "Question: Capital of France?\nSearch query: q0\n" in prompt
    assert "Doc 1(Title: France) The capital of France is Paris." in prompt


def test_balance_downsamples_the_majority() -> None:
    labels = [True, True, True, True, False, True, False]
    kept = balance_indices(labels, seed=0)
    assert sorted(i for i in kept if not labels[i]) == [4, 6]
    assert sum(labels[i] for i in kept) == 2 and len(kept) == 4
    assert kept == balance_indices(labels, seed=0)


def test_split_by_question_keeps_questions_on_one_side() -> None:
    pairs = [{"question": f"q{i // 2}", "n": i} for i in range(20)]  # 10 questions x 2 pairs
    train, val = split_by_question(pairs, 0.2, seed=1)
    assert len(val) == 4 and len(train) == 16  # round(0.2 x 10) = 2 questions
    assert not {p["question"] for p in train} & {p["question"] for p in val}
    assert split_by_question(pairs, 0.2, seed=1) == (train, val)
    # A tiny set still gets one validation question when asked for any.
    assert len(split_by_question(pairs[:4], 0.1, seed=0)[1]) == 2


def _records() -> list[SearchRecord]:
    # 4 useful sets (Paris found) and 2 noisy ones, over 6 questions; one exact duplicate, one empty.
    useful = [_record(f"capital {i}?", "Paris", f"capital france {i}", [PARIS, LYON]) for i in range(4)]
    noisy = [_record(f"river {i}?", "Rhone", f"river {i}", [NICE, BERLIN]) for i in range(2)]
    return useful + noisy + [useful[0], _record("x?", "y", "z", [])]


def test_judged_target_counts() -> None:
    data = build_sft_pairs(_records(), preset="simsearch", target="judged", val_fraction=0.0, seed=0)
    s = data.stats
    assert (s["collect/records"], s["collect/duplicates"], s["collect/empty"]) == (8, 1, 1)
    assert (s["collect/judged_useful"], s["collect/judged_noisy"], s["collect/unjudged"]) == (4, 2, 0)
    assert s["collect/dropped_for_balance"] == 2  # 4 useful -> 2
    assert (s["collect/train"], s["collect/val"], s["collect/train_useful_share"]) == (4, 0, 0.5)
    for pair in data.train:
        noisy = pair["label"] == "noisy"
        assert ("do not contain or imply" in pair["prompt"]) == noisy
        assert pair["contains_answer"] == (not noisy)
        assert set(pair) == {"prompt", "response", "label", "query", "question", "golden_answers", "contains_answer"}


def test_judged_target_without_balance_and_with_unsure_judge() -> None:
    verdicts = iter([True, None, False, True, True, None])
    data = build_sft_pairs(
        _records(),
        preset="simsearch",
        judge=lambda rs: [next(verdicts) for _ in rs],
        balance=False,
        val_fraction=0.0,
    )
    assert data.stats["collect/unjudged"] == 2 and data.stats["collect/train"] == 4


def test_response_is_parsed_back_to_the_retrieved_documents() -> None:
    data = build_sft_pairs(_records()[:1], preset="zerosearch", balance=False, val_fraction=0.0)
    pair = data.train[0]
    docs = parse_documents(pair["response"], 2).documents
    assert [(d.title, d.text) for d in docs] == [(PARIS.title, PARIS.text), (LYON.title, LYON.text)]
    assert pair["prompt"].endswith("Query: capital france 0\nUseful Output:\n")


def test_brief_pairs_write_responses_in_the_policy_s_rendering() -> None:
    data = build_sft_pairs(
        _records()[:1], preset="simsearch-brief", target="retrieved", val_fraction=0.0, style="brief"
    )
    useful = next(p for p in data.train if p["label"] == "useful")
    assert useful["response"] == f"Doc 1: {PARIS.text}\nDoc 2: {LYON.text}"
    with pytest.raises(ValueError, match="simsearch-brief"):
        build_sft_pairs(_records()[:1], preset="simsearch", target="retrieved", style="brief")


def test_retrieved_target_keeps_bad_queries_and_strips_answers_from_noisy() -> None:
    good = _record("Capital of France?", "Paris", "capital france", [PARIS, LYON])
    bad = _record("Capital of France?", "Paris", "city river", [LYON, NICE])
    other = _record("German capital?", "Berlin", "germany", [BERLIN])
    data = build_sft_pairs([good, bad, other], preset="simsearch", target="retrieved", val_fraction=0.0)
    pairs = {(p["query"], p["label"]): p for p in data.train}
    assert len(data.train) == 6 and data.stats["collect/train_useful_share"] == 0.5
    # Useful prompt + bad query: the response is what the bad query retrieved, no answer in it.
    assert not pairs[("city river", "useful")]["contains_answer"]
    assert pairs[("capital france", "useful")]["contains_answer"]
    # Noisy: Paris replaced; the only unused on-topic non-answer doc is NICE.
    noisy = parse_documents(pairs[("capital france", "noisy")]["response"], 2).documents
    assert [d.title for d in noisy] == ["Nice", "Lyon"]
    assert not any(p["contains_answer"] for p in data.train if p["label"] == "noisy")
    # 1 useful pair of 3 contains the answer; documents replaced: Paris once, Berlin once.
    assert data.stats["collect/useful_contains_answer"] == pytest.approx(2 / 3)
    assert data.stats["collect/noisy_replaced_docs"] == 2


def test_pairs_can_hide_the_question_from_the_prompt_but_keep_it_for_the_split() -> None:
    good = _record("Capital of France?", "Paris", "capital france", [PARIS, LYON])
    data = build_sft_pairs([good], preset="simsearch", target="retrieved", val_fraction=0.0, show_question=False)
    assert {p["label"] for p in data.train} == {"useful", "noisy"}
    for pair in data.train:
        assert "Capital of France?" not in pair["prompt"] and "Answer: Paris\n" in pair["prompt"]
        assert pair["question"] == "Capital of France?"


def test_pairs_can_hide_the_answer_from_the_prompt_but_keep_it_for_the_labels() -> None:
    good = _record("Capital of France?", "Paris", "capital france", [PARIS, LYON])
    data = build_sft_pairs(
        [good], preset="simsearch", target="retrieved", val_fraction=0.0, show_question=False, show_answer=False
    )
    for pair in data.train:
        assert "Paris" not in pair["prompt"] and "Capital of France?" not in pair["prompt"]
        assert pair["golden_answers"] == ["Paris"]
    assert {p["label"]: p["contains_answer"] for p in data.train} == {"useful": True, "noisy": False}


def test_retrieved_target_with_top_k_keeps_empty_results_as_empty_responses() -> None:
    empty = _record("Capital of France?", "Paris", "fra", [])
    short = _record("Capital of France?", "Paris", "capital france", [PARIS])
    data = build_sft_pairs([empty, short], preset="simsearch", target="retrieved", val_fraction=0.0, top_k=3)
    assert data.stats["collect/empty"] == 1 and len(data.train) == 4
    for pair in data.train:  # every prompt asks for 3 results, as the simulator will be asked
        assert "Write 3 search results" in pair["prompt"]
    assert {p["response"] for p in data.train if p["query"] == "fra"} == {""}
    # Without top_k a record's own count would have to set the prompt: empty ones are dropped.
    assert {
        p["query"]
        for p in build_sft_pairs([empty, short], preset="simsearch", target="retrieved", val_fraction=0.0).train
    } == {"capital france"}


def _edit_kind(query: str, variant: str, donors: set[str]) -> str:
    words, edited = query.split(), variant.split()
    if len(edited) == len(words) - 1 and any(words[:i] + words[i + 1 :] == edited for i in range(len(words))):
        return "drop"
    changed = [(a, b) for a, b in zip(words, edited) if a != b]
    if len(edited) != len(words) or len(changed) != 1:
        return "other"
    old, new = changed[0]
    if new in donors:
        return "swap"
    return "cut" if old.startswith(new) and 2 <= len(new) < len(old) else "other"


def test_query_variants_make_one_edit_each() -> None:
    import random

    query = "Fisza birth city"
    variants = query_variants(query, 12, random.Random(0), donors=["Gosgos occupation"])
    assert len(set(variants)) == len(variants) and query not in variants
    kinds = {_edit_kind(query, v, {"Gosgos", "occupation"}) for v in variants}
    assert kinds == {"drop", "cut", "swap"}
    assert query_variants("a", 3, random.Random(0), donors=[]) == []  # nothing to edit


def test_contrast_records_search_each_variant_for_the_same_question() -> None:
    seen: list[str] = []

    class Engine:
        def search(self, requests):
            seen.extend(r.query for r in requests)
            return [[PARIS] if "france" in r.query.split() else [] for r in requests]

    record = _record("Capital of France?", "Paris", "capital france", [PARIS])
    out = contrast_records([record], Engine(), n=2, top_k=3, seed=0, chunk_size=1)
    assert [r.query for r in out] == seen and len(out) == 2
    for r in out:
        assert r.query != "capital france" and r.question == "Capital of France?" and r.golden_answers == ["Paris"]
        assert r.documents == ([PARIS] if "france" in r.query.split() else [])


def test_noisy_documents_falls_back_to_the_pool_then_padding() -> None:
    import random

    record = _record("q", "Paris", "p", [PARIS, Document("Paris 2", "Paris again")])
    docs, replaced = noisy_documents(record, [], [LYON], random.Random(0))
    assert replaced == 2 and [d.title for d in docs] == ["Lyon", ""]
    assert docs[1].text == "(no result)"


def test_write_pairs(tmp_path: Path) -> None:
    out = write_pairs([{"prompt": "é", "response": "r"}], tmp_path / "a" / "train.jsonl")
    assert [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] == [
        {"prompt": "é", "response": "r"}
    ]


def test_unknown_target() -> None:
    with pytest.raises(ValueError, match="target"):
        build_sft_pairs([], preset="simsearch", target="both")  # type: ignore[arg-type]


def test_records_from_trajectories_keep_executed_searches_only() -> None:
    example = QAExample(id="1", question="Capital of France?", golden_answers=["Paris"])
    turns = [
        Turn(text="..", action="search", query="capital france", documents=[PARIS], executed=True),
        Turn(text="..", action="invalid"),
        Turn(text="..", action="search", query="late search", executed=False),
        Turn(text="..", action="answer"),
    ]
    trajectory = Trajectory(
        prompt_id=0,
        example=example,
        prompt_ids=[],
        response_ids=[],
        loss_mask=[],
        turns=turns,
        response_text="",
        answer=None,
        num_searches=1,
        num_invalid=1,
        finish="answer",
    )
    assert records_from_trajectories([trajectory]) == [
        SearchRecord("Capital of France?", ["Paris"], "capital france", [PARIS], answered_correctly=False)
    ]


def test_records_from_tool_call_trajectories_keep_each_executed_call() -> None:
    # A tool-call turn may hold several calls: each executed call is one record, in order.
    trajectory = _trajectory("Capital of France?", "Paris", "Paris", [])
    trajectory.turns = [
        Turn(text="..", action="search", executed=True, call_queries=["capital france", "lyon"],
             call_documents=[[PARIS], [LYON]]),
        Turn(text="..", action="search", executed=False, call_queries=["never run"], call_documents=[]),
    ]  # fmt: skip
    assert records_from_trajectories([trajectory]) == [
        SearchRecord("Capital of France?", ["Paris"], "capital france", [PARIS], answered_correctly=True),
        SearchRecord("Capital of France?", ["Paris"], "lyon", [LYON], answered_correctly=True),
    ]


def _trajectory(question: str, gold: str, answer: str | None, searches: list[tuple[str, list[Document]]]) -> Trajectory:
    turns = [Turn(text="..", action="search", query=q, documents=docs, executed=True) for q, docs in searches]
    return Trajectory(
        prompt_id=0,
        example=QAExample(id=question, question=question, golden_answers=[gold]),
        prompt_ids=[],
        response_ids=[],
        loss_mask=[],
        turns=turns,
        response_text="",
        answer=answer,
        num_searches=len(turns),
        num_invalid=0,
        finish="answer",
    )


@pytest.mark.parametrize(
    ("answer", "metric", "correct"),
    [
        ("Paris", "substring_em", True),
        ("the city of Paris", "substring_em", True),  # ZeroSearch's "EM": the gold is contained
        ("the city of Paris", "em", False),  # equality after normalization
        ("The Paris", "em", True),  # articles are dropped
        ("Lyon", "substring_em", False),
        (None, "substring_em", False),  # no answer is a wrong answer
    ],
)
def test_records_carry_their_trajectory_s_outcome(answer: str | None, metric: str, correct: bool) -> None:
    trajectory = _trajectory("Capital of France?", "Paris", answer, [("france", [LYON]), ("capital", [PARIS])])
    records = records_from_trajectories([trajectory], outcome_metric=metric)
    assert [r.answered_correctly for r in records] == [correct, correct]  # every search of the trajectory


def test_trajectory_target_labels_by_outcome_not_by_content() -> None:
    # A correct trajectory whose first search found nothing useful, and a wrong one whose search
    # did find the answer: the paper labels by outcome, so the first set is useful and the second
    # noisy, the opposite of what a content judge says.
    right = _trajectory("Capital of France?", "Paris", "Paris", [("france rivers", [LYON]), ("capital", [PARIS])])
    wrong = _trajectory("Capital city of France?", "Paris", "Lyon", [("capital france", [PARIS, NICE])])
    records = records_from_trajectories([right, wrong])
    data = build_sft_pairs(records, preset="simsearch", target="trajectory", balance=False, val_fraction=0.0)
    labels = {(p["query"], p["label"]) for p in data.train}
    assert labels == {("france rivers", "useful"), ("capital", "useful"), ("capital france", "noisy")}
    for pair in data.train:
        assert ("do not contain or imply" in pair["prompt"]) == (pair["label"] == "noisy")
    s = data.stats
    assert (s["collect/trajectory_useful"], s["collect/trajectory_noisy"], s["collect/unjudged"]) == (2, 1, 0)
    judged = build_sft_pairs(records, preset="simsearch", target="judged", balance=False, val_fraction=0.0)
    assert {(p["query"], p["label"]) for p in judged.train} == {
        ("france rivers", "noisy"),
        ("capital", "useful"),
        ("capital france", "useful"),
    }


def test_trajectory_target_balances_and_keeps_a_set_seen_with_both_outcomes() -> None:
    same = [("capital", [PARIS])]
    records = records_from_trajectories(
        [
            _trajectory("q?", "Paris", "Paris", same),
            _trajectory("q?", "Paris", "Lyon", same),
            _trajectory("q?", "Paris", "Paris", same),
            _trajectory("r?", "Paris", "Paris", [("x", [LYON])]),
        ]
    )
    data = build_sft_pairs(records, preset="simsearch", target="trajectory", val_fraction=0.0, seed=0)
    s = data.stats
    assert s["collect/duplicates"] == 1  # the third, same set and same outcome as the first
    assert (s["collect/trajectory_useful"], s["collect/trajectory_noisy"]) == (2, 1)
    assert s["collect/dropped_for_balance"] == 1 and s["collect/train_useful_share"] == 0.5


def test_trajectory_target_refuses_records_without_an_outcome() -> None:
    assert outcome_judge([]) == []
    with pytest.raises(ValueError, match="record 1 \\(query 'b'\\) has no trajectory outcome"):
        build_sft_pairs(
            [SearchRecord("q", ["A"], "a", [PARIS], True), _record("q", "A", "b", [PARIS])],
            preset="simsearch",
            target="trajectory",
        )


def test_respelled_variants_keep_a_prefix_and_take_a_donor_ending() -> None:
    import random

    variants = query_variants("Konis", 6, random.Random(0), donors=["Tisun Gosgos"], edits=["respell"])
    assert variants and len(set(variants)) == len(variants)
    for variant in variants:
        # A miscopy: the first two letters or more kept, the ending from a donor word, never the name itself.
        keep = next(k for k in range(len("Konis"), 1, -1) if variant.startswith("Konis"[:k]))
        assert variant != "Konis" and keep >= 2
        assert any(donor.lower().endswith(variant[keep:]) for donor in ("Tisun", "Gosgos")), variant


def test_the_recipe_names_an_unknown_contrast_edit() -> None:
    from simsearch.config import CollectRecipe, load_recipe
    from simsearch.errors import RecipeError

    overrides = ["run_dir=r", "policy.model.path=m", "data.train=[t.jsonl]", "search.corpus=c.jsonl"]
    assert load_recipe(CollectRecipe, None, [*overrides, "contrast_edits=[cut,respell]"]).contrast_edits == [
        "cut",
        "respell",
    ]
    with pytest.raises(RecipeError, match=r"contrast_edits\[1\]='typo' is not one of drop, cut, swap, respell"):
        load_recipe(CollectRecipe, None, [*overrides, "contrast_edits=[cut,typo]"])
