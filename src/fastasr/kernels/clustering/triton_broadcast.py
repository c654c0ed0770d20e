"""Triton kernels: rows moved between clusters and their members, both ways.

Two ops, each the other's backward, on ``assignments (B, H, N)`` (each position's cluster in
``[0, C)``, -1 for padded positions, which belong to none):

* ``broadcast_clusters(x, assignments)``: ``x (B, H, C, D)`` per-cluster rows -> ``(B, H, N, D)``,
  row ``n`` the row of its cluster, zeros where padded (the twin of
  ``reference.broadcast_clusters``; clustered attention's output: its centroids' values);
* ``cluster_means(rows, assignments, counts, C)``: ``(B, H, N, D)`` -> ``(B, H, C, D)`` float32,
  each cluster's mean of its members' rows (the twin of ``reference.cluster_means``: clustered
  attention's centroids); its backward is the broadcast with each row over its count.

Design:

* ``_broadcast_kernel``: one program a (batch, head) and a block of positions loads their
  clusters and copies whole rows (``D`` contiguous values): one read of the assignments, one
  write of the output, the per-cluster rows from cache;
* ``_cluster_sum_kernel``: one program a (batch, head) and span of positions walks it in tiles;
  a tile's sum by cluster is one tensor-core product ``onehot(clusters)^T @ rows`` (the one-hot
  built ``(C, positions)``, the product's left operand as it is; 0/1 against
  the rows' values, float32 accumulation: exact products), held in registers over the span; the
  program writes its ``(C, D)`` sum once (for the means, over the counts), or adds it with
  atomics when a sequence is split over several spans (few long sequences,
  :func:`cluster_sum_spans`; the means are divided after the launch). No per-position atomics and no
  ``(N, D)`` temporary.

Per-position rows are read and written through their strides in the caller's layout
(:mod:`fastasr.kernels.rows`): a head-split view of projections is neither copied in nor out.

Against the reference's ``torch.gather`` with an index expanded over ``D`` (int64 offsets per
element) and ``index_add`` / ``scatter_add`` (atomics per element), they move whole rows and sum
on chip. Half precision stays half precision in and out of a broadcast; sums are float32.
Rows wider than :data:`MAX_WIDTH`, more clusters than :data:`MAX_CLUSTERS` and sums larger than
:data:`MAX_TILE` are not served (:func:`applies`); ``fastasr.kernels.clustering.ops`` sends them to the
reference. Nothing reads a value back to the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastasr.kernels.availability import (
    kernels_interpreted,
    prepare_interpreter,
    require_triton,
)
from fastasr.kernels.clustering.triton_clustered import dot_config
from fastasr.kernels.grid import cdiv, next_power_of_2
from fastasr.kernels.rows import heads_inner, new_rows, unit_stride

prepare_interpreter()

__all__ = ["broadcast_clusters", "cluster_means", "applies", "cluster_sum_spans", "broadcast_tile", "cluster_sum_tile",
           "MAX_CLUSTERS", "MAX_WIDTH"]

#: Most clusters served: the backward's (C, D) sum is one register tile ...
MAX_CLUSTERS = 256
#: ... rows of at most this many values (one head's) ...
MAX_WIDTH = 64
#: ... and at most this many values in all (both padded to powers of two): 128 clusters of 64
#: values, 256 of 32 (larger sums spill on sm_90 at any warp count).
MAX_TILE = 8192
#: Fewer sequences than this have their sums split over spans, until about this many programs run.
FILL_PROGRAMS = 256
#: Shortest span of a split sum.
MIN_SPAN = 512
_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _broadcast_kernel(x_ptr, assign_ptr, counts_ptr, out_ptr, C, N, D, H, s_ob, s_oh, s_on,
                      MEAN: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    in_n = offs_n < N
    cluster = tl.load(assign_ptr + bh * N + offs_n, mask=in_n, other=-1)
    member = (cluster >= 0)[:, None] & (offs_d[None, :] < D)
    rows = tl.load(x_ptr + (bh * C + cluster)[:, None] * D + offs_d[None, :], mask=member, other=0.0)
    if MEAN:  # a mean's gradient: its cluster's over the count, divided exactly (IEEE round to
        # nearest, as torch's division: `/` on a GPU is an approximate division, 1 ulp off)
        count = tl.load(counts_ptr + bh * C + cluster, mask=cluster >= 0, other=1)
        rows = tl.math.div_rn(rows.to(tl.float32), tl.maximum(count, 1).to(tl.float32)[:, None])
    out = out_ptr + (bh // H) * s_ob + (bh % H) * s_oh  # the output rows through their strides
    tl.store(out + offs_n[:, None] * s_on + offs_d[None, :], rows, mask=in_n[:, None] & (offs_d[None, :] < D))


@triton.jit
def _cluster_sum_kernel(dout_ptr, assign_ptr, counts_ptr, dx_ptr, C, N, D, SPAN, H, s_gb, s_gh, s_gn,
                        ATOMIC: tl.constexpr, MEAN: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    rows_in = dout_ptr + (bh // H) * s_gb + (bh % H) * s_gh  # the per-position rows through their strides
    start = tl.program_id(1) * SPAN
    offs_c = tl.arange(0, BLOCK_C)
    offs_d = tl.arange(0, BLOCK_D)
    acc = tl.zeros((BLOCK_C, BLOCK_D), tl.float32)
    for n0 in range(start, tl.minimum(start + SPAN, N), BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        in_n = offs_n < N
        cluster = tl.load(assign_ptr + bh * N + offs_n, mask=in_n, other=-1)
        # The (C, positions) one-hot as the product's left operand, built in that orientation: its
        # transpose, built (positions, C), went through shared memory and took the rows' loads
        # with it (scalar loads, no pipelining): 1,525 instructions a tile against 337 (bf16, C =
        # 100, D = 32, sm_90). A select of 1.0 or 0.0: a boolean's .to() converts each value (I2F,
        # a quarter of the ALU's rate; compile_check.loop_conversions). Padded (-1): no cluster.
        onehot_t = tl.where(offs_c[:, None] == cluster.to(tl.int32)[None, :], 1.0, 0.0).to(DOT_DTYPE)
        grad = tl.load(rows_in + offs_n[:, None] * s_gn + offs_d[None, :],
                       mask=in_n[:, None] & (offs_d[None, :] < D), other=0.0).to(DOT_DTYPE)
        acc = tl.dot(onehot_t, grad, acc, input_precision=PRECISION)
    ptrs = dx_ptr + (bh * C + offs_c)[:, None] * D + offs_d[None, :]
    mask = (offs_c[:, None] < C) & (offs_d[None, :] < D)
    if ATOMIC:  # the sequence is split over spans: their sums meet in float32
        tl.atomic_add(ptrs, acc, mask=mask, sem="relaxed")
    else:
        if MEAN:  # each sum over its count: the means
            # read in the sum's own layout (a (C,) vector broadcast to it spilled on sm_90)
            count = tl.load(counts_ptr + bh * C + offs_c[:, None] + 0 * offs_d[None, :], mask=mask, other=1)
            acc = tl.math.div_rn(acc, tl.maximum(count, 1).to(tl.float32))
        tl.store(ptrs, acc.to(dx_ptr.dtype.element_ty), mask=mask)


def broadcast_tile(D: int) -> dict:
    """The forward's tile for rows of ``D`` values: 2,048 values a program (4 warps)."""
    block_d = max(16, next_power_of_2(D))
    return {"BLOCK_N": max(8, 2048 // block_d), "BLOCK_D": block_d}


def _sum_blocks(C: int, D: int) -> tuple[int, int]:
    return max(16, next_power_of_2(C)), max(16, next_power_of_2(D))


def cluster_sum_tile(C: int, D: int, dtype: torch.dtype) -> dict:
    """The sums' tile: every cluster and the whole row in one accumulator, 64 positions a tile,
    a warp for each 1,024 values of the accumulator (at least 4), for each 512 with float32 rows
    (whose full-precision products hold more: 8 warps spilled a 256 × 32 tile on sm_90 when one
    program stores its sums); no spills at any served shape (``fastasr-kernels
    compile-check``)."""
    block_c, block_d = _sum_blocks(C, D)
    per_warp = 512 if dtype == torch.float32 else 1024
    return {"BLOCK_N": 64, "BLOCK_C": block_c, "BLOCK_D": block_d, "num_warps": max(4, block_c * block_d // per_warp)}


def _serves(C: int, D: int, dtype: torch.dtype) -> bool:
    block_c, block_d = _sum_blocks(C, D)
    return dtype in _SUPPORTED and 1 <= C <= MAX_CLUSTERS and 1 <= D <= MAX_WIDTH and block_c * block_d <= MAX_TILE


def applies(x: torch.Tensor, clusters: int | None = None) -> bool:
    """Whether :func:`broadcast_clusters` serves per-cluster rows like ``x (B, H, C, D)``, or,
    given ``clusters``, :func:`cluster_means` rows like ``x (B, H, N, D)``."""
    return _serves(x.shape[2] if clusters is None else clusters, x.shape[3], x.dtype)


def cluster_sum_spans(sequences: int, length: int) -> int:
    """Programs a sequence of the sums (``_cluster_sum_kernel``): 1 from ``FILL_PROGRAMS``
    sequences, else about that many programs in all, each span at least ``MIN_SPAN`` positions."""
    return max(1, min(cdiv(length, MIN_SPAN), cdiv(FILL_PROGRAMS, sequences)))


def _broadcast(x: torch.Tensor, assignments: torch.Tensor, dtype: torch.dtype, inner: bool,
               counts: torch.Tensor | None = None) -> torch.Tensor:
    """``_broadcast_kernel``: ``(B, H, C, D)`` rows -> ``(B, H, N, D)`` in ``dtype``, stored heads
    inner when ``inner`` (:func:`fastasr.kernels.rows.new_rows`); with ``counts (B, H, C)`` each
    row over its cluster's count (at least 1)."""
    B, H, C, D = x.shape
    N = assignments.shape[2]
    out = new_rows(B, H, N, D, inner, dtype=dtype, device=x.device)
    tile = broadcast_tile(D)
    _broadcast_kernel[(B * H, cdiv(N, tile["BLOCK_N"]))](
        x.contiguous(), assignments, assignments if counts is None else counts, out, C, N, D, H, *out.stride()[:3],
        MEAN=counts is not None, **tile)
    return out


def _cluster_sum(rows: torch.Tensor, assignments: torch.Tensor, C: int,
                 counts: torch.Tensor | None = None) -> torch.Tensor:
    """``_cluster_sum_kernel``: ``(B, H, N, D)`` rows, in any layout with a unit stride along ``D``
    (else copied once), -> ``(B, H, C, D)`` float32 sums by cluster; with ``counts (B, H, C)``
    each over its count (at least 1): the means, divided in the kernel where one program sums a
    sequence, after it where spans of a sequence meet in atomics."""
    rows = unit_stride(rows)
    B, H, N, D = rows.shape
    tile = cluster_sum_tile(C, D, rows.dtype)
    spans = cluster_sum_spans(B * H, N)
    span = cdiv(cdiv(N, spans), tile["BLOCK_N"]) * tile["BLOCK_N"]
    spans = cdiv(N, span)
    atomic = spans > 1
    sums = (torch.zeros if atomic else torch.empty)((B, H, C, D), dtype=torch.float32, device=rows.device)
    dot_dtype, precision = dot_config(rows.dtype, kernels_interpreted(_cluster_sum_kernel))
    mean = counts is not None
    _cluster_sum_kernel[(B * H, spans)](rows, assignments, counts if mean else assignments, sums, C, N, D, span, H,
                                        *rows.stride()[:3], ATOMIC=atomic, MEAN=mean and not atomic,
                                        DOT_DTYPE=dot_dtype, PRECISION=precision, **tile)
    if mean and atomic:
        sums /= counts.clamp(min=1)[..., None].to(sums.dtype)
    return sums


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, assignments, inner):
        ctx.save_for_backward(assignments)
        ctx.clusters, ctx.dtype = x.shape[2], x.dtype
        return _broadcast(x, assignments, x.dtype, inner)

    @staticmethod
    def backward(ctx, dout):
        (assignments,) = ctx.saved_tensors
        return _cluster_sum(dout, assignments, ctx.clusters).to(ctx.dtype), None, None


class _ClusterMeans(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, assignments, counts, clusters):
        ctx.save_for_backward(assignments, counts)
        ctx.dtype, ctx.inner = rows.dtype, heads_inner(rows)
        return _cluster_sum(rows, assignments, clusters, counts)

    @staticmethod
    def backward(ctx, dmeans):
        assignments, counts = ctx.saved_tensors
        # each position: its cluster's gradient over the count, in the rows' dtype and layout
        return _broadcast(dmeans, assignments, ctx.dtype, ctx.inner, counts), None, None, None


def _checked(op: str, C: int, D: int, dtype: torch.dtype, assignments: torch.Tensor, device) -> torch.Tensor:
    """``assignments`` as int64 contiguous, after checking that ``op`` serves these rows."""
    require_triton(op, device, kernels_interpreted(_broadcast_kernel))
    if not _serves(C, D, dtype):
        raise ValueError(f"{op}: needs fp32/fp16/bf16 rows, 1 <= C <= {MAX_CLUSTERS}, "
                         f"1 <= D <= {MAX_WIDTH} and C x D <= {MAX_TILE} (each a power of two); "
                         f"got C={C}, D={D}, {dtype}")
    return assignments.to(torch.int64).contiguous()


def broadcast_clusters(x: torch.Tensor, assignments: torch.Tensor, *, like: torch.Tensor | None = None) -> torch.Tensor:
    """``reference.broadcast_clusters`` in one Triton launch forward and one backward.

    Args:
        x: ``(B, H, C, D)`` per-cluster rows, fp32/fp16/bf16, as :func:`applies` serves.
        assignments: ``(B, H, N)`` int64 cluster of each position in ``[0, C)``, -1 padded.
        like: per-position rows ``(B, H, N, ·)`` whose memory layout the result takes (heads
            inner or not, :mod:`fastasr.kernels.rows`); None: contiguous.

    Returns:
        ``(B, H, N, D)`` in ``x``'s dtype: each position's cluster's row, zeros where padded.

    Raises:
        ValueError: shapes that disagree, or what :func:`applies` refuses.
    """
    if x.dim() != 4 or assignments.dim() != 3 or assignments.shape[:2] != x.shape[:2]:
        raise ValueError(f"broadcast_clusters: x {tuple(x.shape)} and assignments {tuple(assignments.shape)} "
                         "must be (B, H, C, D) and (B, H, N)")
    assignments = _checked("broadcast_clusters", x.shape[2], x.shape[3], x.dtype, assignments, x.device)
    return _Broadcast.apply(x, assignments, like is not None and heads_inner(like))


def cluster_means(rows: torch.Tensor, assignments: torch.Tensor, counts: torch.Tensor, clusters: int) -> torch.Tensor:
    """``reference.cluster_means`` in one Triton launch forward and one backward.

    Args:
        rows: ``(B, H, N, D)`` per-position rows, fp32/fp16/bf16, in any layout with a unit
            stride along ``D`` (their gradient takes the same layout).
        assignments: ``(B, H, N)`` int64 cluster of each position in ``[0, clusters)``, -1 padded.
        counts: ``(B, H, clusters)`` integer members of each cluster (K-means gives them).
        clusters: ``C``, as :func:`applies` serves.

    Returns:
        ``(B, H, C, D)`` float32: each cluster's mean of its members' rows (padded positions
        belong to none; an empty cluster's mean is 0).

    Raises:
        ValueError: shapes that disagree, or what :func:`applies` refuses.
    """
    if rows.dim() != 4 or assignments.shape != rows.shape[:3] or counts.shape != (*rows.shape[:2], clusters):
        raise ValueError(f"cluster_means: rows {tuple(rows.shape)}, assignments {tuple(assignments.shape)} and "
                         f"counts {tuple(counts.shape)} must be (B, H, N, D), (B, H, N) and (B, H, {clusters})")
    assignments = _checked("cluster_means", clusters, rows.shape[3], rows.dtype, assignments, rows.device)
    return _ClusterMeans.apply(rows, assignments, counts.to(torch.int64).contiguous(), clusters)
