"""Test doubles for `simsearch train` whose behaviour depends on no float: a scripted agent and a
search recorder.

With `ScriptedAgent` in place of the policy's rollout engine, what a training run asks of its
search engine (queries, noisy counts), the tokens it trains on, its masks and rewards are the
same on every CPU: they follow from the seeds, the data and the wiring, not from the weights'
last bits. `install` puts both doubles into a run made through the CLI or `train.main`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from simsearch.factory import build
from simsearch.factory import train as rl
from simsearch.generation.base import prompt_token_ids
from simsearch.policy import step as steps
from simsearch.types import Completion, SamplingParams, SearchRequest, Trajectory

COLORS = ("red", "blue")
ITEM = re.compile(r"What color is item (\d+)\?")


@dataclass
class ScriptedAgent:
    """A policy engine that searches `item N color`, then answers a color a hash of its inputs picks.

    Each completion is a pure function of (the sampling seed, the prompt's tokens, its place in
    the batch, the sample index): a new search while fewer than `searches` results came back (a
    hash may add one more), then `<answer> red|blue </answer>`. Stop strings and
    `max_new_tokens` are applied as a real engine applies them.
    """

    tokenizer: Any
    searches: int = 1
    calls: int = 0

    def generate(self, prompts: list[list[int]] | list[str], params: SamplingParams) -> list[Completion]:
        self.calls += 1
        out = []
        for index, ids in enumerate(prompt_token_ids(self.tokenizer, prompts)):
            context = self.tokenizer.decode(ids, skip_special_tokens=False)
            for sample in range(params.n):
                coin = hashlib.sha256(f"{params.seed}:{index}:{sample}:{ids}".encode()).digest()
                out.append(self._complete(self._turn(context, coin), params))
        return out

    def reset_prefix_cache(self) -> None:
        """Nothing is cached."""

    def _turn(self, context: str, coin: bytes) -> str:
        results = context.count("</information>") - context.count("<information> and </information>")
        items = ITEM.findall(context)
        query = f"item {items[-1]} color" if items else "item color"
        if results < self.searches + coin[0] % 2:
            return f"<think> look </think>\n<search> {query} </search>"
        return f"<think> ok </think>\n<answer> {COLORS[coin[1] % 2]} </answer>"

    def _complete(self, text: str, params: SamplingParams) -> Completion:
        hits = sorted((text.find(s) + len(s), s) for s in params.stop if s in text)
        stop = None
        if hits:
            end, stop = hits[0]
            text = text[:end]
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) > params.max_new_tokens:
            ids = ids[: params.max_new_tokens]
            return Completion(ids, self.tokenizer.decode(ids, skip_special_tokens=False), "length")
        logprobs = [-1.0] * len(ids) if params.logprobs else None
        return Completion(ids, text, "stop", stop, logprobs)


@dataclass
class SearchLog:
    """Every search request a run made, by training step, and the kinds of engine built."""

    built: list[str] = field(default_factory=list)
    step: int = -1  # the training step in flight; -1 outside a rollout round (validation)
    requests: dict[int, list[list[SearchRequest]]] = field(default_factory=dict)
    trajectories: dict[int, list[Trajectory]] = field(default_factory=dict)  # every round's, by step

    def calls(self, step: int) -> list[SearchRequest]:
        """The step's requests, every call's flattened in order."""
        return [request for call in self.requests.get(step, []) for request in call]


@dataclass
class RecordingEngine:
    """A SearchEngine that notes each batch of requests in its `SearchLog`, then asks `engine`."""

    engine: Any
    log: SearchLog

    def search(self, requests: list[SearchRequest]) -> list[Any]:
        self.log.requests.setdefault(self.log.step, []).append(list(requests))
        return self.engine.search(requests)


def install(monkeypatch: pytest.MonkeyPatch, *, searches: int = 1) -> SearchLog:
    """The scripted agent as every run's rollout engine; every search engine built is recorded."""
    log = SearchLog()
    monkeypatch.setattr(rl, "HFEngine", lambda module, tokenizer, **_: ScriptedAgent(tokenizer, searches))
    for kind, builder in list(build.SEARCH_ENGINES.items()):

        def recorded(cfg: Any, seed: int, kind: str = kind, builder: Any = builder) -> Any:
            log.built.append(kind)
            engine = builder(cfg, seed)
            return None if engine is None else RecordingEngine(engine, log)

        monkeypatch.setitem(build.SEARCH_ENGINES, kind, recorded)
    rollout_round = steps.rollout_round

    def tagged(r: Any, p_noise: float, step: int, *args: Any, **kwargs: Any) -> Any:
        log.step = step
        try:
            result = rollout_round(r, p_noise, step, *args, **kwargs)
            log.trajectories.setdefault(step, []).extend(result.trajectories)
            return result
        finally:
            log.step = -1

    monkeypatch.setattr(steps, "rollout_round", tagged)
    return log
