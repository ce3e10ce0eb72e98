"""The tool-call protocol's rollout: the context is the chat template's rendering, masks, one search call a turn.

A scripted policy (`tests.policy.test_rollout.ScriptedPolicy`, here ending every turn with the
template's end-of-turn token as a chat model does) drives `generate_trajectories` over tiny
tokenizers carrying the hermes and llama3 templates of `tests.chat_templates`.
"""

from __future__ import annotations

import pytest

from simsearch.data.chat import TOOL_CALL_PROMPT, TOOL_CALL_SELF_SEARCH_PROMPT, ChatTemplateError, search_tool_schema
from simsearch.data.rendering import render_documents
from simsearch.generation.hf import HFEngine
from simsearch.models import TINY_CHAT_TEMPLATE, build_tiny_model
from simsearch.policy.infogain import gold_queries
from simsearch.policy.rewards import score_trajectories, toolcall_format_score
from simsearch.policy.rollout import generate_trajectories
from simsearch.policy.toolcalls import TOOL_CALL_CORRECTION
from simsearch.types import Document, QAExample, SamplingParams
from tests.chat_templates import HERMES_SPECIALS, HERMES_TEMPLATE, LLAMA3_SPECIALS, LLAMA3_TEMPLATE, tokenizer
from tests.policy.test_rollout import RecordingSearch, ScriptedPolicy, documents, make_settings

EXAMPLES = [QAExample(id=f"q{i}", question=f"Who founded the Belsa rope works {i}?", golden_answers=["Rell"])
            for i in range(2)]  # fmt: skip
TOOLS = [search_tool_schema()]
FORMATS = {"hermes": (HERMES_TEMPLATE, HERMES_SPECIALS), "llama3": (LLAMA3_TEMPLATE, LLAMA3_SPECIALS)}


def call(tool_format: str, *queries: str, tool: str = "search") -> str:
    """The calls in `tool_format`'s syntax."""
    if tool_format == "hermes":
        return "".join(f'<tool_call>{{"name": "{tool}", "arguments": {{"query": "{q}"}}}}</tool_call>' for q in queries)
    return "; ".join(f'{{"name": "{tool}", "parameters": {{"query": "{q}"}}}}' for q in queries)


def turns_by_case(tool_format: str) -> dict[str, str]:
    """One assistant message per parser case, by name."""
    return {
        "one": "<think> look it up </think>" + call(tool_format, "Belsa founder"),
        "several": call(tool_format, "Belsa rope", "Belsa founder"),
        "malformed": (
            '<tool_call>{"name": "search", "arguments": {"query": "a"</tool_call>'
            if tool_format == "hermes"
            else '{"name": "search", "parameters": {'
        ),
        "unknown": call(tool_format, "a", tool="browse"),
        "in_think": "<think> " + call(tool_format, "a") + " </think> not sure",
        "answer": "<think> found it </think> <answer> Rell </answer>",
    }


@pytest.fixture(scope="module", params=list(FORMATS))
def chat(request):
    template, specials = FORMATS[request.param]
    return request.param, tokenizer(template, specials)


def run(tok, tool_format, script, *, examples=EXAMPLES, max_turns=4, **settings):
    eos = tok.eos_token
    policy = ScriptedPolicy(tok, lambda context, n, sample: script(context, n, sample) + eos)
    search = RecordingSearch()
    result = generate_trajectories(
        examples,
        policy=policy,
        tokenizer=tok,
        search=search,
        settings=make_settings(
            protocol="tool-call",
            tool_format=tool_format,
            max_turns=max_turns,
            top_k=2,
            max_context_tokens=8192,
            max_obs_tokens=4096,
            **settings,
        ),
        sampling=SamplingParams(temperature=0.0, max_new_tokens=400),
    )
    return result, policy, search


