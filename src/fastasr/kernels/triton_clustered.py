"""Triton kernels: the sparse per-cluster products of improved clustered attention.

Triton twins of ``fastasr.kernels.reference.clustered_dot`` and
``clustered_weighted_sum`` (same shapes, same values, differentiable in the same
arguments):

* ``clustered_dot(q, k, topk_idx, assignments)[b,h,n,t] = q[n] · k[topk_idx[a_n, t]]``
* ``clustered_weighted_sum(w, v, topk_idx, assignments)[b,h,n] = Σ_t w[n,t] v[topk_idx[a_n, t]]``

with ``a_n = assignments[b,h,n]``; padded queries (``a_n = -1``) give 0 and receive
and pass on no gradient.

Design: cluster-sorted blocks. All queries of a cluster use the same ``K`` keys, so
the host sorts each (batch, head)'s positions by cluster once (a stable ``argsort``,
padded queries last; kept for the backward pass). A program takes ``BLOCK_N``
consecutive positions of that order — a few contiguous cluster segments — loads the
rows once, and for each segment loads that cluster's ``K`` key/value rows once and
does one ``tl.dot`` on the tensor cores (fp16/bf16 operands, fp32 accumulator; fp32
inputs in full fp32 precision, no tf32), keeping the rows of the segment. Compared
with gathering ``K`` rows per query this reads each selected row once per segment
instead of once per query, and turns ``N·K`` dot products into matrix products.

The three kernels, and which pass uses them:

=========================  ======================================  =====================
kernel                     computes                                used for
=========================  ======================================  =====================
``_gather_dot_kernel``     ``S[n] = X[n] @ M[idx[a_n]]^T``  (N,K)   dot fwd; ``dw`` of wsum
``_gather_wsum_kernel``    ``O[n] = W[n] @ M[idx[a_n]]``    (N,E)   wsum fwd; ``dq`` of dot
``_scatter_outer_kernel``  ``dM[idx[c]] += W[seg]^T @ X[seg]``      ``dk`` of dot; ``dv`` of wsum
=========================  ======================================  =====================

The scatter sums over a segment first (a ``(K, BLOCK_N) @ (BLOCK_N, E)`` product) and
only then adds the ``(K, E)`` partial into an fp32 buffer with ``atomic_add``: one
atomic per (selected key, feature) per segment instead of one per (query, key,
feature). The order of those float additions varies from run to run, so ``dk``/``dv``
are reproducible to rounding (about 1e-7 relative in fp32), not bit for bit.

Centroid grouping (mean of the queries of each cluster) and the broadcast of centroid
outputs back to queries stay in PyTorch (``index_add_`` / ``gather``): each is one
memory-bound pass over ``N × E``, far cheaper than the ``N × K × E`` products here and
the ``C × N × E`` centroid attention, so fusing them would not pay for its complexity.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastasr.kernels.availability import (
    ensure_interpreter_compat,
    kernels_interpreted,
    require_triton,
)

ensure_interpreter_compat()

__all__ = ["cluster_order", "clustered_dot", "clustered_weighted_sum"]

MAX_FEATURES = 256  # E and K are held whole in one tile
_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _segment_bounds(cl, mask_p, C):
    """First and last real cluster among the block's (sorted) positions."""
    c_lo = tl.min(tl.where(mask_p, cl, C), axis=0)
    c_hi = tl.max(tl.where(mask_p & (cl < C), cl, -1), axis=0)
    return c_lo, c_hi


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
    x_ptr, m_ptr, idx_ptr, perm_ptr, skey_ptr, out_ptr,
    H, N, S, C, K, E,
    s_xb, s_xh, s_xn, s_xe,
    s_mb, s_mh, s_ms, s_me,
    s_ib, s_ih, s_ic, s_it,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_p = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_t = tl.arange(0, BLOCK_K)
    offs_e = tl.arange(0, BLOCK_E)
    mask_p = offs_p < N
    order = pid_bh.to(tl.int64) * N + offs_p
    rows = tl.load(perm_ptr + order, mask=mask_p, other=0)
    cl = tl.load(skey_ptr + order, mask=mask_p, other=C)

    x = tl.load(
        x_ptr + b * s_xb + h * s_xh + rows[:, None] * s_xn + offs_e[None, :] * s_xe,
        mask=mask_p[:, None] & (offs_e[None, :] < E), other=0.0,
    ).to(DOT_DTYPE)
    m_base = m_ptr + b * s_mb + h * s_mh
    i_base = idx_ptr + b * s_ib + h * s_ih

    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    c_lo, c_hi = _segment_bounds(cl, mask_p, C)
    for c in range(c_lo, c_hi + 1):
        keys, _, _ = _load_cluster_rows(m_base, i_base, c, S, K, E, s_ms, s_me, s_ic, s_it,
                                        BLOCK_K, BLOCK_E)
        s = tl.dot(x, tl.trans(keys.to(DOT_DTYPE)), input_precision=PRECISION)
        acc = tl.where((cl == c)[:, None], s, acc)

    out_ptrs = out_ptr + (pid_bh.to(tl.int64) * N + rows[:, None]) * K + offs_t[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty),
             mask=mask_p[:, None] & (offs_t[None, :] < K))


