"""Triton: improved clustered attention after its clustering, one autograd op.

``improved_clustered(q, k, v, centroids, assignments, counts, lengths, scale, topk)`` is
:func:`fastasr.kernels.clustering.triton_centroid.centroid_attention` (values, top keys and their weights)
followed by :func:`fastasr.kernels.clustering.triton_clustered.improved_sparse` (each query's exact
attention on its cluster's top keys): the same launches forward, and one backward for both.
The sparse part's backward sums the gradients of ``dk``, ``dv`` (at the top keys), the top
weights and the centroid values in float32, and the centroid backward takes them as they are:
it adds the ``dk``, ``dv`` sums to its own before it stores each key's and value's gradient,
and reads the other two in float32. Two ops would cast those sums to the inputs' dtype and
then add two gradients of every key and value: four passes over ``(B, H, N, E)`` and their
launches a call, gone here. The numbers are the two ops' (gradients to rounding: the sums
meet in float32 before one rounding instead of after two).
"""

from __future__ import annotations

import torch

from fastasr.kernels.clustering import triton_centroid as centroid_kernels
from fastasr.kernels.clustering import triton_clustered as sparse_kernels
from fastasr.kernels.clustering.cluster_order import cluster_order
from fastasr.kernels.ranges import profiled_range
from fastasr.kernels.rows import unit_stride

__all__ = ["improved_clustered", "applies", "MAX_CENTROIDS"]

#: Most centroids the one op serves: the centroid backward's tile of 256 centroids spills on sm_90
#: once it also adds the sparse part's gradients (``fastasr-kernels compile-check``), so
#: more go through the two ops.
MAX_CENTROIDS = 128


def applies(centroids: torch.Tensor, k: torch.Tensor, v: torch.Tensor, topk: int) -> bool:
    """Whether :func:`improved_clustered` serves these shapes and dtypes (``topk >= 1``)."""
    return topk >= 1 and centroids.shape[2] <= MAX_CENTROIDS and centroid_kernels.applies(centroids, k, v, topk)


class _ImprovedClustered(torch.autograd.Function):
    @staticmethod
    def forward(ctx, centroids, q, k, v, lengths, order, scale, topk):
        with profiled_range("attention.centroid_attention"):
            values, top_w, top_idx, state = centroid_kernels.centroid_forward(centroids, k, v, lengths, scale, topk)
        with profiled_range("attention.sparse_part"):
            out = sparse_kernels.sparse_forward(q, k, v, values, top_w.contiguous(), top_idx, lengths, order, scale)
        ctx.save_for_backward(centroids, q, k, v, lengths, state.lse, state.values32, state.top_w, top_w, top_idx)
        ctx.order, ctx.scale, ctx.top_sorted = order, scale, state.top_sorted
        return out

    @staticmethod
    def backward(ctx, grad):
        centroids, q, k, v, lengths, lse, values32, top_w32, top_w, top_idx = ctx.saved_tensors
        dq, dk, dv, dtop_w, dvalues = sparse_kernels.sparse_backward(
            q, k, v, top_w, top_idx, lengths, ctx.order, ctx.scale, grad)
        state = centroid_kernels.CentroidState(lse, values32, top_w32, ctx.top_sorted)
        dcent, dk, dv = centroid_kernels.centroid_backward(
            centroids, k, v, lengths, ctx.scale, state, top_idx, dvalues, dtop_w, add=(dk, dv))
        return dcent, dq, dk, dv, None, None, None, None


def improved_clustered(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    centroids: torch.Tensor,
    assignments: torch.Tensor,
    counts: torch.Tensor | None,
    lengths: torch.Tensor | None,
    scale: float,
    topk: int,
) -> torch.Tensor:
    """``improved_sparse(q, k, v, *centroid_attention(centroids, k, v, lengths, scale, topk), ...)``
    as one op: the same launches forward, one backward for both (module docstring).

    Args:
        q, k: ``(B, H, N, E)``; v: ``(B, H, N, Ev)``, fp32/fp16/bf16, in any layout with a unit
            stride along the last axis (the gradients take each input's layout).
        centroids: ``(B, H, C, E)`` (float32); assignments: ``(B, H, N)`` int64 cluster of each
            query, -1 padded; counts: ``(B, H, C)`` members per cluster, or None (counted).
        lengths: ``(B,)`` or None; scale: the logits' factor; topk: ``1 <= topk <= N``.

    Returns:
        ``(B, H, N, Ev)`` in ``v``'s dtype, laid out as ``q``.

    Raises:
        ValueError: what either op refuses.
    """
    if topk < 1:
        raise ValueError(f"improved_clustered: topk={topk}; expected at least 1 (without top keys: "
                         "clustered attention)")
    lengths = centroid_kernels.checked_lengths("improved_clustered", centroids, k, v, lengths, topk)
    if centroids.shape[2] > MAX_CENTROIDS:
        raise ValueError(f"improved_clustered: C={centroids.shape[2]}; serves at most {MAX_CENTROIDS} "
                         "(more: centroid_attention, then improved_sparse)")
    B, H, C, _ = centroids.shape
    top_idx_like = torch.empty((B, H, C, topk), dtype=torch.int64, device=q.device)
    sparse_kernels.check_sparse_inputs("improved_clustered", q, k, v, top_idx_like, assignments)
    order = cluster_order(assignments, C, counts)
    return _ImprovedClustered.apply(centroids.contiguous(), q, unit_stride(k), unit_stride(v), lengths, order,
                                    scale, topk)