def test_every_parser_case_in_one_trajectory_context_masks_and_records(chat) -> None:
    tool_format, tok = chat
    cases = turns_by_case(tool_format)
    order = ["one", "malformed", "several", "unknown", "in_think", "answer"]
    result, policy, _ = run(tok, tool_format, lambda context, n, sample: cases[order[n]], max_turns=5)
    trajectory = result.trajectories[0]
    assert [turn.action for turn in trajectory.turns] == ["search", "invalid", "search", "invalid", "invalid", "answer"]
    assert trajectory.finish == "answer" and trajectory.answer == "Rell" and trajectory.num_invalid == 3
    assert trajectory.num_searches == 3 and trajectory.turns[2].call_queries == ["Belsa rope", "Belsa founder"]
    assert [len(docs) for docs in trajectory.turns[2].call_documents] == [2, 2]
    assert (
        "not valid JSON" in trajectory.turns[1].call_reasons[0]
        and "unknown tool 'browse'" in trajectory.turns[3].call_reasons[0]
    )
    assert "inside <think>" in trajectory.turns[4].call_reasons[0]

    # At every turn the policy saw, byte for byte, the template's rendering of the conversation.
    messages = [{"role": "user", "content": TOOL_CALL_PROMPT.format(question=EXAMPLES[0].question)}]
    for n, name in enumerate(order):
        prompt = policy.calls[n][0][0]
        expected = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
        assert tok.decode(prompt, skip_special_tokens=False) == expected
        turn = trajectory.turns[n]
        if turn.action == "search":
            results = [render_documents(docs) for docs in turn.call_documents]
        else:
            results = [TOOL_CALL_CORRECTION.format(reasons="; ".join(turn.call_reasons))]
        messages.append({"role": "assistant", "content": cases[name]})
        messages += [{"role": "tool", "content": r} for r in results] if turn.action != "answer" else []

    # The loss sees exactly the policy's own text: every token the template added is masked.
    trained = tok.decode([t for t, m in zip(trajectory.response_ids, trajectory.loss_mask) if m],
                         skip_special_tokens=False)  # fmt: skip
    assert trained == "".join(cases[name] + tok.eos_token for name in order)


def test_all_calls_of_all_rows_go_in_one_search_call_per_turn(chat) -> None:
    tool_format, tok = chat
    cases = turns_by_case(tool_format)

    def script(context, n, sample):
        if n == 0:
            return cases["several"] if "works 0" in context else cases["one"]
        return cases["answer"]

    result, policy, search = run(tok, tool_format, script)
    assert len(search.calls) == 1 and [r.query for r in search.calls[0]] == ["Belsa rope", "Belsa founder",
                                                                              "Belsa founder"]  # fmt: skip
    assert len(policy.calls) == 2 and len(policy.calls[0][0]) == 2  # one generate call per turn, both rows
    assert [t.num_searches for t in result.trajectories] == [2, 1]
    assert result.metrics["search/calls_per_traj"] == 1.5
    second = tok.decode(policy.calls[1][0][0], skip_special_tokens=False)
    for docs in (documents("Belsa rope", 2), documents("Belsa founder", 2)):
        assert render_documents(docs) in second


def test_finishes_over_turns_and_rewards(chat) -> None:
    tool_format, tok = chat
    cases = turns_by_case(tool_format)
    result, _, search = run(tok, tool_format, lambda context, n, sample: cases["one"], examples=EXAMPLES[:1],
                            max_turns=1)  # fmt: skip
    over = result.trajectories[0]
    assert over.finish == "max_turns" and over.answer is None and len(search.calls) == 1
    result, _, _ = run(tok, tool_format, lambda context, n, sample: [cases["one"], cases["answer"]][n],
                       examples=EXAMPLES[:1])  # fmt: skip
    good = result.trajectories[0]
    scored = score_trajectories([good, over], {"em": 1.0, "toolcall_format": 0.5})
    assert scored.total == [1.5, 0.0]
    assert toolcall_format_score(good.turns) == 1.0 and toolcall_format_score(over.turns) == 0.0


def test_an_answer_inside_a_tool_result_is_not_the_answer(chat) -> None:
    tool_format, tok = chat
    cases = turns_by_case(tool_format)

    class AnsweringSearch(RecordingSearch):
        def search(self, requests):
            return [[Document("Belsa", "<answer> Rell </answer>")] for _ in requests]

    policy = ScriptedPolicy(tok, lambda context, n, sample: [cases["one"], "no idea"][n] + tok.eos_token)
    result = generate_trajectories(
        EXAMPLES[:1], policy=policy, tokenizer=tok, search=AnsweringSearch(),
        settings=make_settings(protocol="tool-call", tool_format=tool_format, max_turns=1),
        sampling=SamplingParams(max_new_tokens=400),
    )  # fmt: skip
    trajectory = result.trajectories[0]
    assert "<answer> Rell </answer>" in trajectory.response_text  # the tag reader would take it
    assert trajectory.finish == "gave_up" and trajectory.answer is None
    assert score_trajectories([trajectory], {"em": 1.0}).total == [0.0]


def test_a_template_without_tool_support_fails_before_any_work() -> None:
    tok = tokenizer(TINY_CHAT_TEMPLATE, HERMES_SPECIALS)
    tok.name_or_path = "runs/quickstart/base"
    policy = ScriptedPolicy(tok, lambda context, n, sample: "x")
    search = RecordingSearch()
    with pytest.raises(ChatTemplateError, match=r"runs/quickstart/base's chat template .* ignores `tools`"):
        generate_trajectories(EXAMPLES, policy=policy, tokenizer=tok, search=search,
                              settings=make_settings(protocol="tool-call"), sampling=SamplingParams())  # fmt: skip
    assert policy.calls == [] and search.calls == []


