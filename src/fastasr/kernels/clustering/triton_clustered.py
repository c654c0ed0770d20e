"""Triton kernels: the sparse per-cluster products of improved clustered attention.

Triton twins of ``fastasr.kernels.clustering.reference.clustered_dot`` and
``clustered_weighted_sum`` (same shapes, same values, differentiable in the same
arguments):

* ``clustered_dot(q, k, topk_idx, assignments)[b,h,n,t] = q[n] · k[topk_idx[a_n, t]]``
* ``clustered_weighted_sum(w, v, topk_idx, assignments)[b,h,n] = Σ_t w[n,t] v[topk_idx[a_n, t]]``

with ``a_n = assignments[b,h,n]``; padded queries (``a_n = -1``) give 0 and receive
and pass on no gradient.

Design: one block, one cluster. All queries of a cluster use the same ``K`` keys, so
each (batch, head)'s positions are sorted by cluster once per attention call (one
stable ``argsort``, padded queries last; :func:`cluster_order`, shared by every product
of the forward and backward pass). A block is up to ``BLOCK_N`` consecutive sorted
positions *of one cluster*: a program loads its rows and that cluster's ``K``
key/value rows once and does one ``tl.dot`` on the tensor cores (fp16/bf16 operands,
fp32 accumulator; fp32 inputs in full fp32 precision, no tf32). No block multiplies
rows of another cluster, whatever the cluster sizes (a block of consecutive sorted
positions would loop over ~15 clusters at N = 220, C = 100). The block table is
one launch on the device without a host synchronisation: ``cdiv(N, BLOCK_N) + C`` slots
per (batch, head) bound the number of blocks, unused slots exit at once.

The three kernels, and which pass uses them:

=========================  ======================================  =====================
kernel                     computes                                used for
=========================  ======================================  =====================
``_gather_dot_kernel``     ``S[n] = X[n] @ M[idx[a_n]]^T``  (N,K)   dot fwd; ``dw`` of wsum
``_gather_wsum_kernel``    ``O[n] = W[n] @ M[idx[a_n]]``    (N,E)   wsum fwd; ``dq`` of dot
``_scatter_outer_kernel``  ``dM[idx[c]] += W[blk]^T @ X[blk]``      ``dk`` of dot; ``dv`` of wsum
=========================  ======================================  =====================

Improved clustered attention's per-query part (``reference.improved_sparse``) runs fused
on the same blocks: ``_sparse_fwd_kernel`` scores a block's queries against its cluster's
valid top keys, takes the softmax, weighs the values and adds the cluster's mass and rest
(computed in the kernel from the centroid weights and output); ``_sparse_bwd_kernel``
recomputes the softmax and produces every gradient. One launch each way, nothing of size
``N × K`` or ``C × K × E`` in memory. The three
products above stay for :func:`clustered_dot` and :func:`clustered_weighted_sum`, the
reference's building blocks.

The scatter sums over a block first (a ``(K, BLOCK_N) @ (BLOCK_N, E)`` product) and
only then adds the ``(K, E)`` partial into an fp32 buffer with ``atomic_add``: one
atomic per (selected key, feature) per block instead of one per (query, key,
feature). The order of those float additions varies from run to run, so ``dk``/``dv``
are reproducible to rounding (about 1e-7 relative in fp32), not bit for bit.

The fused sparse kernels read ``q``, ``k``, ``v`` and the incoming gradient through their
strides and write ``out``, ``dq``, ``dk`` and ``dv`` in the layout of their inputs
(:mod:`fastasr.kernels.rows`): a head-split view of projections is not copied. Centroid
grouping and the broadcast of centroid outputs to the queries are
:mod:`fastasr.kernels.clustering.triton_broadcast`'s.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from fastasr.kernels.availability import (
    kernels_interpreted,
    prepare_interpreter,
    require_triton,
)
from fastasr.kernels.clustering.cluster_order import ClusterOrder, cluster_order
from fastasr.kernels.grid import next_power_of_2
from fastasr.kernels.rows import heads_inner, new_rows, rows_view

prepare_interpreter()

__all__ = ["ClusterOrder", "cluster_order", "clustered_dot", "clustered_weighted_sum", "dot_config",
           "improved_sparse", "check_sparse_inputs", "sparse_forward", "sparse_backward"]

MAX_FEATURES = 256  # E and K are held whole in one tile
_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _block_rows(perm_ptr, blk_ptr, pid_bh, pid_blk, N, P, BLOCK_N: tl.constexpr):
    """The cluster of block ``pid_blk`` (-1: unused), its positions and their mask."""
    entry = blk_ptr + (pid_bh.to(tl.int64) * P + pid_blk) * 3
    c = tl.load(entry)
    row0 = tl.load(entry + 1)
    nrows = tl.load(entry + 2)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < nrows
    rows = tl.load(perm_ptr + pid_bh.to(tl.int64) * N + row0 + offs, mask=mask, other=0)
    return c, rows, mask


@triton.jit
def _load_cluster_rows(m_ptr, idx_ptr, c, S, K, E, s_ms, s_me, s_ic, s_it,
                       BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr):
    """Rows ``M[idx[c, t]]`` as a (BLOCK_K, BLOCK_E) tile (zeros where t >= K or idx invalid)."""
    offs_t = tl.arange(0, BLOCK_K)
    offs_e = tl.arange(0, BLOCK_E)
    idx = tl.load(idx_ptr + c * s_ic + offs_t * s_it, mask=offs_t < K, other=-1)
    ok = (idx >= 0) & (idx < S)
    rows = tl.load(
        m_ptr + idx[:, None] * s_ms + offs_e[None, :] * s_me,
        mask=ok[:, None] & (offs_e[None, :] < E), other=0.0,
    )
    return rows, idx, ok


@triton.jit
def _gather_dot_kernel(
    x_ptr, m_ptr, idx_ptr, perm_ptr, blk_ptr, out_ptr,
    H, N, S, K, E, P,
    s_xb, s_xh, s_xn, s_xe,
    s_mb, s_mh, s_ms, s_me,
    s_ib, s_ih, s_ic, s_it,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    c, rows, mask_p = _block_rows(perm_ptr, blk_ptr, pid_bh, tl.program_id(1), N, P, BLOCK_N)
    if c < 0:
        return
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_t = tl.arange(0, BLOCK_K)
    offs_e = tl.arange(0, BLOCK_E)
    x = tl.load(
        x_ptr + b * s_xb + h * s_xh + rows[:, None] * s_xn + offs_e[None, :] * s_xe,
        mask=mask_p[:, None] & (offs_e[None, :] < E), other=0.0,
    ).to(DOT_DTYPE)
    keys, _, _ = _load_cluster_rows(m_ptr + b * s_mb + h * s_mh, idx_ptr + b * s_ib + h * s_ih,
                                    c, S, K, E, s_ms, s_me, s_ic, s_it, BLOCK_K, BLOCK_E)
    acc = tl.dot(x, tl.trans(keys.to(DOT_DTYPE)), input_precision=PRECISION)
    out_ptrs = out_ptr + (pid_bh.to(tl.int64) * N + rows[:, None]) * K + offs_t[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty),
             mask=mask_p[:, None] & (offs_t[None, :] < K))


@triton.jit
def _gather_wsum_kernel(
    w_ptr, m_ptr, idx_ptr, perm_ptr, blk_ptr, out_ptr,
    H, N, S, K, E, P,
    s_wb, s_wh, s_wn, s_wt,
    s_mb, s_mh, s_ms, s_me,
    s_ib, s_ih, s_ic, s_it,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    c, rows, mask_p = _block_rows(perm_ptr, blk_ptr, pid_bh, tl.program_id(1), N, P, BLOCK_N)
    if c < 0:
        return
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_t = tl.arange(0, BLOCK_K)
    offs_e = tl.arange(0, BLOCK_E)
    w = tl.load(
        w_ptr + b * s_wb + h * s_wh + rows[:, None] * s_wn + offs_t[None, :] * s_wt,
        mask=mask_p[:, None] & (offs_t[None, :] < K), other=0.0,
    ).to(DOT_DTYPE)
    vals, _, _ = _load_cluster_rows(m_ptr + b * s_mb + h * s_mh, idx_ptr + b * s_ib + h * s_ih,
                                    c, S, K, E, s_ms, s_me, s_ic, s_it, BLOCK_K, BLOCK_E)
    acc = tl.dot(w, vals.to(DOT_DTYPE), input_precision=PRECISION)
    out_ptrs = out_ptr + (pid_bh.to(tl.int64) * N + rows[:, None]) * E + offs_e[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty),
             mask=mask_p[:, None] & (offs_e[None, :] < E))


@triton.jit
def _scatter_outer_kernel(
    a_ptr, x_ptr, idx_ptr, perm_ptr, blk_ptr, dm_ptr,
    H, N, S, K, E, P,
    s_ab, s_ah, s_an, s_at,
    s_xb, s_xh, s_xn, s_xe,
    s_ib, s_ih, s_ic, s_it,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    c, rows, mask_p = _block_rows(perm_ptr, blk_ptr, pid_bh, tl.program_id(1), N, P, BLOCK_N)
    if c < 0:
        return
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_t = tl.arange(0, BLOCK_K)
    offs_e = tl.arange(0, BLOCK_E)
    mask_e = offs_e < E
    a = tl.load(
        a_ptr + b * s_ab + h * s_ah + rows[:, None] * s_an + offs_t[None, :] * s_at,
        mask=mask_p[:, None] & (offs_t[None, :] < K), other=0.0,
    ).to(DOT_DTYPE)
    x = tl.load(
        x_ptr + b * s_xb + h * s_xh + rows[:, None] * s_xn + offs_e[None, :] * s_xe,
        mask=mask_p[:, None] & mask_e[None, :], other=0.0,
    ).to(DOT_DTYPE)
    part = tl.dot(tl.trans(a), x, input_precision=PRECISION)  # (BLOCK_K, BLOCK_E)
    idx = tl.load(idx_ptr + b * s_ib + h * s_ih + c * s_ic + offs_t * s_it, mask=offs_t < K, other=-1)
    ok = (idx >= 0) & (idx < S)
    tl.atomic_add(dm_ptr + pid_bh.to(tl.int64) * S * E + idx[:, None] * E + offs_e[None, :], part,
                  mask=ok[:, None] & mask_e[None, :], sem="relaxed")


@triton.jit
def _sparse_tiles(q_ptr, k_ptr, v_ptr, idx_ptr, len_ptr, tw_ptr, pid_bh, c, rows, mask_p,
                  H, S, K, E, EV, C, scale,
                  s_qb, s_qh, s_qn, s_qe, s_kb, s_kh, s_ks, s_ke,
                  s_vb, s_vh, s_vs, s_ve, s_ib, s_ih, s_ic, s_it,
                  DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
                  BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_V: tl.constexpr):
    """A block's queries, its cluster's valid top keys, their values and centroid weights
    (0 at invalid keys), and the softmax of the queries over those keys."""
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_t = tl.arange(0, BLOCK_K)
    offs_e = tl.arange(0, BLOCK_E)
    offs_v = tl.arange(0, BLOCK_V)
    length = tl.load(len_ptr + b).to(tl.int32)  # 32-bit positions in the masks
    idx = tl.load(idx_ptr + b * s_ib + h * s_ih + c * s_ic + offs_t * s_it, mask=offs_t < K, other=-1)
    ok = (idx >= 0) & (idx < S) & (idx < length)  # the valid top keys
    tw = tl.load(tw_ptr + (pid_bh.to(tl.int64) * C + c) * K + offs_t, mask=ok, other=0.0).to(tl.float32)
    x = tl.load(q_ptr + b * s_qb + h * s_qh + rows[:, None] * s_qn + offs_e[None, :] * s_qe,
                mask=mask_p[:, None] & (offs_e[None, :] < E), other=0.0).to(DOT_DTYPE)
    keys = tl.load(k_ptr + b * s_kb + h * s_kh + idx[:, None] * s_ks + offs_e[None, :] * s_ke,
                   mask=ok[:, None] & (offs_e[None, :] < E), other=0.0).to(DOT_DTYPE)
    vals = tl.load(v_ptr + b * s_vb + h * s_vh + idx[:, None] * s_vs + offs_v[None, :] * s_ve,
                   mask=ok[:, None] & (offs_v[None, :] < EV), other=0.0).to(DOT_DTYPE)
    s = tl.dot(x, tl.trans(keys), input_precision=PRECISION) * scale  # (BLOCK_N, BLOCK_K) fp32
    s = tl.where(ok[None, :], s, float("-inf"))
    m = tl.max(s, 1)
    m = tl.where(m == float("-inf"), 0.0, m)  # a row with no valid key: p = 0
    p = tl.exp(s - m[:, None])
    p = tl.where(ok[None, :], p, 0.0)
    total = tl.sum(p, 1)
    p = p / tl.where(total > 0, total, 1.0)[:, None]
    return x, keys, vals, tw, p, idx, ok


@triton.jit
def _sparse_fwd_kernel(
    q_ptr, k_ptr, v_ptr, idx_ptr, len_ptr, perm_ptr, blk_ptr, tw_ptr, values_ptr, out_ptr,
    H, N, S, K, E, EV, C, P, scale,
    s_qb, s_qh, s_qn, s_qe, s_kb, s_kh, s_ks, s_ke,
    s_vb, s_vh, s_vs, s_ve, s_ib, s_ih, s_ic, s_it,
    s_ob, s_oh, s_on,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """``out[n] = rest + mass * softmax_t(scale q_n . k_T[t]) @ v_T`` for a block of cluster c,
    with ``mass = sum_t w_t``, ``rest = values[c] - sum_t w_t v_T[t]`` over its valid top keys."""
    pid_bh = tl.program_id(0)
    c, rows, mask_p = _block_rows(perm_ptr, blk_ptr, pid_bh, tl.program_id(1), N, P, BLOCK_N)
    if c < 0:
        return
    _, _, vals, tw, p, _, _ = _sparse_tiles(
        q_ptr, k_ptr, v_ptr, idx_ptr, len_ptr, tw_ptr, pid_bh, c, rows, mask_p, H, S, K, E, EV, C, scale,
        s_qb, s_qh, s_qn, s_qe, s_kb, s_kh, s_ks, s_ke, s_vb, s_vh, s_vs, s_ve, s_ib, s_ih, s_ic, s_it,
        DOT_DTYPE, PRECISION, BLOCK_K, BLOCK_E, BLOCK_V)
    offs_v = tl.arange(0, BLOCK_V)
    centroid = tl.load(values_ptr + (pid_bh.to(tl.int64) * C + c) * EV + offs_v,
                       mask=offs_v < EV, other=0.0).to(tl.float32)
    rest = centroid - tl.sum(tw[:, None] * vals.to(tl.float32), 0)
    o = tl.dot(p.to(DOT_DTYPE), vals, input_precision=PRECISION)
    out = tl.sum(tw, 0) * o + rest[None, :]
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    tl.store(out_ptr + b * s_ob + h * s_oh + rows[:, None] * s_on + offs_v[None, :],
             out.to(out_ptr.dtype.element_ty), mask=mask_p[:, None] & (offs_v[None, :] < EV))


@triton.jit
def _sparse_bwd_kernel(
    q_ptr, k_ptr, v_ptr, idx_ptr, len_ptr, perm_ptr, blk_ptr, tw_ptr, dout_ptr,
    dq_ptr, dk_ptr, dv_ptr, dtw_ptr, dvalues_ptr,
    H, N, S, K, E, EV, C, P, scale,
    s_qb, s_qh, s_qn, s_qe, s_kb, s_kh, s_ks, s_ke,
    s_vb, s_vh, s_vs, s_ve, s_ib, s_ih, s_ic, s_it,
    s_gb, s_gh, s_gn, s_ge, s_dqb, s_dqh, s_dqn, s_dkb, s_dkh, s_dkn, s_dvb, s_dvh, s_dvn,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """The backward of :func:`_sparse_fwd_kernel` for one block: the softmax recomputed,
    ``dq`` stored; ``dtop_w`` and ``dvalues`` (of the cluster) and the ``(K, E)`` tiles of
    ``dk``, ``dv`` at the top keys added into fp32 buffers.
    With ``G = sum_rows dout`` and ``M = sum_rows dout . o`` (``o`` the softmax part before
    the mass): ``dvalues[c] += G``, ``dw_t += M - G . v_T[t]``,
    ``dv_T[t] += p^T (mass dout) - w_t G``."""
    pid_bh = tl.program_id(0)
    offs_t = tl.arange(0, BLOCK_K)
    c, rows, mask_p = _block_rows(perm_ptr, blk_ptr, pid_bh, tl.program_id(1), N, P, BLOCK_N)
    if c < 0:
        return
    x, keys, vals, tw, p, idx, ok = _sparse_tiles(
        q_ptr, k_ptr, v_ptr, idx_ptr, len_ptr, tw_ptr, pid_bh, c, rows, mask_p, H, S, K, E, EV, C, scale,
        s_qb, s_qh, s_qn, s_qe, s_kb, s_kh, s_ks, s_ke, s_vb, s_vh, s_vs, s_ve, s_ib, s_ih, s_ic, s_it,
        DOT_DTYPE, PRECISION, BLOCK_K, BLOCK_E, BLOCK_V)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_e = tl.arange(0, BLOCK_E)
    offs_v = tl.arange(0, BLOCK_V)
    mask_v = offs_v < EV
    cluster = pid_bh.to(tl.int64) * C + c
    g = tl.load(dout_ptr + b * s_gb + h * s_gh + rows[:, None] * s_gn + offs_v[None, :] * s_ge,
                mask=mask_p[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
    o = tl.dot(p.to(DOT_DTYPE), vals, input_precision=PRECISION)  # the softmax part, before the mass
    g_sum = tl.sum(g, 0)  # (BLOCK_V,)
    tl.atomic_add(dvalues_ptr + cluster * EV + offs_v, g_sum, mask=mask_v, sem="relaxed")
    vals_f = vals.to(tl.float32)
    dtw = tl.sum(tl.sum(g * o, 1), 0) - tl.sum(vals_f * g_sum[None, :], 1)
    tl.atomic_add(dtw_ptr + cluster * K + offs_t, dtw, mask=ok, sem="relaxed")
    go = (g * tl.sum(tw, 0)).to(DOT_DTYPE)  # d of the softmax part
    dp = tl.dot(go, tl.trans(vals), input_precision=PRECISION)  # (BLOCK_N, BLOCK_K)
    ds = p * (dp - tl.sum(p * dp, 1)[:, None]) * scale
    dq = tl.dot(ds.to(DOT_DTYPE), keys, input_precision=PRECISION)
    tl.store(dq_ptr + b * s_dqb + h * s_dqh + rows[:, None] * s_dqn + offs_e[None, :],
             dq.to(dq_ptr.dtype.element_ty), mask=mask_p[:, None] & (offs_e[None, :] < E))
    dk = tl.dot(tl.trans(ds.to(DOT_DTYPE)), x, input_precision=PRECISION)  # (BLOCK_K, BLOCK_E)
    dv = tl.dot(tl.trans(p.to(DOT_DTYPE)), go, input_precision=PRECISION) - tw[:, None] * g_sum[None, :]
    tl.atomic_add(dk_ptr + b * s_dkb + h * s_dkh + idx[:, None] * s_dkn + offs_e[None, :], dk,
                  mask=ok[:, None] & (offs_e[None, :] < E), sem="relaxed")
    tl.atomic_add(dv_ptr + b * s_dvb + h * s_dvh + idx[:, None] * s_dvn + offs_v[None, :], dv,
                  mask=ok[:, None] & mask_v[None, :], sem="relaxed")


# --- host side -------------------------------------------------------------------------


def dot_config(dtype: torch.dtype, interpreted: bool):
    """(tl dtype of the dot operands, input_precision) for inputs promoted to ``dtype``."""
    if dtype == torch.float32:
        return tl.float32, "ieee"  # fp32 accuracy (the 1e-4 contract), not tf32
    if interpreted and dtype == torch.bfloat16:
        # Triton 3.6's interpreter multiplies bf16 dot operands wrongly; its fp32 product
        # of the same bf16 values is what the tensor cores compute.
        return tl.float32, "ieee"
    return (tl.float16 if dtype == torch.float16 else tl.bfloat16), "tf32"


def _blocks(K: int, E: int, dot_dtype) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, BLOCK_E): K and E whole; fewer rows for wider tiles.

    For K = 32 and E = 32/64 this keeps every kernel at 4 warps between about 30 and
    160 registers per thread with no spills on sm_90 (``fastasr-kernels
    compile-check``). Not tuned on a GPU yet.
    """
    block_k = max(16, next_power_of_2(K))
    block_e = max(16, next_power_of_2(E))
    width = (block_k + block_e) * (2 if dot_dtype == tl.float32 else 1)
    block_n = 64 if width <= 64 else (32 if width <= 192 else 16)
    return block_n, block_k, block_e


