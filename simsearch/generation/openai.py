"""A `GenerationEngine` backed by OpenAI-compatible servers: `vllm serve`, SGLang.

Completion mode sends many prompts per `POST /v1/completions`; chat mode one conversation per
`POST /v1/chat/completions`. Requests run concurrently over replicas with `simsearch.httpclient`'s
bounded retries; results come back in prompt order. The matched stop string ends `text`; token
ids are the server's when it returns them, else `tokenizer`'s re-tokenization of the text. Every
sampling value is sent (`NEUTRAL_SAMPLING`), so a server's defaults never apply.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import httpx

from simsearch.httpclient import (
    GenerationServiceError,
    ReplicaSet,
    ServerKey,
    redact,
    request_json,
    run_concurrently,
)
from simsearch.types import Completion, FinishReason, SamplingParams

_COMPLETIONS_PATH = "/v1/completions"
_CHAT_PATH = "/v1/chat/completions"

NEUTRAL_SAMPLING: dict[str, float | int] = {
    "top_k": -1,  # off; vLLM and SGLang both read -1 as disabled
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
"""Sent with every request: the filters and penalties our engines do not apply, switched off.

`vllm serve` fills each sampling value a request leaves out from the model's
`generation_config.json` (Qwen2.5-Instruct ships top_k=20, repetition_penalty=1.05), so without them a
served simulator would sample another distribution than the transformers engine, which samples
from temperature and top-p alone."""


class TextTokenizer(Protocol):
    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]: ...


def _server_root(base_url: str) -> str:
    """`http://h:8000/v1/` and `http://h:8000` both name the server root `http://h:8000`."""
    root = base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    if not root.startswith(("http://", "https://")):
        raise ValueError(
            f"OpenAIEngine base URL {base_url!r} must start with http:// or https://, "
            f"e.g. 'http://127.0.0.1:8000' for `vllm serve --port 8000`"
        )
    return root


def _resolve_stop(
    text: str, finish_reason: FinishReason, server_stop: object, stops: list[str], reported: bool
) -> tuple[str, str | None]:
    """The text with its stop string kept, and that stop string (`server_stop`: the server's report)."""
    if finish_reason != "stop":
        return text, None
    if reported:
        if isinstance(server_stop, str) and server_stop:
            if not text.endswith(server_stop):  # the server trimmed it
                text += server_stop
            return text, server_stop
        return text, None
    # The server does not say: the longest stop string the text ends with, if any.
    for stop in sorted(stops, key=len, reverse=True):
        if stop and text.endswith(stop):
            return text, stop
    return text, None


class OpenAIEngine:
    """GenerationEngine over one or more OpenAI-compatible servers (vLLM, SGLang)."""

    def __init__(
        self,
        base_urls: list[str],
        model: str,
        *,
        tokenizer: TextTokenizer | None = None,
        api_key_env: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 1.0,
        max_concurrency: int = 8,
        chat: bool = False,
        system_message: str | None = "",
        max_prompts_per_request: int = 64,
        cooldown_s: float = 10.0,
    ) -> None:
        """Creates the engine; no request is sent until `generate`.

        Args:
            base_urls: Server roots (a trailing `/v1` is accepted); several are replicas of one model.
            model: The served model name.
            tokenizer: Tokenizes the generated text when the server returns no token ids.
            api_key_env: Environment variable holding a Bearer token; None for no authentication.
            chat: Use `/v1/chat/completions` (string prompts).
            system_message: The chat system message; "" sends an empty one, None none.
            cooldown_s: How long a failed replica is avoided.

        Raises:
            ValueError: An empty or malformed URL list, a non-positive bound, or an unset
                `api_key_env` variable.
        """
        if not base_urls:
            raise ValueError("OpenAIEngine needs a base URL, e.g. ['http://127.0.0.1:8000']")
        if max_retries < 0:
            raise ValueError(f"OpenAIEngine max_retries must be >= 0, got {max_retries}")
        if timeout_s <= 0:
            raise ValueError(f"OpenAIEngine timeout_s must be > 0, got {timeout_s}")
        if max_concurrency < 1 or max_prompts_per_request < 1:
            raise ValueError(
                f"OpenAIEngine max_concurrency and max_prompts_per_request must be >= 1, got "
                f"{max_concurrency} and {max_prompts_per_request}"
            )
        self._key = ServerKey.from_env("OpenAIEngine", api_key_env, "API key")
        self.model = model
        self.tokenizer = tokenizer
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_concurrency = max_concurrency
        self.chat = chat
        self.system_message = system_message
        self.max_prompts_per_request = max_prompts_per_request
        self.replicas = ReplicaSet([_server_root(u) for u in base_urls], cooldown_s=cooldown_s)
        limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
        self._client = httpx.Client(limits=limits)

    def __repr__(self) -> str:
        # Never the API key: only the name of the variable that holds it.
        return (
            f"OpenAIEngine(base_urls={self.replicas.base_urls!r}, model={self.model!r}, "
            f"chat={self.chat}, api_key_env={self.api_key_env!r})"
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAIEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def generate(self, prompts: list[list[int]] | list[str], params: SamplingParams) -> list[Completion]:
        """Generates `params.n` completions per prompt, prompt-major (string prompts only in chat mode).

        Raises:
            GenerationServiceError: A request still fails after the bounded retries, or a server
                answers something that is not a completion.
            ValueError: Mixed prompt types, or token-id prompts in chat mode.
        """
        if not prompts:
            return []
        token_prompts = not isinstance(prompts[0], str)
        if any(isinstance(p, str) == token_prompts for p in prompts):
            raise ValueError("OpenAIEngine.generate: prompts must be all strings or all id lists")
        if self.chat:
            if token_prompts:
                raise ValueError(
                    "OpenAIEngine(chat=True) takes string prompts (one user message each); "
                    "use chat=False to send token ids to /v1/completions"
                )
            chunks: list[list[Any]] = [[p] for p in prompts]
        else:
            # Enough requests to fill every concurrency slot, each still carrying many prompts
            # (the server batches them continuously either way).
            size = min(self.max_prompts_per_request, math.ceil(len(prompts) / self.max_concurrency))
            chunks = [prompts[i : i + size] for i in range(0, len(prompts), size)]
        results = run_concurrently(
            lambda chunk: self._generate_chunk(chunk, params, token_prompts),
            chunks,
            self.max_concurrency,
        )
        return [completion for chunk_result in results for completion in chunk_result]

    def _payload(self, chunk: list[Any], params: SamplingParams) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            **NEUTRAL_SAMPLING,
            "n": params.n,
            # vLLM extensions; servers without them (SGLang) ignore unknown fields.
            "include_stop_str_in_output": True,
            "return_token_ids": True,
        }
        if params.stop:
            payload["stop"] = list(params.stop)
        if params.seed is not None:
            payload["seed"] = params.seed
        if self.chat:
            messages = [] if self.system_message is None else [{"role": "system", "content": self.system_message}]
            messages.append({"role": "user", "content": chunk[0]})
            payload["messages"] = messages
            if params.logprobs:
                payload["logprobs"] = True
        else:
            payload["prompt"] = list(chunk)
            if params.logprobs:
                # The number of top alternatives; the sampled token's logprob comes with any
                # value, and 1 is accepted everywhere (SGLang reads 0 as "off").
                payload["logprobs"] = 1
        return payload

    def _generate_chunk(self, chunk: list[Any], params: SamplingParams, token_prompts: bool) -> list[Completion]:
        path = _CHAT_PATH if self.chat else _COMPLETIONS_PATH
        data = request_json(
            self._client,
            "POST",
            self.replicas,
            path=path,
            json_body=self._payload(chunk, params),
            headers=self._key.headers,
            retries=self.max_retries,
            backoff_s=self.backoff_s,
            timeout_s=self.timeout_s,
            error_cls=GenerationServiceError,
            secrets=self._key.secrets,
        )
        expected = len(chunk) * params.n
        choices = data.get("choices")
        if not isinstance(choices, list) or len(choices) != expected:
            got = len(choices) if isinstance(choices, list) else type(choices).__name__
            raise self._malformed(path, f"expected {expected} choices, got {got}", data)
        # Choice i*n + j is prompt i's sample j (OpenAI and vLLM); sort in case of reordering.
        try:
            choices = sorted(choices, key=lambda c: c["index"])
        except (KeyError, TypeError):
            raise self._malformed(path, "choices without an integer 'index'", data) from None
        if [c["index"] for c in choices] != list(range(expected)):
            raise self._malformed(path, f"choice indices are not 0..{expected - 1}", data)
        return [self._completion(path, c, params, token_prompts, data) for c in choices]

    def _completion(
        self,
        path: str,
        choice: dict[str, Any],
        params: SamplingParams,
        token_prompts: bool,
        data: dict[str, Any],
    ) -> Completion:
        if self.chat:
            message = choice.get("message")
            text = message.get("content", "") if isinstance(message, dict) else None
            if isinstance(message, dict) and text is None:
                text = ""  # `content: null`: the model produced no visible text
        else:
            text = choice.get("text")
        if not isinstance(text, str):
            raise self._malformed(path, "a choice without generated text", data)
        finish = choice.get("finish_reason")
        if finish not in ("stop", "length"):
            raise self._malformed(path, f"finish_reason {finish!r} (expected 'stop' or 'length'; aborted?)", data)
        finish_reason: FinishReason = "length" if finish == "length" else "stop"
        stop_key = "stop_reason" if "stop_reason" in choice else "matched_stop"
        reported = stop_key in choice
        text, stop = _resolve_stop(text, finish_reason, choice.get(stop_key), params.stop, reported)

        token_ids = choice.get("token_ids")
        if token_ids is None:
            if self.tokenizer is not None:
                token_ids = self.tokenizer.encode(text, add_special_tokens=False)
            elif token_prompts:
                raise GenerationServiceError(
                    f"{path} on {', '.join(self.replicas.base_urls)} returned no token_ids "
                    f"(vLLM's return_token_ids) and OpenAIEngine has no tokenizer: run a vLLM "
                    f"version that supports return_token_ids, or pass tokenizer= to re-tokenize"
                )
            else:
                token_ids = []

        logprobs = None
        if params.logprobs:
            logprobs = self._logprobs(path, choice, data)
        return Completion(
            token_ids=[int(t) for t in token_ids],
            text=text,
            finish_reason=finish_reason,
            stop=stop,
            logprobs=logprobs,
        )

    def _logprobs(self, path: str, choice: dict[str, Any], data: dict[str, Any]) -> list[float]:
        block: Any = choice.get("logprobs")
        try:
            if self.chat:
                return [float(entry["logprob"]) for entry in block["content"]]
            return [float(x) for x in block["token_logprobs"]]
        except (KeyError, TypeError, ValueError):
            raise self._malformed(path, "logprobs were asked for but not returned", data) from None

    def _malformed(self, path: str, what: str, data: dict[str, Any]) -> GenerationServiceError:
        # `what` and the response may echo the API key: masked everywhere, and before the cut,
        # so no head of it survives.
        secrets = self._key.secrets
        snippet = redact(str(data), secrets)[:300]
        return GenerationServiceError(
            redact(
                f"{path} on {', '.join(self.replicas.base_urls)} (model {self.model!r}) answered "
                f"an unexpected response: {what}. Is it an OpenAI-compatible server? "
                f"Response: {snippet}",
                secrets,
            )
        )