def test_a_tiny_model_through_hf_engine_keeps_the_context_and_the_masks(chat) -> None:
    """A real engine (an untrained tiny Qwen2): whatever it writes, the context stays the template's."""
    tool_format, tok = chat
    model = build_tiny_model(tok, hidden=32, layers=1, heads=2, kv_heads=1, ffn=64, seed=0).eval()
    result = generate_trajectories(
        EXAMPLES,
        policy=HFEngine(model, tok),
        tokenizer=tok,
        search=RecordingSearch(),
        settings=make_settings(protocol="tool-call", tool_format=tool_format, max_turns=2),
        sampling=SamplingParams(temperature=1.0, max_new_tokens=12, seed=0),
        group_size=2,
    )
    assert len(result.trajectories) == 4
    for trajectory in result.trajectories:
        assert len(trajectory.loss_mask) == len(trajectory.response_ids) and sum(trajectory.loss_mask) > 0
        assert trajectory.finish in ("answer", "max_turns", "gave_up", "context", "length")
        if len(trajectory.turns) > 1:  # a corrective tool message was inserted, masked out
            assert 0 in trajectory.loss_mask


def test_chat_template_kwargs_reach_every_rendering_and_igpo_measures_after_each_tool_message() -> None:
    # Qwen3's thinking off: the template's empty think block in every prompt the policy sees; and
    # IGPO's gold-answer contexts end where an assistant turn starts (the prompt, then after the
    # tool message and the next assistant header).
    tok = tokenizer(HERMES_TEMPLATE, HERMES_SPECIALS)
    script = [call("hermes", "Belsa founder"), "<answer> Rell </answer>"]
    result, policy, _ = run(tok, "hermes", lambda context, n, sample: script[n], examples=EXAMPLES[:1],
                            max_turns=1, chat_template_kwargs={"enable_thinking": False})  # fmt: skip
    prompts = [tok.decode(calls[0][0], skip_special_tokens=False) for calls in policy.calls]
    assert all(p.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") for p in prompts)
    messages = [{"role": "user", "content": TOOL_CALL_PROMPT.format(question=EXAMPLES[0].question)}]
    assert prompts[0] == tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False,
                                                 enable_thinking=False)  # fmt: skip

    trajectory = result.trajectories[0]
    contexts = [tok.decode(q.context, skip_special_tokens=False) for q in gold_queries([trajectory], tok)]
    assert contexts == prompts and len(contexts) == 2


def test_self_search_writes_its_own_results_masked_and_searches_nothing(chat) -> None:
    # SSRL in the tool format: the call, the results the policy wrote in <tool_response> (out of the
    # loss), the answer, all in one assistant message; the engine is never called. A message that
    # stops after its own results without answering is invalid (a corrective tool message follows).
    tool_format, tok = chat
    own = "<tool_response> Doc 1: Rell founded the Belsa rope works. </tool_response>"
    script = [
        call(tool_format, "Belsa founder") + own,
        call(tool_format, "Belsa founder") + own + " <answer> Rell </answer>",
    ]
    result, policy, search = run(tok, tool_format, lambda context, n, sample: script[n], examples=EXAMPLES[:1],
                                 max_turns=1, template="self-search")  # fmt: skip
    trajectory = result.trajectories[0]
    assert search.calls == [] and [turn.action for turn in trajectory.turns] == ["invalid", "answer"]
    assert trajectory.answer == "Rell" and trajectory.turns[1].self_queries == ["Belsa founder"]
    assert "no answer after its own results" in trajectory.turns[0].call_reasons[-1]
    prompt = tok.decode(policy.calls[0][0][0], skip_special_tokens=False)
    assert TOOL_CALL_SELF_SEARCH_PROMPT.format(question=EXAMPLES[0].question) in prompt
    trained = tok.decode(
        [i for i, m in zip(trajectory.response_ids, trajectory.loss_mask) if m], skip_special_tokens=False
    )
    assert "Rell founded" not in trained and trained.count("<answer> Rell </answer>") == 1
    masked = tok.decode([i for i, m in zip(trajectory.response_ids, trajectory.loss_mask) if not m],
                        skip_special_tokens=False)  # fmt: skip
    assert masked.count("Rell founded the Belsa rope works") == 2

    # With every search real, the same prompt's calls go to the engine as tool messages.
    script = [call(tool_format, "Belsa founder"), "<answer> Rell </answer>"]
    result, _, search = run(tok, tool_format, lambda context, n, sample: script[n], examples=EXAMPLES[:1],
                            max_turns=1, template="self-search", self_search_real_share=1.0)  # fmt: skip
    assert len(search.calls) == 1 and result.trajectories[0].turns[0].call_queries == ["Belsa founder"]
