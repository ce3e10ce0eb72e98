"""The server-side curriculum of /retrieve: p_noise by reported step, by searches served, per
granularity; POST /curriculum; per-client usage; and the 422 of presets that need the question."""

from __future__ import annotations

import random

import httpx
import pytest

from simsearch.curriculum.schedules import GRANULARITIES, exponential, make_schedule
from simsearch.curriculum.served import ServedCurriculum
from simsearch.retrieval.server import create_app
from tests.retrieval.test_server import RecordingEngine
from tests.servers import serve_in_thread


def _curriculum(kind: str, *, total_searches: int = 0, granularity: str = "call", **settings) -> ServedCurriculum:
    return ServedCurriculum(
        lambda: make_schedule(kind, **settings),
        total_steps=settings.get("total_steps", 0),
        total_searches=total_searches,
        granularity=granularity,
        seed=0,
    )


def test_p_noise_follows_the_schedule_by_the_step_a_client_reports() -> None:
    # ZeroSearch's exponential curve, p_s=0.1, p_e=0.5, b=4, m=10: p_i = 0.1 + (4^(i/10) - 1)/3 * 0.4.
    # i=0: 0.1; i=5: 4^0.5 = 2, so 0.1 + 0.4/3 = 0.23333...; i=10 and past it: 0.5.
    settings = {"p_start": 0.1, "p_end": 0.5, "total_steps": 10, "base": 4.0}
    engine = RecordingEngine()
    with serve_in_thread(create_app(engine, curriculum=_curriculum("exponential", **settings))) as url:
        answers = [
            httpx.post(f"{url}/retrieve", json={"queries": ["q"], "topk": 2, "step": step}).json()
            for step in (0, 5, 10, 30)
        ]
        # No step in this request: the one this (unnamed) client reported last, 30.
        again = httpx.post(f"{url}/retrieve", json={"queries": ["q"], "topk": 2}).json()
    assert [a["step"] for a in answers] == [0, 5, 10, 30] and again["step"] == 30
    assert [a["p_noise"] for a in answers] == pytest.approx([0.1, 0.1 + 0.4 / 3, 0.5, 0.5], abs=1e-12)
    assert [a["p_noise"] for a in answers] == [exponential(s, **settings) for s in (0, 5, 10, 30)]


def test_without_reported_steps_the_searches_served_move_the_schedule() -> None:
    # total_steps 10 over total_searches 20: step = served * 10 // 20. Linear 0 -> 1 over 10 steps.
    # Requests of 4, 4, 6, 1 queries find 0, 4, 8, 14 served: steps 0, 2, 4, 7; p 0, 0.2, 0.4, 0.7.
    curriculum = _curriculum("linear", total_searches=20, p_start=0.0, p_end=1.0, total_steps=10)
    engine = RecordingEngine()
    with serve_in_thread(create_app(engine, curriculum=curriculum)) as url:
        answers = [
            httpx.post(f"{url}/retrieve", json={"queries": [f"q{i}"] * n, "topk": 3}).json()
            for i, n in enumerate([4, 4, 6, 1])
        ]
        health = httpx.get(f"{url}/health").json()
    assert [a["step"] for a in answers] == [0, 2, 4, 7]
    assert [a["p_noise"] for a in answers] == pytest.approx([0.0, 0.2, 0.4, 0.7], abs=1e-12)
    assert [r.num_noisy for r in engine.calls[0]] == [0, 0, 0, 0]  # p = 0: no query is noisy
    assert health["curriculum"]["(unnamed)"] == {
        "searches": 15,
        "step": 7,
        "p_noise": pytest.approx(0.7),
        "source": "searches",
    }


@pytest.mark.parametrize("granularity", ["call", "document"])
def test_noisy_documents_per_query_follow_the_granularity(granularity: str) -> None:
    # constant p = 0.5, top-5, 8 queries; the server's draws replay num_noisy over random.Random(0).
    curriculum = _curriculum("constant", granularity=granularity, p_start=0.5)
    engine = RecordingEngine()
    with serve_in_thread(create_app(engine, curriculum=curriculum)) as url:
        httpx.post(f"{url}/retrieve", json={"queries": [f"q{i}" for i in range(8)], "topk": 5})
    rng = random.Random(0)
    expected = [GRANULARITIES[granularity](0.5, 5, rng) for _ in range(8)]
    counts = [r.num_noisy for r in engine.calls[0]]
    assert counts == expected
    if granularity == "call":
        assert set(counts) <= {0, 5}  # ZeroSearch: a whole call noisy or not
    else:
        assert set(counts) - {0, 5}  # per document: some calls mixed