def _check(op: str, a: torch.Tensor, m: torch.Tensor, topk_idx: torch.Tensor,
           assignments: torch.Tensor, a_name: str, m_name: str) -> None:
    for name, t in ((a_name, a), (m_name, m)):
        if t.dim() != 4:
            raise ValueError(f"{op}: {name} must be 4-d (B, H, ., .), got {tuple(t.shape)}")
        if t.dtype not in _SUPPORTED:
            raise TypeError(f"{op}: {name} is {t.dtype}; the Triton kernel takes "
                            "float32/float16/bfloat16 (float64: use the reference)")
    B, H, N = a.shape[:3]
    if m.shape[:2] != (B, H):
        raise ValueError(f"{op}: {m_name} {tuple(m.shape)} does not match {a_name} {tuple(a.shape)}")
    if topk_idx.dim() != 4 or topk_idx.shape[:2] != (B, H):
        raise ValueError(f"{op}: topk_idx must be (B, H, C, K) = ({B}, {H}, C, K), "
                         f"got {tuple(topk_idx.shape)}")
    if assignments.shape != (B, H, N):
        raise ValueError(f"{op}: assignments must be ({B}, {H}, {N}), got {tuple(assignments.shape)}")
    if m.shape[-1] > MAX_FEATURES or topk_idx.shape[-1] > MAX_FEATURES:
        raise ValueError(f"{op}: E={m.shape[-1]}, K={topk_idx.shape[-1]}; the kernel holds "
                         f"both whole in a tile, so each must be <= {MAX_FEATURES}")
    devices = {t.device for t in (a, m, topk_idx, assignments)}
    if len(devices) != 1:
        raise ValueError(f"{op}: inputs on several devices {sorted(map(str, devices))}")


