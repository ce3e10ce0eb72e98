"""OpenAIEngine against a fake OpenAI-compatible server (vLLM's fields) on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from simsearch.generation.openai import OpenAIEngine
from simsearch.httpclient import GenerationServiceError
from simsearch.types import SamplingParams
from tests.servers import (  # the `serve` fixture is in conftest.py
    DROP,
    FakeServer,
    Seen,
    dead_url,
)

# --- a deterministic OpenAI-compatible fake


def prompt_key(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else "ids" + "-".join(map(str, prompt))


def server_token_ids(text: str) -> list[int]:
    # Distinct from FakeTokenizer's ids, so tests can tell which path produced them.
    return [1000 + b for b in text.encode()]


class FakeTokenizer:
    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        assert add_special_tokens is False
        return list(text.encode())


class FakeOpenAI:
    """Answers /v1/completions and /v1/chat/completions like vLLM, with switchable quirks.

    Sample j of a prompt is `{key}#{j}` followed by the request's first stop string
    (finish "stop"), or cut to `max_tokens` characters when that is shorter (finish "length").
    """

    def __init__(
        self,
        *,
        token_ids: bool = True,
        stop_field: str | None = "stop_reason",
        trim_stop: bool = False,
        reverse: bool = False,
        delay_s: float = 0.0,
        fail: Callable[[int], Any] | None = None,
        wrong_count: bool = False,
    ) -> None:
        self.token_ids = token_ids
        self.stop_field = stop_field
        self.trim_stop = trim_stop
        self.reverse = reverse
        self.delay_s = delay_s
        self.fail = fail  # fail(request_number) -> a reply to send instead, or None
        self.wrong_count = wrong_count
        self.count = 0
        self.ok = 0
        self.lock = threading.Lock()

    def sample(self, key: str, j: int, body: dict[str, Any]) -> dict[str, Any]:
        stops = body.get("stop") or []
        text = f"{key}#{j}"
        finish, stop = "stop", None
        if len(text) > body["max_tokens"]:
            text, finish = text[: body["max_tokens"]], "length"
        elif stops:
            stop = stops[0]
            if body.get("include_stop_str_in_output") and not self.trim_stop:
                text += stop
        choice: dict[str, Any] = {"finish_reason": finish}
        if self.stop_field is not None:
            choice[self.stop_field] = stop
        if self.token_ids and body.get("return_token_ids"):
            choice["token_ids"] = server_token_ids(text)
        n_tokens = len(text.encode())
        if body.get("logprobs"):
            values = [-1.0 / (k + 1) for k in range(n_tokens)]
            if "messages" in body:
                choice["logprobs"] = {"content": [{"token": "t", "logprob": v} for v in values]}
            else:
                choice["logprobs"] = {"tokens": ["t"] * n_tokens, "token_logprobs": values}
        if "messages" in body:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return choice

    def __call__(self, seen: Seen) -> Any:
        with self.lock:
            self.count += 1
            number = self.count
        if self.fail is not None:
            answer = self.fail(number)
            if answer is not None:
                return answer
        time.sleep(self.delay_s)
        body = seen.json()
        prompts = [body["messages"][-1]["content"]] if "messages" in body else body["prompt"]
        choices = []
        for prompt in prompts:
            for j in range(body["n"]):
                choice = self.sample(prompt_key(prompt), j, body)
                choices.append({"index": len(choices), **choice})
        if self.wrong_count:
            choices = choices[:-1]
        if self.reverse:
            choices.reverse()
        with self.lock:
            self.ok += 1
        return 200, {"id": "cmpl-1", "object": "text_completion", "choices": choices}, {}


def engine(urls: list[str], **kwargs: Any) -> OpenAIEngine:
    kwargs.setdefault("backoff_s", 0.001)
    kwargs.setdefault("timeout_s", 2.0)
    return OpenAIEngine(urls, "fake-model", **kwargs)


# --- request/response mapping


def test_completions_with_token_prompts_map_every_field(serve):
    fake = FakeOpenAI()
    server = serve(fake)
    params = SamplingParams(
        temperature=0.7,
        top_p=0.9,
        max_new_tokens=50,
        stop=["</search>", "</answer>"],
        n=2,
        seed=7,
        logprobs=True,
    )
    with engine([server.url], max_concurrency=1) as gen:  # one request for the whole batch
        out = gen.generate([[1, 2], [3], [4, 5, 6]], params)

    body = server.seen[0].json()
    assert server.seen[0].path == "/v1/completions"
    assert body["model"] == "fake-model" and body["prompt"] == [[1, 2], [3], [4, 5, 6]]
    assert (body["max_tokens"], body["temperature"], body["top_p"]) == (50, 0.7, 0.9)
    assert (body["n"], body["seed"], body["logprobs"]) == (2, 7, 1)
    assert body["stop"] == ["</search>", "</answer>"]
    assert body["include_stop_str_in_output"] is True and body["return_token_ids"] is True

    assert [c.text for c in out] == [
        "ids1-2#0</search>",
        "ids1-2#1</search>",
        "ids3#0</search>",
        "ids3#1</search>",
        "ids4-5-6#0</search>",
        "ids4-5-6#1</search>",
    ]
    first = out[0]
    assert first.finish_reason == "stop" and first.stop == "</search>"
    assert first.token_ids == server_token_ids("ids1-2#0</search>")
    assert first.logprobs == pytest.approx([-1.0 / (k + 1) for k in range(17)])


# The values `vllm serve` (0.32-0.33, `ModelConfig.get_diff_sampling_param`) takes from the model's
# generation_config.json for each one a request leaves out (max_new_tokens: we always send max_tokens).
GENERATION_CONFIG_SAMPLING = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
)


@pytest.mark.parametrize("chat", [False, True])
def test_every_sampling_value_is_sent_so_a_served_models_generation_config_never_applies(serve, chat):
    server = serve(FakeOpenAI())
    with engine([server.url], chat=chat) as gen:
        gen.generate(["q"], SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=5))
    body = server.seen[0].json()
    assert {key: body[key] for key in GENERATION_CONFIG_SAMPLING} == {
        "repetition_penalty": 1.0,  # off
        "presence_penalty": 0.0,  # off
        "frequency_penalty": 0.0,  # off
        "temperature": 0.7,
        "top_k": -1,  # off (vLLM and SGLang)
        "top_p": 0.9,
        "min_p": 0.0,  # off
    }
    assert body["max_tokens"] == 5


def test_batch_is_split_sent_concurrently_and_reassembled_in_order(serve):
    fake = FakeOpenAI(reverse=True, delay_s=0.15)
    server = serve(fake)
    prompts = [f"q{i}" for i in range(10)]
    with engine([server.url], max_concurrency=3, max_prompts_per_request=2) as gen:
        out = gen.generate(prompts, SamplingParams(max_new_tokens=20))
    # ceil(10 / 3) = 4 prompts per request, capped at 2 -> 5 requests of 2 prompts.
    assert len(server.seen) == 5
    assert all(len(s.json()["prompt"]) == 2 for s in server.seen)
    assert [c.text for c in out] == [f"q{i}#0" for i in range(10)]
    assert 2 <= server.max_in_flight <= 3


def test_stop_string_found_at_the_end_when_the_server_does_not_report_it(serve):
    server = serve(FakeOpenAI(stop_field=None))
    with engine([server.url]) as gen:
        stopped = gen.generate(["abc"], SamplingParams(max_new_tokens=50, stop=["</answer>"]))
        cut = gen.generate(["abcdefgh"], SamplingParams(max_new_tokens=4, stop=["</answer>"]))
    assert (stopped[0].text, stopped[0].stop) == ("abc#0</answer>", "</answer>")
    assert (cut[0].text, cut[0].finish_reason, cut[0].stop) == ("abcd", "length", None)


def test_a_trimmed_stop_string_is_put_back(serve):
    # SGLang-style: reports `matched_stop` but strips the stop string from the text.
    server = serve(FakeOpenAI(stop_field="matched_stop", trim_stop=True, token_ids=False))
    with engine([server.url], tokenizer=FakeTokenizer()) as gen:
        out = gen.generate(["abc"], SamplingParams(max_new_tokens=50, stop=["</search>"]))
    assert (out[0].text, out[0].stop) == ("abc#0</search>", "</search>")
    assert out[0].token_ids == list(b"abc#0</search>")


def test_token_ids_fall_back_to_the_tokenizer_or_fail_clearly(serve):
    server = serve(FakeOpenAI(token_ids=False))
    params = SamplingParams(max_new_tokens=50)
    with engine([server.url], tokenizer=FakeTokenizer()) as gen:
        assert gen.generate([[9]], params)[0].token_ids == list(b"ids9#0")
    with engine([server.url]) as gen:
        assert gen.generate(["text prompt"], params)[0].token_ids == []
        with pytest.raises(GenerationServiceError, match=r"return_token_ids.*tokenizer="):
            gen.generate([[9]], params)


def test_chat_mode_sends_one_conversation_per_prompt(serve):
    fake = FakeOpenAI()
    server = serve(fake)
    params = SamplingParams(max_new_tokens=50, n=2, logprobs=True, stop=["\n\n"])
    with engine([server.url], chat=True) as gen:
        out = gen.generate(["first", "second"], params)
    assert len(server.seen) == 2
    assert {s.path for s in server.seen} == {"/v1/chat/completions"}
    bodies = sorted((s.json() for s in server.seen), key=lambda b: b["messages"][-1]["content"])
    assert bodies[0]["messages"] == [
        {"role": "system", "content": ""},
        {"role": "user", "content": "first"},
    ]
    assert bodies[0]["logprobs"] is True and bodies[0]["n"] == 2
    assert [c.text for c in out] == ["first#0\n\n", "first#1\n\n", "second#0\n\n", "second#1\n\n"]
    assert out[0].logprobs == pytest.approx([-1.0 / (k + 1) for k in range(9)])

    with engine([server.url], chat=True, system_message=None) as gen:
        gen.generate(["third"], SamplingParams(max_new_tokens=50))
    assert server.seen[-1].json()["messages"] == [{"role": "user", "content": "third"}]


def test_chat_mode_rejects_token_prompts_and_mixed_prompts_are_rejected():
    with engine(["http://127.0.0.1:1"], chat=True) as gen:
        with pytest.raises(ValueError, match="string prompts"):
            gen.generate([[1, 2]], SamplingParams())
        with pytest.raises(ValueError, match="all strings"):
            gen.generate(["a", [1]], SamplingParams())  # type: ignore[list-item]


def test_base_url_with_v1_suffix_is_accepted(serve):
    server = serve(FakeOpenAI())
    with engine([server.url + "/v1/"]) as gen:
        assert gen.generate(["x"], SamplingParams(max_new_tokens=9))[0].text == "x#0"
    assert server.seen[0].path == "/v1/completions"
    with pytest.raises(ValueError, match="http://"):
        engine(["127.0.0.1:8000"])


def test_wrong_number_of_choices_is_a_clear_error(serve):
    server = serve(FakeOpenAI(wrong_count=True))
    with (
        engine([server.url], max_retries=3, max_concurrency=1) as gen,
        pytest.raises(GenerationServiceError, match="expected 2 choices, got 1"),
    ):
        gen.generate(["a", "b"], SamplingParams(max_new_tokens=9))
    assert len(server.seen) == 1  # a well-formed but wrong answer is not retried


# --- failures: bounded, fast, clear


def test_injected_500s_are_retried_within_the_bound(serve):
    fake = FakeOpenAI(fail=lambda n: (500, b"boom", {}) if n <= 2 else None)
    server = serve(fake)
    with engine([server.url], max_retries=3) as gen:
        assert gen.generate(["a"], SamplingParams(max_new_tokens=9))[0].text == "a#0"
    assert len(server.seen) == 3


def test_persistent_500s_give_a_clear_error_after_bounded_retries(serve):
    server = serve(FakeOpenAI(fail=lambda n: (500, b"CUDA out of memory", {})))
    start = time.monotonic()
    with engine([server.url], max_retries=2) as gen, pytest.raises(GenerationServiceError) as info:
        gen.generate(["a"], SamplingParams(max_new_tokens=9))
    # the retries are bounded by their count (3 attempts, asserted below); 0.001 s backoffs take no time,
    # so the generous bound only catches a retry loop that sleeps or hangs
    assert time.monotonic() - start < 10.0
    assert len(server.seen) == 3
    message = str(info.value)
    assert "/v1/completions" in message and server.url in message
    assert "3 attempt(s)" in message and "CUDA out of memory" in message


def test_slow_server_times_out_and_the_error_says_so(serve):
    server = serve(FakeOpenAI(delay_s=5.0))
    start = time.monotonic()
    with (
        engine([server.url], timeout_s=0.2, max_retries=1) as gen,
        pytest.raises(GenerationServiceError, match="ReadTimeout"),
    ):
        gen.generate(["a"], SamplingParams(max_new_tokens=9))
    # two 0.2 s timeouts (0.4 s), 10x under the bound for a loaded machine; waiting for the server's
    # answer even once would take 5 s
    assert time.monotonic() - start < 4.0
    assert len(server.seen) == 2


def test_malformed_json_is_retried_then_reported(serve):
    server = serve(FakeOpenAI(fail=lambda n: (200, b'{"choices": [', {})))
    with engine([server.url], max_retries=2) as gen, pytest.raises(GenerationServiceError, match="malformed JSON"):
        gen.generate(["a"], SamplingParams(max_new_tokens=9))
    assert len(server.seen) == 3


def test_dead_port_fails_fast_naming_the_url():
    url = dead_url()
    start = time.monotonic()
    with engine([url], max_retries=2, timeout_s=30.0) as gen, pytest.raises(GenerationServiceError) as info:
        gen.generate([[1]], SamplingParams())
    assert time.monotonic() - start < 10.0  # a refused connection is not waited on: far under one 30 s timeout
    assert url in str(info.value) and "ConnectError" in str(info.value)


def test_replica_killed_mid_run_fails_over_without_losing_or_repeating_work(serve):
    die_after = 2
    servers: dict[str, FakeServer] = {}

    def dying(n: int) -> Any:
        if n <= die_after:
            return None
        # The replica crashes: this request gets no answer and the port closes.
        threading.Thread(target=servers["a"].stop).start()
        return DROP

    fake_a, fake_b = FakeOpenAI(fail=dying, delay_s=0.02), FakeOpenAI(delay_s=0.02)
    servers["a"], servers["b"] = serve(fake_a), serve(fake_b)
    prompts = [f"p{i}" for i in range(12)]
    with engine(
        [servers["a"].url, servers["b"].url],
        max_concurrency=2,
        max_prompts_per_request=1,
        max_retries=2,
        cooldown_s=30.0,
    ) as gen:
        out = gen.generate(prompts, SamplingParams(max_new_tokens=9))
        assert [c.text for c in out] == [f"p{i}#0" for i in range(12)]
        # Every request answered exactly once: a's first two, b the rest (retries included).
        assert fake_a.count > die_after  # a did crash during the run
        assert fake_a.ok == die_after and fake_b.ok == 12 - die_after
        assert gen.replicas.healthy() == [servers["b"].url]

        more = gen.generate(["x", "y"], SamplingParams(max_new_tokens=9))
        assert [c.text for c in more] == ["x#0", "y#0"]
        assert fake_b.ok == 12 - die_after + 2


def test_all_replicas_down_is_a_clear_error():
    urls = [dead_url(), dead_url()]
    with engine(urls, max_retries=3) as gen, pytest.raises(GenerationServiceError) as info:
        gen.generate(["a"], SamplingParams())
    assert all(u in str(info.value) for u in urls) and "4 attempt(s)" in str(info.value)


# --- API key


def test_api_key_comes_from_the_environment_and_never_leaks(serve, monkeypatch):
    monkeypatch.setenv("TEST_VLLM_KEY", "sk-very-secret")
    ok = serve(FakeOpenAI())
    with engine([ok.url], api_key_env="TEST_VLLM_KEY") as gen:
        gen.generate(["a"], SamplingParams(max_new_tokens=9))
        assert "sk-very-secret" not in repr(gen) and "TEST_VLLM_KEY" in repr(gen)
    assert ok.seen[0].headers["authorization"] == "Bearer sk-very-secret"

    # A server that echoes the credentials in its error body.
    echo = serve(lambda seen: (401, seen.headers["authorization"].encode(), {}))
    with engine([echo.url], api_key_env="TEST_VLLM_KEY") as gen, pytest.raises(GenerationServiceError) as info:
        gen.generate(["a"], SamplingParams())
    assert "sk-very-secret" not in str(info.value) and "HTTP 401" in str(info.value)

    monkeypatch.delenv("TEST_VLLM_KEY")
    with pytest.raises(ValueError, match="TEST_VLLM_KEY"):
        engine([ok.url], api_key_env="TEST_VLLM_KEY")