@triton.jit
def _gather_wsum_kernel(
    w_ptr, m_ptr, idx_ptr, perm_ptr, skey_ptr, out_ptr,
    H, N, S, C, K, E,
    s_wb, s_wh, s_wn, s_wt,
    s_mb, s_mh, s_ms, s_me,
    s_ib, s_ih, s_ic, s_it,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_p = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_t = tl.arange(0, BLOCK_K)
    offs_e = tl.arange(0, BLOCK_E)
    mask_p = offs_p < N
    order = pid_bh.to(tl.int64) * N + offs_p
    rows = tl.load(perm_ptr + order, mask=mask_p, other=0)
    cl = tl.load(skey_ptr + order, mask=mask_p, other=C)

    w = tl.load(
        w_ptr + b * s_wb + h * s_wh + rows[:, None] * s_wn + offs_t[None, :] * s_wt,
        mask=mask_p[:, None] & (offs_t[None, :] < K), other=0.0,
    ).to(DOT_DTYPE)
    m_base = m_ptr + b * s_mb + h * s_mh
    i_base = idx_ptr + b * s_ib + h * s_ih

    acc = tl.zeros((BLOCK_N, BLOCK_E), dtype=tl.float32)
    c_lo, c_hi = _segment_bounds(cl, mask_p, C)
    for c in range(c_lo, c_hi + 1):
        vals, _, _ = _load_cluster_rows(m_base, i_base, c, S, K, E, s_ms, s_me, s_ic, s_it,
                                        BLOCK_K, BLOCK_E)
        w_c = tl.where((cl == c)[:, None], w, 0.0)
        acc = tl.dot(w_c, vals.to(DOT_DTYPE), acc, input_precision=PRECISION)

    out_ptrs = out_ptr + (pid_bh.to(tl.int64) * N + rows[:, None]) * E + offs_e[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty),
             mask=mask_p[:, None] & (offs_e[None, :] < E))


