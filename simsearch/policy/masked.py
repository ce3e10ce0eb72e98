"""Reductions over the positions a mask selects, shared by the advantages and the losses.

Masked positions are selected away with `torch.where`, never multiplied by 0, so NaN or inf
there reaches neither the result nor its gradient.
"""

from __future__ import annotations

import torch

Stats = dict[str, torch.Tensor]
"""A short name -> a detached 0-d tensor."""

WHITEN_EPS = 1e-8  # inside the square root of `masked_whiten`


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `x` over positions where `mask` is non-zero.

    Masked positions are selected away (not multiplied by 0), so NaN or inf there cannot leak
    into the result or its gradient.

    Args:
        x: values, any shape.
        mask: same shape as `x`; bool or 0/1 numbers.
        dim: dimension to reduce; None reduces everything to a scalar.

    Returns:
        The masked sum (scalar if `dim` is None).
    """
    _check_same_shape(x, mask, "x", "mask")
    selected = torch.where(mask.bool(), x, torch.zeros_like(x))
    return selected.sum() if dim is None else selected.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over positions where `mask` is non-zero.

    Where nothing is selected the mean is 0 (not NaN), with a finite zero gradient.

    Args:
        x: values, any shape.
        mask: same shape as `x`; bool or 0/1 numbers.
        dim: dimension to reduce; None reduces everything to a scalar.

    Returns:
        The masked mean (scalar if `dim` is None).
    """
    total = masked_sum(x, mask, dim)
    count = mask.bool().to(total.dtype)
    count = count.sum() if dim is None else count.sum(dim=dim)
    # a safe denominator rather than where(count > 0, total / count, 0): the discarded branch
    # would still put NaN into the backward pass
    return total / torch.where(count > 0, count, torch.ones_like(count))


def masked_var(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased (Bessel-corrected) variance of `x` over all positions where `mask` is non-zero.

    Args:
        x: values, any shape.
        mask: same shape as `x`; bool or 0/1 numbers; at least two positions selected.

    Returns:
        A scalar tensor.

    Raises:
        ValueError: fewer than two positions are selected (the unbiased variance is undefined).
    """
    count = int(mask.bool().sum().item())
    if count < 2:
        raise ValueError(
            f"masked_var needs at least 2 valid positions, got {count}: the batch has too few "
            "valid (mask 1) tokens to normalize over; use a larger batch."
        )
    mean = masked_mean(x, mask)
    return masked_sum((x - mean) ** 2, mask) / (count - 1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Normalize `x` to mean 0 and unit (unbiased) variance over the valid positions.

    Computes (x - mean) * rsqrt(var + 1e-8) with mean and var taken over every valid position of
    the whole tensor (not per row), as verl's `masked_whiten` does. Masked positions come back 0.

    Args:
        x: values, any shape.
        mask: same shape as `x`; bool or 0/1 numbers; at least two positions selected.

    Returns:
        Tensor shaped like `x`.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + WHITEN_EPS)
    return torch.where(mask.bool(), whitened, torch.zeros_like(whitened))


def _check_same_shape(a: torch.Tensor, b: torch.Tensor, name_a: str, name_b: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{name_a} and {name_b} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