def _launch(kernel, a, m, topk_idx, order: ClusterOrder, out, width: int):
    """Launch a product kernel over every block of ``order``; ``width``: K or E of ``m``."""
    B, H, N = a.shape[:3]
    S, K = m.shape[2], topk_idx.shape[3]
    interpreted = kernels_interpreted(kernel)
    dot_dtype, precision = dot_config(torch.promote_types(a.dtype, m.dtype), interpreted)
    block_n, block_k, block_e = _blocks(K, width, dot_dtype)
    table, P = order.blocks(block_n)
    kernel[(B * H, P)](
        a, m, topk_idx, order.perm, table, out,
        H, N, S, K, width, P,
        *a.stride(), *m.stride(), *topk_idx.stride(),
        DOT_DTYPE=dot_dtype, PRECISION=precision,
        BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_E=block_e,
    )
    return out


def _launch_dot(x, m, topk_idx, order, out_dtype):
    """``(B,H,N,E)`` x, ``(B,H,S,E)`` m -> ``(B,H,N,K)``: x[n] · m[idx[a_n, t]] (0 for padded)."""
    B, H, N, E = x.shape
    out = torch.zeros((B, H, N, topk_idx.shape[3]), dtype=out_dtype, device=x.device)
    if out.numel() == 0:
        return out
    return _launch(_gather_dot_kernel, x, m, topk_idx, order, out, E)


