"""verl's search tool against `simsearch serve`: a `BaseTool` sending each sample's question,
gold answers and the training step with its query, so the server's curriculum and the ZeroSearch
presets work inside an upstream verl run. Importable only where verl is installed.

verl's tool agent loop calls `create(create_kwargs=row["extra_info"]["tools_kwargs"]["search"]
["create_kwargs"])`, `execute(instance_id, arguments, agent_data=...)` and `release(instance_id)`
for every call. verl hands a tool no training step: the tool reads the one verl's rollout tracing
keeps for each trajectory (set when `actor_rollout_ref.rollout.trace.backend` is set), else it
sends none and the server counts searches against its declared total (docs/integrations.md).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, fields
from typing import Any
from uuid import uuid4

import httpx
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils import rollout_trace

from simsearch.data.chat import search_tool_schema
from simsearch.data.rendering import RENDER_STYLES
from simsearch.httpclient import SearchServiceError, bearer_headers, post_json
from simsearch.integrations.search_client import SampleContext, render_answer, retrieve_body


@dataclass(frozen=True)
class SimulatorToolConfig:
    """The tool's `config` block in verl's tool-config YAML."""

    retrieval_service_url: str = "http://127.0.0.1:8000/retrieve"  # `simsearch serve`'s /retrieve
    topk: int = 3  # documents per search
    timeout_s: float = 120.0  # per attempt (a simulator writes its documents: seconds, not ms)
    max_retries: int = 3  # bounded retries on connection errors and 5xx
    client: str = ""  # this run's name on the server: its own curriculum place and usage line ("" = none)
    token_env: str = ""  # environment variable holding the server's bearer token ("" = none)
    rendering: str = "search-r1"  # how the documents are shown (data.rendering.RENDER_STYLES)
    report_step: bool = True  # send the training step verl's rollout tracing holds, when it holds one

    @classmethod
    def from_verl(cls, config: dict[str, Any]) -> SimulatorToolConfig:
        """From the YAML `config` dict (verl's own `type` key is left to verl).

        Raises:
            ValueError: An unknown key or an invalid value, naming it and the fix.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known - {"type"})
        if unknown:
            raise ValueError(f"simsearch verl tool: unknown config key(s) {unknown}; known: {sorted(known)}")
        settings = cls(**{k: v for k, v in config.items() if k in known})
        if settings.topk < 1:
            raise ValueError(f"simsearch verl tool: topk={settings.topk} must be >= 1")
        if settings.rendering not in RENDER_STYLES:
            raise ValueError(f"simsearch verl tool: rendering={settings.rendering!r} is not one of {RENDER_STYLES}")
        return settings


def training_step() -> int | None:
    """The training step of the trajectory being rolled out, from verl's rollout-trace attributes; None if unset."""
    step = (rollout_trace._trace_attributes.get() or {}).get("step")
    return int(step) if step is not None and int(step) >= 0 else None


class SimulatedSearchTool(BaseTool):
    """One search per call against `simsearch serve`, with the sample's question, answers and step.

    Returns the rendered documents, reward 0, and metrics `p_noise` and `step` where the server's
    curriculum chose the noise.
    """

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        schema = tool_schema or OpenAIFunctionToolSchema.model_validate(search_tool_schema())
        super().__init__(config, schema)
        self.settings = SimulatorToolConfig.from_verl(config)
        token = os.environ.get(self.settings.token_env, "") if self.settings.token_env else ""
        if self.settings.token_env and not token:
            raise ValueError(f"simsearch verl tool: token_env={self.settings.token_env!r} is empty or unset")
        self._token = token
        self._http = httpx.Client()
        self._samples: dict[str, SampleContext] = {}

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Keeps the sample's `question` / `golden_answers` (verl passes them as `create_kwargs`)."""
        instance_id = instance_id or uuid4().hex
        self._samples[instance_id] = SampleContext.from_kwargs(kwargs.get("create_kwargs", kwargs))
        return instance_id, ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        """Searches `parameters["query"]` (or each of `query_list`) and returns the rendered documents."""
        queries = parameters.get("query_list") or [parameters.get("query")]
        if not all(isinstance(q, str) and q.strip() for q in queries):
            return ToolResponse(text="The search tool needs a non-empty string 'query'."), 0.0, {}
        settings = self.settings
        body = retrieve_body(
            queries,
            topk=settings.topk,
            context=self._samples.get(instance_id, SampleContext()),
            step=training_step() if settings.report_step else None,
            client=settings.client,
        )
        answer = await asyncio.to_thread(self._post, body)
        metrics = {key: answer[key] for key in ("p_noise", "step") if key in answer}
        return ToolResponse(text=render_answer(answer, settings.rendering)), 0.0, metrics

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        return post_json(
            self._http,
            self.settings.retrieval_service_url,
            body,
            retries=self.settings.max_retries,
            backoff_s=1.0,
            timeout_s=self.settings.timeout_s,
            headers=bearer_headers(self._token or None),
            error_cls=SearchServiceError,
            secrets=[self._token] if self._token else [],
        )

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._samples.pop(instance_id, None)
