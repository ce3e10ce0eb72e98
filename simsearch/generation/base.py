"""The one text-generation interface shared by the policy and the simulator."""

from __future__ import annotations

from typing import Protocol

from simsearch.types import Completion, SamplingParams


class GenerationEngine(Protocol):
    """Generates continuations for a batch of prompts in one call.

    Prompts are token-id lists (the policy's rollout works at the token level); engines also
    accept plain strings as a convenience and tokenize them with their own tokenizer. With
    `params.n > 1` the result holds n completions per prompt, prompt-major.
    """

    def generate(self, prompts: list[list[int]] | list[str], params: SamplingParams) -> list[Completion]: ...