def _launch_wsum(w, m, topk_idx, order, out_dtype):
    """``(B,H,N,K)`` w, ``(B,H,S,E)`` m -> ``(B,H,N,E)``: Σ_t w[n,t] m[idx[a_n, t]] (0 for padded)."""
    B, H, N, _ = w.shape
    out = torch.zeros((B, H, N, m.shape[3]), dtype=out_dtype, device=w.device)
    if out.numel() == 0:
        return out
    return _launch(_gather_wsum_kernel, w, m, topk_idx, order, out, m.shape[3])


def _launch_scatter(a, x, topk_idx, order, S, out_dtype):
    """``(B,H,N,K)`` a, ``(B,H,N,E)`` x -> ``(B,H,S,E)``: dM[idx[a_n,t]] += a[n,t] x[n]."""
    B, H, N, _ = a.shape
    E = x.shape[3]
    acc = torch.zeros((B, H, S, E), dtype=torch.float32, device=a.device)
    if a.numel() and acc.numel():
        _launch(_scatter_outer_kernel, a, x, topk_idx, order, acc, E)
    return acc.to(out_dtype)


class _ClusteredDot(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, topk_idx, order):
        out = _launch_dot(q, k, topk_idx, order, torch.promote_types(q.dtype, k.dtype))
        ctx.save_for_backward(q, k, topk_idx)
        ctx.order = order
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, topk_idx = ctx.saved_tensors
        dq = dk = None
        if ctx.needs_input_grad[0]:  # dq[n] = Σ_t g[n,t] k[idx[a_n,t]]
            dq = _launch_wsum(grad, k, topk_idx, ctx.order, q.dtype)
        if ctx.needs_input_grad[1]:  # dk[idx[c,t]] += Σ_{n in c} g[n,t] q[n]
            dk = _launch_scatter(grad, q, topk_idx, ctx.order, k.shape[2], k.dtype)
        return dq, dk, None, None


