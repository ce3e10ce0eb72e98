"""The multi-turn rollout: token-level loss masks, batching contract, turn budget, self-search.

Most tests drive `generate_trajectories` with a scripted policy (`ScriptedPolicy`, which returns
pre-set turns and records every call) and a recording search engine, over a real byte-level BPE
tokenizer trained in-process. The last test runs a tiny Qwen2 through `HFEngine`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from simsearch.config import RolloutConfig, SearchConfig
from simsearch.data.rendering import render_documents, wrap_information
from simsearch.data.templates import SEARCH_R1_TEMPLATE, SELF_SEARCH_TEMPLATE
from simsearch.errors import DataError
from simsearch.generation.hf import HFEngine
from simsearch.models import EOS_TOKEN, PAD_TOKEN, build_tiny_model, train_tokenizer
from simsearch.policy.rewards import score_trajectories
from simsearch.policy.rollout import RolloutSettings, generate_trajectories
from simsearch.policy.selfsearch import decode_offsets
from simsearch.policy.tags import INVALID_ACTION_MESSAGE
from simsearch.types import FINISHES, Completion, Document, QAExample, SamplingParams, SearchRequest

QUESTIONS = ["who founded orvale?", "where was mira tal born?", "when did kesto open?"]
EXAMPLES = [QAExample(id=f"q{i}", question=q, golden_answers=[f"gold {i}"]) for i, q in enumerate(QUESTIONS)]

SEARCH_TURN = "<think> I need facts </think>\n<search> orvale founder </search>"
ANSWER_TURN = "<think> found it </think>\n<answer> gold 0 </answer>"


def _training_texts() -> list[str]:
    texts = []
    for q in QUESTIONS:
        for template in (SEARCH_R1_TEMPLATE, SELF_SEARCH_TEMPLATE):
            texts.append(template.format(question=q))
        texts.append(
            SEARCH_TURN
            + wrap_information(render_documents([Document("Orvale", "founded by ana\nin the north")]))
            + ANSWER_TURN
            + INVALID_ACTION_MESSAGE
        )
    return texts * 5


@pytest.fixture(scope="module")
def tokenizer():
    """Tags are single special tokens (as in the tiny models)."""
    return train_tokenizer(_training_texts(), vocab_size=500)


@pytest.fixture(scope="module")
def plain_tokenizer():
    """No tag tokens: `</search>` and `<information>` are spelled in several BPE pieces, and
    `>\\n\\n` is one pre-token (Qwen2's split regex), so tokens merge across segment borders."""
    return train_tokenizer(_training_texts(), vocab_size=500, special_tokens=(PAD_TOKEN, EOS_TOKEN))


# --------------------------------------------------------------------------- test doubles


@dataclass
class ScriptedPolicy:
    """A GenerationEngine returning scripted turns.

    `script(context_text, call, sample)` gives the text the policy "generates" for a prompt in
    generate call number `call` (sample = index among the n samples). Stop strings and
    max_new_tokens are applied as a real engine would: the text is cut after the first stop
    string and the token ids are the encoding of what is returned.
    """

    tokenizer: object
    script: Callable[[str, int, int], str]
    logprob: float | None = None  # when set, token k of a completion has logprob -(k+1)*logprob
    calls: list[tuple[list[list[int]], SamplingParams]] = field(default_factory=list)

    def generate(self, prompts, params):
        call = len(self.calls)
        self.calls.append((prompts, params))
        out = []
        for prompt in prompts:
            context = self.tokenizer.decode(prompt, skip_special_tokens=False)
            for sample in range(params.n):
                out.append(self._complete(self.script(context, call, sample), params))
        return out

    def _complete(self, text: str, params: SamplingParams) -> Completion:
        hits = [(text.find(s) + len(s), s) for s in params.stop if s in text]
        stop = None
        if hits:
            end, stop = min(hits)
            text = text[:end]
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        reason = "stop"
        if len(ids) > params.max_new_tokens:
            ids, stop, reason = ids[: params.max_new_tokens], None, "length"
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
        logprobs = None
        if params.logprobs:
            logprobs = [-(k + 1) * (self.logprob or 0.1) for k in range(len(ids))]
        return Completion(ids, text, reason, stop, logprobs)


@dataclass
class RecordingSearch:
    """A SearchEngine whose documents depend on the query; records every call."""

    calls: list[list[SearchRequest]] = field(default_factory=list)

    def search(self, requests):
        self.calls.append(list(requests))
        return [documents(r.query, r.top_k) for r in requests]


def documents(query: str, top_k: int) -> list[Document]:
    # Multi-line texts: SSRL's information regex (no DOTALL) never masked such blocks.
    return [Document(f"Title {i} {query}", f"line one about {query}\nline two {i}") for i in range(top_k)]


def by_turn(*turns: str) -> Callable[[str, int, int], str]:
    """A script giving turns[call] whatever the prompt."""
    return lambda context, call, sample: turns[call]


def segments(ids: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    """Runs of equal mask value: [(mask value, ids), ...]."""
    runs: list[tuple[int, list[int]]] = []
    for token, m in zip(ids, mask):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(token)
        else:
            runs.append((m, [token]))
    return runs


def make_settings(**fields: Any) -> RolloutSettings:
    """`RolloutSettings` from RolloutConfig fields plus `top_k` / `rendering`; the sections' defaults elsewhere."""
    search = SearchConfig(**{name: fields.pop(name) for name in ("top_k", "rendering") if name in fields})
    return RolloutSettings(RolloutConfig(**fields), search.top_k, search.rendering)


def run(tokenizer, script, *, examples=EXAMPLES[:1], search=None, group_size=1, **settings):
    policy = ScriptedPolicy(tokenizer, script)
    search = RecordingSearch() if search is None else search
    result = generate_trajectories(
        examples,
        policy=policy,
        tokenizer=tokenizer,
        search=search,
        settings=make_settings(**settings),
        sampling=SamplingParams(temperature=0.0, max_new_tokens=200),
        group_size=group_size,
    )
    return result, policy, search


def decode(tokenizer, ids):
    return tokenizer.decode(ids, skip_special_tokens=False)


# --------------------------------------------------------------------------- loss masks


def test_loss_mask_covers_exactly_the_multi_line_information_block(tokenizer):
    result, _, _ = run(tokenizer, by_turn(SEARCH_TURN, ANSWER_TURN), top_k=2)
    traj = result.trajectories[0]
    observation = wrap_information(render_documents(documents("orvale founder", 2)))
    assert observation.count("\n") >= 4  # a multi-line block

    runs = segments(traj.response_ids, traj.loss_mask)
    assert [m for m, _ in runs] == [1, 0, 1]
    assert decode(tokenizer, runs[0][1]) == SEARCH_TURN
    assert decode(tokenizer, runs[1][1]) == observation
    assert decode(tokenizer, runs[2][1]) == ANSWER_TURN
    assert traj.response_text == SEARCH_TURN + observation + ANSWER_TURN
    assert len(traj.loss_mask) == len(traj.response_ids)
    assert traj.finish == "answer" and traj.answer == "gold 0"
    assert traj.num_searches == 1 and traj.turns[0].executed and traj.turns[0].query == "orvale founder"
    assert traj.turns[0].documents == documents("orvale founder", 2)


def test_mask_is_exact_where_joint_tokenization_would_merge_across_the_border(plain_tokenizer):
    tok = plain_tokenizer
    result, _, _ = run(tok, by_turn(SEARCH_TURN, ANSWER_TURN), top_k=1)
    traj = result.trajectories[0]
    observation = wrap_information(render_documents(documents("orvale founder", 1)))
    first = tok.encode(SEARCH_TURN, add_special_tokens=False)
    inserted = tok.encode(observation, add_special_tokens=False)

    # Re-tokenizing the decoded response (SSRL's mask recipe) gives other ids: ">" + "\n\n"
    # merge into one pre-token across the </search> | observation border.
    joint = tok.encode(traj.response_text, add_special_tokens=False)
    assert joint != traj.response_ids
    assert tok.encode("</search>" + observation, add_special_tokens=False) != (
        tok.encode("</search>", add_special_tokens=False) + inserted
    )
    # Our ids are the policy's ids, then the observation's own ids, mask 0 on exactly those.
    start = len(first)
    assert traj.response_ids[:start] == first
    zeros = [i for i, m in enumerate(traj.loss_mask) if m == 0]
    assert zeros == list(range(start, start + len(zeros)))
    assert decode(tok, traj.response_ids[start : start + len(zeros)]) == observation
    assert decode(tok, traj.response_ids) == traj.response_text


def test_observation_truncation_keeps_the_closing_tag(tokenizer):
    result, _, _ = run(tokenizer, by_turn(SEARCH_TURN, ANSWER_TURN), top_k=3, max_obs_tokens=20)
    traj = result.trajectories[0]
    runs = segments(traj.response_ids, traj.loss_mask)
    inserted = runs[1][1]
    assert runs[1][0] == 0 and len(inserted) == 20
    text = decode(tokenizer, inserted)
    full = wrap_information(render_documents(documents("orvale founder", 3)))
    assert text.startswith("\n\n<information>Doc 1(Title: ")
    assert text.endswith("</information>\n\n")
    assert len(text) < len(full)
    # The head is a prefix of the full observation: nothing but the cut changed.
    assert full.startswith(text[: -len("</information>\n\n")])
    assert decode(tokenizer, runs[2][1]) == ANSWER_TURN


def test_invalid_action_appends_the_corrective_message_and_counts(tokenizer):
    rambling = "<think> let me think about this </think> no tags here"
    result, _policy, search = run(tokenizer, by_turn(rambling, ANSWER_TURN))
    traj = result.trajectories[0]
    runs = segments(traj.response_ids, traj.loss_mask)
    assert [m for m, _ in runs] == [1, 0, 1]
    assert decode(tokenizer, runs[1][1]) == INVALID_ACTION_MESSAGE
    assert traj.num_invalid == 1 and traj.turns[0].action == "invalid"
    assert traj.finish == "answer" and traj.answer == "gold 0"
    assert search.calls == []
    assert result.metrics["rollout/invalid_actions"] == 1.0


def test_final_turn_search_is_not_run_and_is_counted(tokenizer):
    result, policy, search = run(tokenizer, by_turn(SEARCH_TURN, SEARCH_TURN, SEARCH_TURN), max_turns=2)
    traj = result.trajectories[0]
    assert len(policy.calls) == 3  # two search turns, then the final answer turn
    assert len(search.calls) == 2  # the final turn's search is not run
    assert set(policy.calls[2][1].stop) == {"</search>", "</answer>"}
    assert [t.executed for t in traj.turns] == [True, True, False]
    assert traj.finish == "max_turns" and traj.answer is None and traj.num_searches == 2
    # The response ends with the unanswered search, no information block after it.
    assert traj.response_text.endswith(SEARCH_TURN) and traj.loss_mask[-1] == 1
    assert result.metrics["rollout/over_budget_searches"] == 1.0
    assert result.metrics["rollout/answer_rate"] == 0.0


def test_final_turn_without_search_or_answer_gives_up_apart_from_max_turns(tokenizer):
    # One question, 4 rollouts, max_turns=1: rollout 0 answers at once; 1-3 search, then in the
    # final turn 1 searches again (not run), 2 stops with no tag, 3 runs past max_new_tokens=200.
    finals = iter([SEARCH_TURN, "<think> I do not know </think>", "<think> " + "very long " * 300])

    def script(context, call, sample):
        if call == 0:
            return ANSWER_TURN if sample == 0 else SEARCH_TURN
        return next(finals)

    result, _, _ = run(tokenizer, script, group_size=4, max_turns=1)
    assert [t.finish for t in result.trajectories] == ["answer", "max_turns", "gave_up", "length"]
    assert [t.num_invalid for t in result.trajectories] == [0, 0, 1, 1]
    m = result.metrics
    # one trajectory of 4 per finish; unfinished = max_turns + gave_up = 2 of 4 (as before the split)
    assert [m[f"rollout/finish_{r}"] for r in FINISHES] == [0.25, 0.25, 0.25, 0.0, 0.25]
    assert m["rollout/unfinished_share"] == 0.5
    assert m["rollout/over_budget_searches"] == 0.25 and m["rollout/invalid_actions"] == 0.5


def test_single_generation_without_an_answer_gives_up(tokenizer):
    # max_turns=0 (SSRL's single generation): a self-search generation that stops without answering
    result, _, _ = run(tokenizer, by_turn("<think> no idea </think>"), template="self-search", search=None, max_turns=0)
    assert result.trajectories[0].finish == "gave_up"
    assert result.metrics["rollout/finish_gave_up"] == 1.0 and result.metrics["rollout/finish_max_turns"] == 0.0


def test_final_turn_that_runs_out_of_tokens_finishes_with_length(tokenizer):
    policy = ScriptedPolicy(tokenizer, by_turn("<think> " + "very long " * 50))
    result = generate_trajectories(
        EXAMPLES[:1],
        policy=policy,
        tokenizer=tokenizer,
        search=None,
        settings=make_settings(max_turns=0),
        sampling=SamplingParams(max_new_tokens=10),
    )
    traj = result.trajectories[0]
    assert traj.finish == "length" and len(traj.response_ids) == 10 and traj.num_invalid == 1


def test_one_generate_and_one_search_call_per_turn(tokenizer):
    result, policy, search = run(tokenizer, by_turn(SEARCH_TURN, ANSWER_TURN), examples=EXAMPLES, group_size=2)
    assert len(policy.calls) == 2
    assert len(search.calls) == 1 and len(search.calls[0]) == 6
    # The first turn sends each question once with n = group_size; later turns one row each.
    first_prompts, first_params = policy.calls[0]
    assert len(first_prompts) == 3 and first_params.n == 2
    second_prompts, second_params = policy.calls[1]
    assert len(second_prompts) == 6 and second_params.n == 1
    request = search.calls[0][2]
    assert (request.question, request.golden_answers, request.top_k) == (QUESTIONS[1], ["gold 1"], 3)
    assert result.metrics["search/calls_per_traj"] == 1.0
    assert result.metrics["rollout/finish_answer"] == 1.0


def test_group_ids_follow_the_examples(tokenizer):
    # Each sample of the first turn answers with its own sample index.
    def script(context, call, sample):
        return f"<answer> s{sample} </answer>"

    result, _, _ = run(tokenizer, script, examples=EXAMPLES, group_size=3)
    trajs = result.trajectories
    assert [t.prompt_id for t in trajs] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [t.example.id for t in trajs] == ["q0"] * 3 + ["q1"] * 3 + ["q2"] * 3
    assert [t.answer for t in trajs[:3]] == ["s0", "s1", "s2"]
    assert all(t.prompt_ids == trajs[3 * t.prompt_id].prompt_ids for t in trajs)
    assert trajs[0].prompt_ids != trajs[3].prompt_ids


def test_each_generate_call_gets_its_own_seed(tokenizer):
    policy = ScriptedPolicy(tokenizer, by_turn(SEARCH_TURN, ANSWER_TURN))
    generate_trajectories(
        EXAMPLES[:1],
        policy=policy,
        tokenizer=tokenizer,
        search=RecordingSearch(),
        settings=make_settings(),
        sampling=SamplingParams(seed=7),
    )
    assert [params.seed for _, params in policy.calls] == [7, 8]


def test_noise_sets_num_noisy_per_search(tokenizer):
    policy = ScriptedPolicy(tokenizer, by_turn(SEARCH_TURN, ANSWER_TURN))
    search = RecordingSearch()
    counts = iter([3, 0])
    result = generate_trajectories(
        EXAMPLES[:2],
        policy=policy,
        tokenizer=tokenizer,
        search=search,
        settings=make_settings(top_k=3),
        sampling=SamplingParams(),
        noise=lambda top_k: next(counts),
    )
    assert [r.num_noisy for r in search.calls[0]] == [3, 0]
    assert [t.turns[0].num_noisy for t in result.trajectories] == [3, 0]
    assert result.metrics["search/noisy_share"] == pytest.approx(3 / 6)  # 3 noisy of 2 x 3 docs


def test_logprobs_are_aligned_and_zero_on_inserted_tokens(tokenizer):
    policy = ScriptedPolicy(tokenizer, by_turn(SEARCH_TURN, ANSWER_TURN), logprob=0.5)
    result = generate_trajectories(
        EXAMPLES[:1],
        policy=policy,
        tokenizer=tokenizer,
        search=RecordingSearch(),
        settings=make_settings(),
        sampling=SamplingParams(logprobs=True),
    )
    traj = result.trajectories[0]
    n1 = len(tokenizer.encode(SEARCH_TURN))
    n2 = len(tokenizer.encode(ANSWER_TURN))
    n_obs = len(traj.response_ids) - n1 - n2
    # The scripted engine gives token k of each completion logprob -(k + 1) * 0.5.
    expected = [-(k + 1) * 0.5 for k in range(n1)] + [0.0] * n_obs + [-(k + 1) * 0.5 for k in range(n2)]
    assert traj.logprobs == expected


def test_context_limit_cuts_the_last_generation(tokenizer):
    prompt_len = len(tokenizer.encode(SEARCH_R1_TEMPLATE.format(question=QUESTIONS[0])))
    n1 = len(tokenizer.encode(SEARCH_TURN))
    obs_len = len(tokenizer.encode(wrap_information(render_documents(documents("orvale founder", 3)))))
    limit = prompt_len + n1 + obs_len + 4  # room for 4 tokens of the answer turn
    result, policy, _ = run(tokenizer, by_turn(SEARCH_TURN, ANSWER_TURN), max_context_tokens=limit)
    traj = result.trajectories[0]
    assert policy.calls[1][1].max_new_tokens == 4
    assert traj.finish == "context" and traj.answer is None
    assert len(traj.prompt_ids) + len(traj.response_ids) == limit
    assert traj.loss_mask[-4:] == [1, 1, 1, 1]


def test_a_prompt_without_room_under_the_context_limit_is_a_data_error_naming_the_example(tokenizer):
    prompt_len = len(tokenizer.encode(SEARCH_R1_TEMPLATE.format(question=QUESTIONS[0])))
    with pytest.raises(DataError, match=rf"example 0 \(id {EXAMPLES[0].id!r}\): the prompt has {prompt_len} tokens"):
        run(tokenizer, by_turn(SEARCH_TURN, ANSWER_TURN), max_context_tokens=prompt_len)


def test_context_limit_stops_before_an_observation_that_does_not_fit(tokenizer):
    prompt_len = len(tokenizer.encode(SEARCH_R1_TEMPLATE.format(question=QUESTIONS[0])))
    limit = prompt_len + len(tokenizer.encode(SEARCH_TURN)) + 5
    result, policy, _search = run(tokenizer, by_turn(SEARCH_TURN, ANSWER_TURN), max_context_tokens=limit)
    traj = result.trajectories[0]
    assert traj.finish == "context" and len(policy.calls) == 1
    assert traj.loss_mask == [1] * len(traj.response_ids)  # the observation was not appended


# --------------------------------------------------------------------------- self-search

SELF_TURN = (
    "<think> recall </think>\n<search> orvale founder </search>\n"
    "<information>Doc 1(Title: Orvale) founded by Ana Lé 😀\nin the north</information>\n"
    "<think> so it is ana </think>\n<answer> ana </answer>"
)
SELF_INFO = "<information>Doc 1(Title: Orvale) founded by Ana Lé 😀\nin the north</information>"


def test_self_search_masks_the_policy_own_information_by_token_id(tokenizer):
    result, policy, _search = run(tokenizer, by_turn(SELF_TURN), template="self-search", search=None)
    traj = result.trajectories[0]
    runs = segments(traj.response_ids, traj.loss_mask)
    assert [m for m, _ in runs] == [1, 0, 1]
    assert decode(tokenizer, runs[1][1]) == SELF_INFO
    assert policy.calls[0][1].stop == ["</answer>"] and len(policy.calls) == 1
    assert traj.turns[0].self_queries == ["orvale founder"] and traj.num_searches == 1
    assert traj.answer == "ana" and traj.finish == "answer"
    assert result.metrics["search/self_calls_per_traj"] == 1.0


def test_self_search_masks_by_character_offsets_when_tags_are_not_tokens(plain_tokenizer):
    tok = plain_tokenizer
    result, _, _ = run(tok, by_turn(SELF_TURN), template="self-search", search=None)
    traj = result.trajectories[0]
    ids, mask = traj.response_ids, traj.loss_mask
    runs = segments(ids, mask)
    assert [m for m, _ in runs] == [1, 0, 1]
    masked = decode(tok, runs[1][1])
    # Every character of the block is masked; a token straddling the border may take at most
    # a few neighbouring characters (here the newlines around the block) with it.
    assert SELF_INFO in masked and len(masked) - len(SELF_INFO) <= 2
    assert "founded" not in decode(tok, runs[0][1]) + decode(tok, runs[2][1])
    assert decode(tok, runs[2][1]).endswith("<answer> ana </answer>")


def test_incremental_decoding_credits_split_characters_to_the_completing_token(plain_tokenizer):
    tok = plain_tokenizer
    text = "a😀b"  # the emoji is 4 UTF-8 bytes, spread over several byte tokens
    ids = tok.encode(text, add_special_tokens=False)
    decoded, ends = decode_offsets(lambda i: tok.decode(i, skip_special_tokens=False), ids)
    assert decoded == text
    # Byte tokens before the emoji's last byte cover no character yet; the last one covers it.
    pieces = [tok.decode([i]) for i in ids]
    assert len(ids) >= 4 and pieces[0] == "a" and pieces[-1] == "b"
    assert ends == [1] * (len(ids) - 2) + [2, 3]


def test_self_search_with_real_share_inserts_real_results(tokenizer):
    policy = ScriptedPolicy(tokenizer, by_turn(SELF_TURN, "<think> ok </think>\n<answer> ana </answer>"))
    search = RecordingSearch()
    result = generate_trajectories(
        EXAMPLES[:1],
        policy=policy,
        tokenizer=tokenizer,
        search=search,
        settings=make_settings(template="self-search", self_search_real_share=1.0, top_k=1),
        sampling=SamplingParams(),
        group_size=2,
    )
    # Cut at </search>: the policy's own information never reaches the trajectory.
    assert set(policy.calls[0][1].stop) == {"</search>", "</answer>"}
    assert len(search.calls) == 1 and len(search.calls[0]) == 2
    for traj in result.trajectories:
        runs = segments(traj.response_ids, traj.loss_mask)
        assert decode(tokenizer, runs[1][1]) == wrap_information(render_documents(documents("orvale founder", 1)))
        assert traj.turns[0].executed and traj.answer == "ana"


def test_self_search_real_share_is_drawn_per_question(tokenizer):
    # Real-search rows come back with results in their context; then they answer.
    def script(context, call, sample):
        return "<answer> ana </answer>" if "<information>Doc" in context else SELF_TURN

    policy = ScriptedPolicy(tokenizer, script)
    search = RecordingSearch()
    questions = [QAExample(id=str(i), question=f"q {i}?", golden_answers=["ana"]) for i in range(8)]
    result = generate_trajectories(
        questions,
        policy=policy,
        tokenizer=tokenizer,
        search=search,
        settings=make_settings(template="self-search", self_search_real_share=0.5),
        sampling=SamplingParams(),
        group_size=2,
        rng=random.Random(3),
    )
    real = [t.turns[0].executed for t in result.trajectories]
    assert real[0::2] == real[1::2]  # both rollouts of a question agree
    draws = random.Random(3)
    assert real[0::2] == [draws.random() < 0.5 for _ in range(8)]
    assert 0 < sum(real) < len(real)
    # Two stop lists in the first turn: one call each.
    assert sorted(len(p[0]) for p in policy.calls[:2]) == sorted([sum(real) // 2, 8 - sum(real) // 2])


# --------------------------------------------------------------------------- arguments, scoring


def test_search_template_without_engine_is_rejected(tokenizer):
    with pytest.raises(ValueError, match="pass a search engine"):
        generate_trajectories(
            EXAMPLES,
            policy=ScriptedPolicy(tokenizer, by_turn(ANSWER_TURN)),
            tokenizer=tokenizer,
            search=None,
            settings=make_settings(),
            sampling=SamplingParams(),
        )


def test_a_template_the_loop_cannot_start_from_is_rejected(tokenizer):
    with pytest.raises(ValueError, match="template='rag' is not one of"):
        run(tokenizer, by_turn(ANSWER_TURN), template="rag")


def test_score_trajectories_uses_the_response_answer(tokenizer):
    def script(context, call, sample):
        return "<answer> gold 0 </answer>" if sample == 0 else "<answer> no </answer>"

    result, _, _ = run(tokenizer, script, group_size=2)
    scored = score_trajectories(result.trajectories, {"em": 1.0})
    assert scored.total == [1.0, 0.0]
    assert scored.stats["reward/mean"] == 0.5


# --------------------------------------------------------------------------- a real tiny model


def _overfit(model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor, margin: float, max_steps: int) -> int:
    """Trains until every labelled token beats every other by `margin` logits; returns the steps.

    A condition, not a step count: float results of training differ between CPUs, so a fixed
    number of steps can leave a near-tie that greedy decoding breaks differently on another
    machine. With the margin reached, greedy decoding is the trace on any CPU.
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)
    targets = labels[0, 1:]
    trained = targets.ne(-100)
    for step in range(max_steps):
        model.train()
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 9:
            model.eval()
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, :-1][trained]  # [T, V]
            gold = logits.gather(-1, targets[trained].unsqueeze(-1)).squeeze(-1)
            others = logits.scatter(-1, targets[trained].unsqueeze(-1), float("-inf")).max(dim=-1).values
            if bool((gold - others).min() > margin):
                return step + 1
    raise AssertionError(f"the tiny model did not fit the trace within {max_steps} steps")


def test_two_turns_end_to_end_with_a_tiny_model(tokenizer):
    """A tiny Qwen2, overfit on one trace's two turns, searches then answers through HFEngine."""
    prompt = tokenizer.encode(SEARCH_R1_TEMPLATE.format(question=QUESTIONS[0]))
    first = tokenizer.encode(SEARCH_TURN)
    observation = tokenizer.encode(wrap_information(render_documents(documents("orvale founder", 1))))
    second = tokenizer.encode(ANSWER_TURN)
    ids = torch.tensor([prompt + first + observation + second])
    labels = torch.tensor([[-100] * len(prompt) + first + [-100] * len(observation) + second])
    model = build_tiny_model(tokenizer, hidden=32, layers=1, heads=2, kv_heads=1, ffn=64, seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 1-layer model trains faster on one thread than on a busy CPU
    try:
        _overfit(model, ids, labels, margin=1.0, max_steps=600)
        model.eval()

        search = RecordingSearch()
        result = generate_trajectories(
            EXAMPLES[:1],
            policy=HFEngine(model, tokenizer),
            tokenizer=tokenizer,
            search=search,
            settings=make_settings(top_k=1, max_turns=2),
            sampling=SamplingParams(temperature=0.0, max_new_tokens=40, logprobs=True),
            group_size=2,
        )
    finally:
        torch.set_num_threads(threads)
    assert len(search.calls) == 1 and [r.query for r in search.calls[0]] == ["orvale founder"] * 2
    for traj in result.trajectories:
        assert traj.finish == "answer" and traj.answer == "gold 0"
        assert [t.action for t in traj.turns] == ["search", "answer"]
        # The engine's own ids, then the observation's ids (mask 0), then the engine's ids.
        assert traj.response_ids == first + observation + second
        assert traj.loss_mask == [1] * len(first) + [0] * len(observation) + [1] * len(second)
        assert (
            traj.response_text
            == SEARCH_TURN + wrap_information(render_documents(documents("orvale founder", 1))) + ANSWER_TURN
        )
        assert all(lp < 0 for lp, m in zip(traj.logprobs, traj.loss_mask) if m == 1)
        assert all(lp == 0 for lp, m in zip(traj.logprobs, traj.loss_mask) if m == 0)
    assert result.metrics["perf/decoded_tokens"] == 2 * (len(first) + len(second))