def test_reported_steps_are_per_client_and_the_request_noise_wins() -> None:
    curriculum = _curriculum("linear", p_start=0.0, p_end=1.0, total_steps=10)
    engine = RecordingEngine()
    with serve_in_thread(create_app(engine, curriculum=curriculum)) as url:
        reported = httpx.post(f"{url}/curriculum", json={"step": 6, "client": "run-a"}).json()
        a = httpx.post(f"{url}/retrieve", json={"queries": ["q"], "client": "run-a"}).json()
        b = httpx.post(f"{url}/retrieve", json={"queries": ["q"], "client": "run-b"}).json()
        own = httpx.post(f"{url}/retrieve", json={"queries": ["q"], "client": "run-a", "p_noise": 0.25}).json()
        refused = httpx.post(f"{url}/curriculum", json={"step": -1})
        health = httpx.get(f"{url}/health").json()
    assert reported == {"step": 6, "p_noise": pytest.approx(0.6)}
    assert (a["step"], a["p_noise"]) == (6, pytest.approx(0.6))
    assert (b["step"], b["p_noise"]) == (0, 0.0)  # run-b reported nothing and no total was declared
    assert own == {"result": own["result"], "p_noise": 0.25}  # the request's own p_noise, no step
    assert refused.status_code == 422 and "step" in refused.json()["error"]
    assert health["clients"]["run-a"]["searches"] == 2 and health["clients"]["run-b"]["requests"] == 1
    # run-a's curriculum served one query (its own p_noise request bypassed it), at the step it reported.
    assert health["curriculum"]["run-a"] == {
        "searches": 1,
        "step": 6,
        "p_noise": pytest.approx(0.6),
        "source": "reported",
    }


def test_an_adaptive_schedule_moves_on_the_rewards_a_trainer_posts() -> None:
    # window 1, delta 0.1: a mean reward of 0.9 >= target 0.5 raises p from 0.2 to 0.3.
    settings = {"p_start": 0.2, "p_min": 0.0, "p_max": 0.9, "delta": 0.1, "window": 1}
    curriculum = _curriculum("adaptive", **settings, target_reward=0.5, collapse_reward=0.1)
    with serve_in_thread(create_app(RecordingEngine(), curriculum=curriculum)) as url:
        before = httpx.post(f"{url}/retrieve", json={"queries": ["q"]}).json()
        httpx.post(f"{url}/curriculum", json={"step": 1, "metrics": {"reward/mean": 0.9}})
        after = httpx.post(f"{url}/retrieve", json={"queries": ["q"]}).json()
    assert before["p_noise"] == pytest.approx(0.2) and after["p_noise"] == pytest.approx(0.3)


def test_without_a_curriculum_responses_keep_search_r1s_shape_and_curriculum_is_409() -> None:
    with serve_in_thread(create_app(RecordingEngine())) as url:
        answer = httpx.post(f"{url}/retrieve", json={"queries": ["q"], "step": 4}).json()
        posted = httpx.post(f"{url}/curriculum", json={"step": 4})
    assert set(answer) == {"result"}
    assert posted.status_code == 409 and "curriculum" in posted.json()["error"]


def test_a_preset_that_needs_the_question_refuses_requests_without_it() -> None:
    engine = RecordingEngine()
    with serve_in_thread(create_app(engine, context_preset="zerosearch")) as url:
        bare = httpx.post(f"{url}/retrieve", json={"queries": ["q0", "q1"]})
        half = httpx.post(
            f"{url}/retrieve",
            json={"queries": ["q0", "q1"], "question": ["Who?", "Where?"], "golden_answers": [["Ann"], [" "]]},
        )
        full = httpx.post(
            f"{url}/retrieve",
            json={"queries": ["q0", "q1"], "question": ["Who?", "Where?"], "golden_answers": [["Ann"], ["Rome"]]},
        )
    assert bare.status_code == 422
    assert "query 0 ('q0') came without 'question' or 'golden_answers'" in bare.json()["error"]
    assert half.status_code == 422 and "query 1 ('q1') came without 'golden_answers'" in half.json()["error"]
    assert full.status_code == 200
    assert [(r.question, r.golden_answers) for r in engine.calls[0]] == [("Who?", ["Ann"]), ("Where?", ["Rome"])]
    assert len(engine.calls) == 1  # the refused requests never reached the engine