class _ClusteredWeightedSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, v, topk_idx, order):
        out = _launch_wsum(w, v, topk_idx, order, torch.promote_types(w.dtype, v.dtype))
        ctx.save_for_backward(w, v, topk_idx)
        ctx.order = order
        return out

    @staticmethod
    def backward(ctx, grad):
        w, v, topk_idx = ctx.saved_tensors
        dw = dv = None
        if ctx.needs_input_grad[0]:  # dw[n,t] = g[n] · v[idx[a_n,t]]
            dw = _launch_dot(grad, v, topk_idx, ctx.order, w.dtype)
        if ctx.needs_input_grad[1]:  # dv[idx[c,t]] += Σ_{n in c} w[n,t] g[n]
            dv = _launch_scatter(w, grad, topk_idx, ctx.order, v.shape[2], v.dtype)
        return dw, dv, None, None


def clustered_dot(
    q: torch.Tensor, k: torch.Tensor, topk_idx: torch.Tensor, assignments: torch.Tensor,
    order: ClusterOrder | None = None,
) -> torch.Tensor:
    """Dot products of every query with the selected keys of its cluster (Triton).

    Args:
        q: ``(B, H, N, E)`` queries; k: ``(B, H, S, E)`` keys (``S = N`` in attention).
        topk_idx: ``(B, H, C, K)`` int64 key positions per cluster, in ``[0, S)``
            (other values select nothing: a zero row).
        assignments: ``(B, H, N)`` int64 cluster per query, ``-1`` if padded.
        order: :func:`cluster_order` of ``assignments``, when the caller has it already
            (improved clustered attention sorts once for all its products).

    Returns:
        ``(B, H, N, K)``: ``q[n] · k[topk_idx[assignments[n], t]]``, 0 for padded queries;
        differentiable in ``q`` and ``k``. fp32/fp16/bf16, accumulated in fp32.
    """
    require_triton("clustered_dot", q.device, kernels_interpreted(_gather_dot_kernel))
    _check("clustered_dot", q, k, topk_idx, assignments, "q", "k")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"clustered_dot: q has E={q.shape[-1]}, k has E={k.shape[-1]}")
    order = order or cluster_order(assignments, topk_idx.shape[2])
    return _ClusteredDot.apply(q, k, topk_idx, order)


