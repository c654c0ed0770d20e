"""Per-position rows ``(B, H, N, D)`` kept in the memory layout their caller gave them.

An attention layer splits its projections ``(B, N, H·D)`` into heads as a view, so its
queries, keys and values reach the kernels as ``(B, H, N, D)`` tensors whose heads are
the inner axis in memory (strides ``(N·H·D, D, H·D, 1)``). The Triton kernels read such
rows through their ``(batch, head, position)`` strides, with a unit stride along ``D``,
and write every per-position output and gradient in the layout of the input it belongs
to (:func:`new_rows`): nothing is copied into a ``(B, H, N, D)``-contiguous layout on the
way in, and the caller's merge of the heads (``out.transpose(1, 2).reshape(B, N, H·D)``)
is a view on the way out, forward and backward.
"""

from __future__ import annotations

import torch

__all__ = ["heads_inner", "new_rows", "rows_view", "unit_stride"]


def heads_inner(x: torch.Tensor) -> bool:
    """Whether ``x (B, H, N, D)`` holds its heads inside its positions in memory (the
    head-split view of ``(B, N, H·D)`` projections)."""
    return x.shape[1] > 1 and x.shape[2] > 1 and x.stride(1) < x.stride(2)


def unit_stride(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when its last axis is contiguous (what the kernels' row loads need), else a
    contiguous copy."""
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


def rows_view(flat: torch.Tensor, batch: int, heads: int, positions: int, width: int,
              heads_inner: bool) -> torch.Tensor:
    """The 1-D ``flat`` as ``(B, H, N, width)`` rows: stored as ``(B, N, H, width)`` when
    ``heads_inner`` (a view with the heads axis moved), else contiguous."""
    if heads_inner:
        return flat.view(batch, positions, heads, width).transpose(1, 2)
    return flat.view(batch, heads, positions, width)


def new_rows(
    batch: int,
    heads: int,
    positions: int,
    width: int,
    heads_inner: bool,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    zero: bool = False,
) -> torch.Tensor:
    """A new ``(B, H, N, width)`` tensor laid out as :func:`rows_view` lays it; zeros when
    ``zero``, else uninitialised."""
    make = torch.zeros if zero else torch.empty
    flat = make(batch * heads * positions * width, dtype=dtype, device=device)
    return rows_view(flat, batch, heads, positions, width, heads_inner)
