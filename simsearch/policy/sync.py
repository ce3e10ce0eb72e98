"""Weight sync: after every update the rollout engine generates with the policy's new weights.

- vLLM holds its own copy: the trained weights are loaded into it (LoRA merged; under ZeRO-3
  gathered a module at a time, on every process, with no unpartitioned copy kept), which also
  resets its prefix cache.
- The in-process `HFEngine` over the trained module shares its weights, but the KV caches it keeps
  for prefix reuse were computed with the old ones: they are dropped.
- Under ZeRO-3 the `HFEngine` runs on an unpartitioned copy (processes generate different lengths;
  a partitioned model would need all of them in every forward): the trained parameters are
  gathered into it a module at a time, so the peak is the copy plus one module's parameters (a
  whole-model gather would hold a second full copy for the sync).
- Under ZeRO-3 the export is collective: a process that fails while loading (vLLM refusing a
  tensor, memory running out) goes on through the remaining gathers loading nothing, then every
  process learns of the failure and raises (`training.distributed.collective_export`), instead of
  the others waiting in the next gather for a process that has left.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from simsearch.generation.vllm import trained_params_for_vllm
from simsearch.training.distributed import collective_export


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
    """Makes the rollout engine generate with the latest trained weights (every process calls it).

    Raises:
        simsearch.training.distributed.FailedElsewhereError: under ZeRO-3, another process failed
            in the export (it raises its own error).
    """
    world = dist.get_world_size() if weights.zero3 and dist.is_initialized() else 1
    if weights.vllm:
        pairs = trained_params_for_vllm(weights.trained, lora=weights.lora, zero3=weights.zero3)
        collective_export(pairs, weights.generator.sync_weights, world, what="the weight sync to vLLM")
        return
    weights.generator.reset_prefix_cache()
    if weights.copy is None:
        return
    targets = dict(weights.copy.named_parameters())

    def copy_in(pairs: Iterator[tuple[str, torch.Tensor]]) -> None:
        with torch.no_grad():
            for name, tensor in pairs:
                targets[name].copy_(tensor)

    gathered = trainable_zero3_params(weights.trained)
    collective_export(gathered, copy_in, world, what="the weight sync to the rollout copy")


def trainable_zero3_params(model: torch.nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, full tensor) of each trainable parameter of a ZeRO-3 model, gathered one module at a time.

    Each tensor is valid until the next is requested. Collective: every rank must iterate to the end.
    """
    import deepspeed

    seen: set[int] = set()
    for module_name, module in model.named_modules():
        own = [(n, p) for n, p in module.named_parameters(recurse=False) if p.requires_grad and id(p) not in seen]
        if not own:
            continue
        seen.update(id(p) for _, p in own)
        with deepspeed.zero.GatheredParameters([p for _, p in own], modifier_rank=None):
            for name, param in own:
                yield (f"{module_name}.{name}" if module_name else name), param.data