def clustered_weighted_sum(
    w: torch.Tensor, v: torch.Tensor, topk_idx: torch.Tensor, assignments: torch.Tensor,
    order: ClusterOrder | None = None,
) -> torch.Tensor:
    """Weighted sums of the selected values of every query's cluster (Triton).

    Args:
        w: ``(B, H, N, K)`` weights; v: ``(B, H, S, E)`` values.
        topk_idx: ``(B, H, C, K)`` int64 key positions per cluster, in ``[0, S)``.
        assignments: ``(B, H, N)`` int64 cluster per query, ``-1`` if padded.
        order: as :func:`clustered_dot`.

    Returns:
        ``(B, H, N, E)``: ``Σ_t w[n, t] · v[topk_idx[assignments[n], t]]``, 0 for padded
        queries; differentiable in ``w`` and ``v``. fp32/fp16/bf16, accumulated in fp32.
    """
    require_triton("clustered_weighted_sum", w.device, kernels_interpreted(_gather_wsum_kernel))
    _check("clustered_weighted_sum", w, v, topk_idx, assignments, "w", "v")
    if w.shape[-1] != topk_idx.shape[-1]:
        raise ValueError(f"clustered_weighted_sum: w has K={w.shape[-1]}, "
                         f"topk_idx has K={topk_idx.shape[-1]}")
    order = order or cluster_order(assignments, topk_idx.shape[2])
    return _ClusteredWeightedSum.apply(w, v, topk_idx, order)