@triton.jit
def _scatter_outer_kernel(
    a_ptr, x_ptr, idx_ptr, perm_ptr, skey_ptr, dm_ptr,
    H, N, S, C, K, E,
    s_ab, s_ah, s_an, s_at,
    s_xb, s_xh, s_xn, s_xe,
    s_ib, s_ih, s_ic, s_it,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_p = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_t = tl.arange(0, BLOCK_K)
    offs_e = tl.arange(0, BLOCK_E)
    mask_p = offs_p < N
    mask_e = offs_e < E
    order = pid_bh.to(tl.int64) * N + offs_p
    rows = tl.load(perm_ptr + order, mask=mask_p, other=0)
    cl = tl.load(skey_ptr + order, mask=mask_p, other=C)

    a = tl.load(
        a_ptr + b * s_ab + h * s_ah + rows[:, None] * s_an + offs_t[None, :] * s_at,
        mask=mask_p[:, None] & (offs_t[None, :] < K), other=0.0,
    ).to(DOT_DTYPE)
    x = tl.load(
        x_ptr + b * s_xb + h * s_xh + rows[:, None] * s_xn + offs_e[None, :] * s_xe,
        mask=mask_p[:, None] & mask_e[None, :], other=0.0,
    ).to(DOT_DTYPE)
    i_base = idx_ptr + b * s_ib + h * s_ih
    dm_base = dm_ptr + pid_bh.to(tl.int64) * S * E

    c_lo, c_hi = _segment_bounds(cl, mask_p, C)
    for c in range(c_lo, c_hi + 1):
        in_c = (cl == c)[:, None]
        a_c = tl.where(in_c, a, 0.0)
        x_c = tl.where(in_c, x, 0.0)
        part = tl.dot(tl.trans(a_c), x_c, input_precision=PRECISION)  # (BLOCK_K, BLOCK_E)
        idx = tl.load(i_base + c * s_ic + offs_t * s_it, mask=offs_t < K, other=-1)
        ok = (idx >= 0) & (idx < S)
        tl.atomic_add(dm_base + idx[:, None] * E + offs_e[None, :], part,
                      mask=ok[:, None] & mask_e[None, :])


# --- host side -------------------------------------------------------------------------


def cluster_order(assignments: torch.Tensor, clusters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions sorted by cluster, padded (or out-of-range) positions last.

    Args:
        assignments: ``(B, H, N)`` int64 clusters, ``-1`` for padded positions.
        clusters: ``C``; assignments outside ``[0, C)`` are treated as padded.

    Returns:
        ``perm`` ``(B, H, N)`` int64 (position at each sorted slot) and ``sorted_cluster``
        ``(B, H, N)`` int64 (its cluster, ``C`` for padded), both contiguous.
    """
    key = torch.where((assignments >= 0) & (assignments < clusters), assignments, clusters)
    key = key.to(torch.int64)
    perm = torch.argsort(key, dim=-1, stable=True)
    return perm.contiguous(), key.gather(-1, perm).contiguous()


def _dot_config(dtype: torch.dtype, interpreted: bool):
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

    For K = 32 and E = 32/64 this keeps every kernel at 4 warps between about 95 and
    190 registers per thread with no spills on sm_90 (``python -m
    fastasr.kernels.compile_check``). Not tuned on a GPU yet.
    """
    block_k = max(16, triton.next_power_of_2(K))
    block_e = max(16, triton.next_power_of_2(E))
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


def _launch_dot(x, m, topk_idx, perm, skey, out_dtype):
    """``(B,H,N,E)`` x, ``(B,H,S,E)`` m -> ``(B,H,N,K)``: x[n] · m[idx[a_n, t]]."""
    B, H, N, E = x.shape
    S, C, K = m.shape[2], topk_idx.shape[2], topk_idx.shape[3]
    out = torch.empty((B, H, N, K), dtype=out_dtype, device=x.device)
    if out.numel() == 0:
        return out
    interpreted = kernels_interpreted(_gather_dot_kernel)
    dot_dtype, precision = _dot_config(torch.promote_types(x.dtype, m.dtype), interpreted)
    block_n, block_k, block_e = _blocks(K, E, dot_dtype)
    _gather_dot_kernel[(B * H, triton.cdiv(N, block_n))](
        x, m, topk_idx, perm, skey, out,
        H, N, S, C, K, E,
        *x.stride(), *m.stride(), *topk_idx.stride(),
        DOT_DTYPE=dot_dtype, PRECISION=precision,
        BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_E=block_e,
    )
    return out


def _launch_wsum(w, m, topk_idx, perm, skey, out_dtype):
    """``(B,H,N,K)`` w, ``(B,H,S,E)`` m -> ``(B,H,N,E)``: Σ_t w[n,t] m[idx[a_n, t]]."""
    B, H, N, K = w.shape
    S, E, C = m.shape[2], m.shape[3], topk_idx.shape[2]
    out = torch.empty((B, H, N, E), dtype=out_dtype, device=w.device)
    if out.numel() == 0:
        return out
    interpreted = kernels_interpreted(_gather_wsum_kernel)
    dot_dtype, precision = _dot_config(torch.promote_types(w.dtype, m.dtype), interpreted)
    block_n, block_k, block_e = _blocks(K, E, dot_dtype)
    _gather_wsum_kernel[(B * H, triton.cdiv(N, block_n))](
        w, m, topk_idx, perm, skey, out,
        H, N, S, C, K, E,
        *w.stride(), *m.stride(), *topk_idx.stride(),
        DOT_DTYPE=dot_dtype, PRECISION=precision,
        BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_E=block_e,
    )
    return out


def _launch_scatter(a, x, topk_idx, perm, skey, S, out_dtype):
    """``(B,H,N,K)`` a, ``(B,H,N,E)`` x -> ``(B,H,S,E)``: dM[idx[a_n,t]] += a[n,t] x[n]."""
    B, H, N, K = a.shape
    E, C = x.shape[3], topk_idx.shape[2]
    acc = torch.zeros((B, H, S, E), dtype=torch.float32, device=a.device)
    if a.numel() and acc.numel():
        interpreted = kernels_interpreted(_scatter_outer_kernel)
        dot_dtype, precision = _dot_config(torch.promote_types(a.dtype, x.dtype), interpreted)
        block_n, block_k, block_e = _blocks(K, E, dot_dtype)
        _scatter_outer_kernel[(B * H, triton.cdiv(N, block_n))](
            a, x, topk_idx, perm, skey, acc,
            H, N, S, C, K, E,
            *a.stride(), *x.stride(), *topk_idx.stride(),
            DOT_DTYPE=dot_dtype, PRECISION=precision,
            BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_E=block_e,
        )
    return acc.to(out_dtype)


class _ClusteredDot(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, topk_idx, assignments):
        perm, skey = cluster_order(assignments, topk_idx.shape[2])
        out = _launch_dot(q, k, topk_idx, perm, skey, torch.promote_types(q.dtype, k.dtype))
        ctx.save_for_backward(q, k, topk_idx, perm, skey)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, topk_idx, perm, skey = ctx.saved_tensors
        dq = dk = None
        if ctx.needs_input_grad[0]:  # dq[n] = Σ_t g[n,t] k[idx[a_n,t]]
            dq = _launch_wsum(grad, k, topk_idx, perm, skey, q.dtype)
        if ctx.needs_input_grad[1]:  # dk[idx[c,t]] += Σ_{n in c} g[n,t] q[n]
            dk = _launch_scatter(grad, q, topk_idx, perm, skey, k.shape[2], k.dtype)
        return dq, dk, None, None


class _ClusteredWeightedSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, v, topk_idx, assignments):
        perm, skey = cluster_order(assignments, topk_idx.shape[2])
        out = _launch_wsum(w, v, topk_idx, perm, skey, torch.promote_types(w.dtype, v.dtype))
        ctx.save_for_backward(w, v, topk_idx, perm, skey)
        return out

    @staticmethod
    def backward(ctx, grad):
        w, v, topk_idx, perm, skey = ctx.saved_tensors
        dw = dv = None
        if ctx.needs_input_grad[0]:  # dw[n,t] = g[n] · v[idx[a_n,t]]
            dw = _launch_dot(grad, v, topk_idx, perm, skey, w.dtype)
        if ctx.needs_input_grad[1]:  # dv[idx[c,t]] += Σ_{n in c} w[n,t] g[n]
            dv = _launch_scatter(w, grad, topk_idx, perm, skey, v.shape[2], v.dtype)
        return dw, dv, None, None


def clustered_dot(
    q: torch.Tensor, k: torch.Tensor, topk_idx: torch.Tensor, assignments: torch.Tensor
) -> torch.Tensor:
    """Dot products of every query with the selected keys of its cluster (Triton).

    Args:
        q: ``(B, H, N, E)`` queries; k: ``(B, H, S, E)`` keys (``S = N`` in attention).
        topk_idx: ``(B, H, C, K)`` int64 key positions per cluster, in ``[0, S)``
            (other values select nothing: a zero row).
        assignments: ``(B, H, N)`` int64 cluster per query, ``-1`` if padded.

    Returns:
        ``(B, H, N, K)``: ``q[n] · k[topk_idx[assignments[n], t]]``, 0 for padded queries;
        differentiable in ``q`` and ``k``. fp32/fp16/bf16, accumulated in fp32.
    """
    require_triton("clustered_dot", q.device, kernels_interpreted(_gather_dot_kernel))
    _check("clustered_dot", q, k, topk_idx, assignments, "q", "k")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"clustered_dot: q has E={q.shape[-1]}, k has E={k.shape[-1]}")
    return _ClusteredDot.apply(q, k, topk_idx, assignments)


