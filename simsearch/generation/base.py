"""The one text-generation interface shared by the policy and the simulator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from simsearch.types import Completion, SamplingParams


class GenerationEngine(Protocol):
    """Generates continuations for a batch of prompts in one call.

    Prompts are token-id lists, or strings the engine tokenizes. With `params.n > 1` the result
    holds n completions per prompt, prompt-major. Every engine keeps this `Completion` contract:

    - `token_ids` are the sampled ids; a stop string ends `text`, and `token_ids` run up to and
      including the token that completed it;
    - an end-of-sequence token ends a sequence with `finish_reason="stop"`, `stop=None`; it is
      kept in `token_ids` and left out of `text`;
    - logprobs are the sampled tokens' log-probabilities under the raw distribution (temperature
      1, no top-p).
    """

    def generate(self, prompts: list[list[int]] | list[str], params: SamplingParams) -> list[Completion]: ...


def prompt_token_ids(tokenizer: Callable[[list[str]], Any], prompts: list[list[int]] | list[str]) -> list[list[int]]:
    """The prompts as token ids: strings tokenized by `tokenizer` (a Hugging Face tokenizer), id lists copied.

    Raises:
        ValueError: A prompt has no token; the message names its index.
    """
    if prompts and isinstance(prompts[0], str):
        prompt_ids = tokenizer(list(prompts))["input_ids"]
    else:
        prompt_ids = [list(p) for p in prompts]
    for i, ids in enumerate(prompt_ids):
        if not ids:
            raise ValueError(f"prompt {i} is empty; give the model at least one token")
    return prompt_ids
