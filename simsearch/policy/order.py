"""The order a run visits its questions in: seeded epochs, an endless stream, each process's share."""

from __future__ import annotations

import random


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The permutation of `n` examples that epoch `epoch` visits, seeded by (seed, epoch)."""
    order = list(range(n))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def stream_indices(n: int, start: int, count: int, seed: int) -> list[int]:
    """Example indices at positions [start, start + count) of an endless stream of epochs.

    Position p is example `epoch_order(n, seed, p // n)[p % n]`, so a run that saved its
    position resumes the exact same order, across epoch boundaries too.

    Args:
        n: Number of examples (> 0).
        start: First stream position (>= 0).
        count: How many positions.
        seed: The run's seed.

    Returns:
        `count` indices into the example list.
    """
    if n < 1 or start < 0 or count < 0:
        raise ValueError(f"stream_indices needs n >= 1, start >= 0, count >= 0; got {n}, {start}, {count}")
    orders: dict[int, list[int]] = {}
    out = []
    for position in range(start, start + count):
        epoch = position // n
        if epoch not in orders:
            orders[epoch] = epoch_order(n, seed, epoch)
        out.append(orders[epoch][position % n])
    return out


def rank_share(count: int, rank: int, world_size: int) -> slice:
    """The contiguous share of `count` items that rank `rank` of `world_size` takes.

    Raises:
        ValueError: `count` is not a multiple of `world_size` (ranks must hold equal shares:
            DeepSpeed steps every rank through the same number of forward passes).
    """
    if count % world_size:
        raise ValueError(
            f"{count} prompts per step cannot be split evenly over {world_size} processes; set "
            f"prompts_per_step to a multiple of {world_size}"
        )
    size = count // world_size
    return slice(rank * size, (rank + 1) * size)