def clustered_weighted_sum(
    w: torch.Tensor, v: torch.Tensor, topk_idx: torch.Tensor, assignments: torch.Tensor
) -> torch.Tensor:
    """Weighted sums of the selected values of every query's cluster (Triton).

    Args:
        w: ``(B, H, N, K)`` weights; v: ``(B, H, S, E)`` values.
        topk_idx: ``(B, H, C, K)`` int64 key positions per cluster, in ``[0, S)``.
        assignments: ``(B, H, N)`` int64 cluster per query, ``-1`` if padded.

    Returns:
        ``(B, H, N, E)``: ``Σ_t w[n, t] · v[topk_idx[assignments[n], t]]``, 0 for padded
        queries; differentiable in ``w`` and ``v``. fp32/fp16/bf16, accumulated in fp32.
    """
    require_triton("clustered_weighted_sum", w.device, kernels_interpreted(_gather_wsum_kernel))
    _check("clustered_weighted_sum", w, v, topk_idx, assignments, "w", "v")
    if w.shape[-1] != topk_idx.shape[-1]:
        raise ValueError(f"clustered_weighted_sum: w has K={w.shape[-1]}, "
                         f"topk_idx has K={topk_idx.shape[-1]}")
    return _ClusteredWeightedSum.apply(w, v, topk_idx, assignments)
