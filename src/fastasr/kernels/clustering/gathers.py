"""Row gathers with memory-light autograd: the building blocks of the sparse products.

``out[r, t] = a[r] . b[idx[r, t]]`` and its relatives, computed through the rows in
blocks so the ``(rows, K, E)`` gathered temporary stays bounded, with custom backward
passes that never store it. Used by the reference clustered products
(:mod:`fastasr.kernels.clustering.reference`) and by top-k attention.
"""

from __future__ import annotations

import torch

__all__ = [
    "flat_index",
    "rows_gather_dot",
    "rows_gather_weighted_sum",
    "rows_scatter_outer",
    "gather_dot",
    "gather_weighted_sum",
]

# Rows of the (rows, K, E) temporaries materialised at a time by the gather ops.
_GATHER_ROWS = 4096


def flat_index(idx: torch.Tensor, n: int) -> torch.Tensor:
    """``(B,H,M,K)`` indices into the N axis -> indices into the flattened ``(B*H*N)`` rows."""
    B, H = idx.shape[:2]
    base = torch.arange(B * H, device=idx.device).view(B, H, 1, 1) * n
    return (idx + base).reshape(B * H * idx.shape[2], idx.shape[3])


def rows_gather_dot(a: torch.Tensor, b: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``out[r, t] = a[r] . b[idx[r, t]]`` for ``a (R,E)``, ``b (S,E)``, ``idx (R,K)`` -> ``(R,K)``.

    No autograd; works through the rows in blocks so the ``(rows, K, E)`` gather
    stays bounded. (A multiply and a sum, not a batched matmul: on CPU, thousands
    of tiny matmuls cost far more than one elementwise pass.)
    """
    out = a.new_empty(idx.shape)
    for s in range(0, a.shape[0], _GATHER_ROWS):
        e = s + _GATHER_ROWS
        torch.sum(b[idx[s:e]] * a[s:e, None, :], dim=-1, out=out[s:e])
    return out


def rows_gather_weighted_sum(w: torch.Tensor, v: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``out[r] = sum_t w[r, t] * v[idx[r, t]]`` for ``w (R,K)``, ``v (S,E)``, ``idx (R,K)`` -> ``(R,E)``.

    No autograd; blocked over rows like :func:`rows_gather_dot`.
    """
    out = v.new_empty(w.shape[0], v.shape[1])
    for s in range(0, w.shape[0], _GATHER_ROWS):
        e = s + _GATHER_ROWS
        torch.sum(w[s:e, :, None] * v[idx[s:e]], dim=1, out=out[s:e])
    return out


def rows_scatter_outer(
    w: torch.Tensor, x: torch.Tensor, idx: torch.Tensor, num_rows: int
) -> torch.Tensor:
    """``out[idx[r, t]] += w[r, t] * x[r]`` into zeros ``(num_rows, E)``; ``w (R,K)``, ``x (R,E)``.

    The adjoint of both gathers above. No autograd; blocked over rows.
    """
    out = x.new_zeros(num_rows, x.shape[1])
    for s in range(0, w.shape[0], _GATHER_ROWS):
        e = s + _GATHER_ROWS
        contrib = w[s:e, :, None] * x[s:e, None, :]  # (rows, K, E)
        out.index_add_(0, idx[s:e].reshape(-1), contrib.reshape(-1, x.shape[1]))
    return out


class _GatherDot(torch.autograd.Function):
    """Autograd for :func:`rows_gather_dot` that never stores the ``(R, K, E)`` gather."""

    @staticmethod
    def forward(ctx, a, b, idx):
        ctx.save_for_backward(a, b, idx)
        return rows_gather_dot(a, b, idx)

    @staticmethod
    def backward(ctx, g):
        a, b, idx = ctx.saved_tensors
        ga = rows_gather_weighted_sum(g, b, idx) if ctx.needs_input_grad[0] else None
        gb = rows_scatter_outer(g, a, idx, b.shape[0]) if ctx.needs_input_grad[1] else None
        return ga, gb, None


class _GatherWeightedSum(torch.autograd.Function):
    """Autograd for :func:`rows_gather_weighted_sum` that never stores the ``(R, K, E)`` gather."""

    @staticmethod
    def forward(ctx, w, v, idx):
        ctx.save_for_backward(w, v, idx)
        return rows_gather_weighted_sum(w, v, idx)

    @staticmethod
    def backward(ctx, g):
        w, v, idx = ctx.saved_tensors
        gw = rows_gather_dot(g, v, idx) if ctx.needs_input_grad[0] else None
        gv = rows_scatter_outer(w, g, idx, v.shape[0]) if ctx.needs_input_grad[1] else None
        return gw, gv, None


def gather_dot(q: torch.Tensor, k: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``out[b,h,n,t] = q[b,h,n] . k[b,h,idx[b,h,n,t]]``.

    Args:
        q: ``(B, H, N, E)``; k: ``(B, H, S, E)``; idx: ``(B, H, N, K)`` int64 in ``[0, S)``.

    Returns:
        ``(B, H, N, K)``, differentiable in ``q`` and ``k``; memory ``O(N K)`` plus a
        bounded ``(rows, K, E)`` working set.
    """
    B, H, N, E = q.shape
    S = k.shape[2]
    K = idx.shape[-1]
    flat = flat_index(idx, S)
    out = _GatherDot.apply(q.reshape(B * H * N, E), k.reshape(B * H * S, E), flat)
    return out.view(B, H, N, K)


def gather_weighted_sum(w: torch.Tensor, v: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``out[b,h,n] = sum_t w[b,h,n,t] * v[b,h,idx[b,h,n,t]]``.

    Args:
        w: ``(B, H, N, K)``; v: ``(B, H, S, E)``; idx: ``(B, H, N, K)`` int64 in ``[0, S)``.

    Returns:
        ``(B, H, N, E)``, differentiable in ``w`` and ``v``.
    """
    B, H, N, K = w.shape
    S, E = v.shape[2], v.shape[3]
    flat = flat_index(idx, S)
    out = _GatherWeightedSum.apply(w.reshape(B * H * N, K), v.reshape(B * H * S, E), flat)
    return out.view(B, H, N, E)