#: Warps of the fused sparse kernels (with :func:`_sparse_blocks`' tiles; untimed: ``make
#: gpu-check``'s parts table times other rows a block and warps, ``--sparse-tiles``).
SPARSE_WARPS = 4


def _sparse_blocks(K: int, E: int, EV: int, dot_dtype, backward: bool = False) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, BLOCK_E, BLOCK_V) of the fused sparse kernels: as :func:`_blocks`
    with the wider of E and Ev; the backward with fp32 operands takes half the rows (at
    E = 64 it spilled on sm_90 with 32)."""
    block_n, block_k, _ = _blocks(K, max(E, EV), dot_dtype)
    if backward and dot_dtype == tl.float32:
        block_n = max(16, block_n // 2)
    return block_n, block_k, max(16, next_power_of_2(E)), max(16, next_power_of_2(EV))


class _SparseLaunch(NamedTuple):
    """How a fused sparse kernel runs: the dot operands' type and precision, its tiles, and
    the block table of ``P`` block slots per (batch, head)."""

    dot_dtype: object
    precision: str
    block_n: int
    block_k: int
    block_e: int
    block_v: int
    table: torch.Tensor
    P: int
    warps: int

    @classmethod
    def of(cls, kernel, q, v, top_idx, order) -> _SparseLaunch:
        dot_dtype, precision = dot_config(torch.promote_types(q.dtype, v.dtype), kernels_interpreted(kernel))
        blocks = _sparse_blocks(top_idx.shape[3], q.shape[3], v.shape[3], dot_dtype, kernel is _sparse_bwd_kernel)
        return cls(dot_dtype, precision, *blocks, *order.blocks(blocks[0]), SPARSE_WARPS)


def _launch_sparse(kernel, q, k, v, top_idx, lengths, order, scale, tensors, extra_strides=()):
    """Launch a fused sparse kernel over every block of ``order``.

    ``tensors``: the kernel's pointer arguments after ``blk_ptr`` (mass, ..., the outputs),
    in its order; ``extra_strides``: the strides of its per-position rows after ``top_idx``'s
    (the forward's output; the backward's incoming gradient, ``dq`` and the ``dk``, ``dv`` sums).
    """
    launch = _SparseLaunch.of(kernel, q, v, top_idx, order)
    B, H, N, E = q.shape
    S, EV, K = k.shape[2], v.shape[3], top_idx.shape[3]
    C = top_idx.shape[2]
    kernel[(B * H, launch.P)](
        q, k, v, top_idx, lengths, order.perm, launch.table, *tensors,
        H, N, S, K, E, EV, C, launch.P, scale,
        *q.stride(), *k.stride(), *v.stride(), *top_idx.stride(), *extra_strides,
        DOT_DTYPE=launch.dot_dtype, PRECISION=launch.precision, BLOCK_N=launch.block_n,
        BLOCK_K=launch.block_k, BLOCK_E=launch.block_e, BLOCK_V=launch.block_v, num_warps=launch.warps,
    )


def sparse_forward(q, k, v, values, top_w, top_idx, lengths, order, scale):
    """The fused sparse part's forward launch: ``(B, H, N, Ev)`` in ``v``'s dtype and ``q``'s layout."""
    B, H, N, _ = q.shape
    # zeros: padded queries are in no block; the queries' layout (fastasr.kernels.rows)
    out = new_rows(B, H, N, v.shape[3], heads_inner(q), dtype=v.dtype, device=q.device, zero=True)
    if out.numel():
        _launch_sparse(_sparse_fwd_kernel, q, k, v, top_idx, lengths, order, scale,
                       (top_w, values, out), out.stride()[:3])
    return out


