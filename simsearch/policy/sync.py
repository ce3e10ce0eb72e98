"""Weight sync: after every update the rollout engine generates with the policy's new weights.

- vLLM holds its own copy: the trained weights are loaded into it (LoRA merged; under ZeRO-3
  gathered a module at a time, on every process, with no unpartitioned copy kept), which also
  resets its prefix cache.
- The in-process `HFEngine` over the trained module shares its weights, but the KV caches it keeps
  for prefix reuse were computed with the old ones: they are dropped.
- Under ZeRO-3 the `HFEngine` runs on an unpartitioned copy (processes generate different lengths;
  a partitioned model would need all of them in every forward): the trained parameters are
  gathered into it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from simsearch.generation.vllm import trained_params_for_vllm


@dataclass
class RolloutWeights:
    """The rollout engine and where its weights come from.

    Attributes:
        generator: The rollout engine (`HFEngine` or the in-process vLLM engine).
        trained: The trained module (unwrapped).
        vllm: `generator` is vLLM, which holds its own weights.
        lora: `trained` is a PEFT model (vLLM gets the merged weights).
        zero3: The trained parameters are partitioned (ZeRO-3).
        copy: The unpartitioned copy the `HFEngine` runs on under ZeRO-3, else None.
    """

    generator: Any
    trained: Any
    vllm: bool
    lora: bool
    zero3: bool
    copy: Any | None = None


def sync_rollout_weights(weights: RolloutWeights) -> None:
    """Makes the rollout engine generate with the latest trained weights (every process calls it)."""
    if weights.vllm:
        weights.generator.sync_weights(trained_params_for_vllm(weights.trained, lora=weights.lora, zero3=weights.zero3))
        return
    weights.generator.reset_prefix_cache()
    if weights.copy is None:
        return
    import deepspeed

    named = [(n, p) for n, p in weights.trained.named_parameters() if p.requires_grad]
    targets = dict(weights.copy.named_parameters())
    with deepspeed.zero.GatheredParameters([p for _, p in named], modifier_rank=None), torch.no_grad():
        for name, param in named:
            targets[name].copy_(param.data)