def sparse_backward(q, k, v, top_w, top_idx, lengths, order, scale, grad):
    """The fused sparse part's backward launch: ``dq`` in ``q``'s dtype and layout, and the
    float32 sums ``dk``, ``dv`` (in ``k``'s and ``v``'s layouts), ``dtop_w`` and ``dvalues``."""
    B, H, N, E = q.shape
    S, EV, C = k.shape[2], v.shape[3], top_idx.shape[2]
    f32 = dict(dtype=torch.float32, device=q.device)
    # each gradient in its input's layout (fastasr.kernels.rows); the float32 sums of dk, dv,
    # dtop_w and dvalues share one buffer, zeroed by one launch
    dq = new_rows(B, H, N, E, heads_inner(q), dtype=q.dtype, device=q.device, zero=True)
    sizes = (B * H * S * E, B * H * S * EV, top_w.numel(), B * H * C * EV)
    dk, dv, dtop_w, dvalues = torch.zeros(sum(sizes), **f32).split(sizes)
    dk, dv = rows_view(dk, B, H, S, E, heads_inner(k)), rows_view(dv, B, H, S, EV, heads_inner(v))
    dtop_w, dvalues = dtop_w.view(top_w.shape), dvalues.view(B, H, C, EV)
    if grad.numel():
        _launch_sparse(_sparse_bwd_kernel, q, k, v, top_idx, lengths, order, scale,
                       (top_w, grad, dq, dk, dv, dtop_w, dvalues),
                       (*grad.stride(), *dq.stride()[:3], *dk.stride()[:3], *dv.stride()[:3]))
    return dq, dk, dv, dtop_w, dvalues


class _ImprovedSparse(torch.autograd.Function):
    """The fused sparse part: one launch forward, one backward (:func:`improved_sparse`)."""

    @staticmethod
    def forward(ctx, q, k, v, values, top_w, top_idx, lengths, order, scale):
        ctx.save_for_backward(q, k, v, top_w, top_idx, lengths)
        ctx.order, ctx.scale, ctx.values_dtype = order, scale, values.dtype
        return sparse_forward(q, k, v, values, top_w, top_idx, lengths, order, scale)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, top_w, top_idx, lengths = ctx.saved_tensors
        dq, dk, dv, dtop_w, dvalues = sparse_backward(q, k, v, top_w, top_idx, lengths, ctx.order, ctx.scale, grad)
        # .to keeps a dense tensor's layout (and is dk itself in k's dtype)
        return (dq, dk.to(k.dtype), dv.to(v.dtype), dvalues.to(ctx.values_dtype),
                dtop_w.to(top_w.dtype), None, None, None, None)


def check_sparse_inputs(op: str, q, k, v, top_idx, assignments) -> None:
    """That the fused sparse kernels run here and serve ``q``, ``k``, ``v``, ``top_idx (B, H, C,
    K)`` and ``assignments``: a ``ValueError`` (or ``TypeError``) naming ``op`` otherwise."""
    require_triton(op, q.device, kernels_interpreted(_sparse_fwd_kernel))
    _check(op, q, k, top_idx, assignments, "q", "k")
    _check(op, q, v, top_idx, assignments, "q", "v")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"{op}: q has E={q.shape[-1]}, k has E={k.shape[-1]}; q and k must agree")


def improved_sparse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    values: torch.Tensor,
    top_w: torch.Tensor,
    top_idx: torch.Tensor,
    assignments: torch.Tensor,
    lengths: torch.Tensor | None,
    scale: float,
    *,
    counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """``reference.improved_sparse`` fused into one Triton launch forward and one backward.

    Per one-cluster block the forward scores the block's queries against its cluster's
    valid top keys, takes the softmax, weighs the values, scales by the cluster's mass and
    adds its rest (the mass and the rest computed in the kernel from ``top_w`` and
    ``values``: nothing of size ``C × K × E`` is gathered). The backward recomputes the
    softmax (nothing of size ``N × K`` is stored) and adds ``dk``, ``dv``, ``dtop_w`` and
    ``dvalues`` with atomics, so those are reproducible to rounding, not bit for bit.
    ``counts`` (K-means' members per cluster, when given) spares the cluster order its count.
    Half-precision ``q``, ``k``, ``v`` reach the tensor-core dots as they are (scores,
    softmax, mass and rest in fp32). Same arguments and result as the reference.
    """
    check_sparse_inputs("improved_sparse", q, k, v, top_idx, assignments)
    B, H, N, E = q.shape
    C = top_idx.shape[2]
    if values.shape != (B, H, C, v.shape[-1]) or top_w.shape != top_idx.shape:
        raise ValueError(f"improved_sparse: values {tuple(values.shape)} must be (B, H, C, Ev) = "
                         f"{(B, H, C, v.shape[-1])} and top_w {tuple(top_w.shape)} as top_idx "
                         f"{tuple(top_idx.shape)}")
    order = cluster_order(assignments, C, counts)
    if lengths is None:
        lengths = torch.full((B,), N, dtype=torch.int64, device=q.device)
    lengths = lengths.to(device=q.device, dtype=torch.int64)
    return _ImprovedSparse.apply(q, k, v, values.contiguous(), top_w.contiguous(), top_idx, lengths,
                                 order, scale)
