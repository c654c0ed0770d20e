"""PyTorch reference implementations of the clustering primitives.

These are the ground truth the Triton kernels are tested against, and the
implementation :mod:`fastasr.kernels.ops` uses for CPU tensors. They are written
for clarity first and reasonable speed second (no Python loops over batch,
heads or positions).

Conventions shared by every op (``B`` batch, ``H`` heads, ``N`` positions,
``E`` features, ``C`` clusters, ``K`` selected keys per cluster):

* ``lengths`` is ``(B,)`` integer or ``None`` (all positions valid); position
  ``n`` of sequence ``b`` is valid iff ``n < lengths[b]``.
* A hash code is an ``int64`` holding up to 63 bits (never negative).
* Padded positions hash to ``0``, get cluster ``-1``, are never counted, and
  produce ``0`` in :func:`clustered_dot` / :func:`clustered_weighted_sum`.

K-means in Hamming space, exactly (the kernels must reproduce this bit for bit):

1. ``C_b = min(C, lengths[b])`` effective clusters; centroid ``c`` (``c < C_b``)
   starts at the code of valid position ``floor(c * lengths[b] / C_b)``;
   centroids ``c >= C_b`` are unused (never nearest, count 0).
2. ``iterations`` times: assign every valid position to the nearest used
   centroid (Hamming distance = popcount of XOR; ties -> lowest centroid
   index), then set every non-empty centroid's bit ``i`` to 1 iff strictly more
   than half of its members have bit ``i`` set (empty clusters keep their
   centroid).
3. A final assignment to the final centroids is returned, with member counts.
"""

from __future__ import annotations

import torch

__all__ = [
    "MAX_BITS",
    "valid_mask",
    "popcount",
    "unpack_bits",
    "pack_bits",
    "hash_codes",
    "hamming_kmeans",
    "clustered_dot",
    "clustered_weighted_sum",
    "gather_dot",
    "gather_weighted_sum",
    "rows_gather_dot",
    "rows_gather_weighted_sum",
    "rows_scatter_outer",
    "flat_index",
]

MAX_BITS = 63  # a code must fit a non-negative int64

# Rows of the (rows, K, E) temporaries materialised at a time by the gather ops.
_GATHER_ROWS = 4096


def valid_mask(lengths: torch.Tensor | None, batch: int, n: int, device) -> torch.Tensor:
    """``(B, N)`` bool, True where ``position < lengths[b]`` (all True if ``lengths`` is None)."""
    if lengths is None:
        return torch.ones(batch, n, dtype=torch.bool, device=device)
    return torch.arange(n, device=device)[None, :] < lengths.to(device)[:, None]


def popcount(x: torch.Tensor) -> torch.Tensor:
    """Number of set bits of each element of a non-negative ``int64`` tensor."""
    x = x - ((x >> 1) & 0x5555555555555555)
    x = (x & 0x3333333333333333) + ((x >> 2) & 0x3333333333333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0F
    x = x + (x >> 8)
    x = x + (x >> 16)
    x = x + (x >> 32)
    return x & 0x7F


def unpack_bits(codes: torch.Tensor, bits: int, dtype=torch.float32) -> torch.Tensor:
    """``(...,)`` int64 codes -> ``(..., bits)`` tensor of 0/1 in ``dtype`` (bit ``i`` at index ``i``)."""
    shifts = torch.arange(bits, device=codes.device)
    return ((codes[..., None] >> shifts) & 1).to(dtype)


def pack_bits(bits01: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`unpack_bits`: ``(..., bits)`` 0/1 (or bool) -> ``(...,)`` int64."""
    nbits = bits01.shape[-1]
    weights = torch.ones(nbits, dtype=torch.int64, device=bits01.device) << torch.arange(
        nbits, device=bits01.device
    )
    return (bits01.to(torch.int64) * weights).sum(-1)


def hash_codes(
    x: torch.Tensor, planes: torch.Tensor, lengths: torch.Tensor | None = None
) -> torch.Tensor:
    """Sign-random-projection hash codes.

    Args:
        x: ``(B, H, N, E)`` vectors (any float dtype; projected in float32, or
            float64 if ``x`` is float64).
        planes: ``(E + 1, bits)`` hyperplanes, the last row being their offsets;
            ``1 <= bits <= 63``.
        lengths: ``(B,)`` valid lengths or None.

    Returns:
        ``(B, H, N)`` int64: bit ``b`` is set iff ``x @ planes[:E, b] + planes[E, b] > 0``.
        Padded positions are 0.
    """
    B, H, N, E = x.shape
    if planes.dim() != 2 or planes.shape[0] != E + 1:
        raise ValueError(
            f"hash_codes: planes must be (E+1, bits) = ({E + 1}, bits); got {tuple(planes.shape)}"
        )
    bits = planes.shape[1]
    if not 1 <= bits <= MAX_BITS:
        raise ValueError(f"hash_codes: {bits} bits; expected 1..{MAX_BITS}")
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    w = planes.to(device=x.device, dtype=dtype)
    proj = torch.matmul(x.detach().to(dtype), w[:E]) + w[E]
    codes = pack_bits(proj > 0)
    valid = valid_mask(lengths, B, N, x.device)
    return codes.masked_fill(~valid[:, None, :], 0)


def initial_centroids(
    codes: torch.Tensor, lens: torch.Tensor, clusters: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic K-means initialisation, shared by the reference and the Triton kernels.

    Args:
        codes: ``(B, H, N)`` int64, ``N >= 1``; lens: ``(B,)`` int64 valid lengths.
        clusters: ``C``.

    Returns:
        ``centroids`` ``(B, H, C)`` int64 — centroid ``c`` starts at the code of valid
        position ``floor(c * lens[b] / C_b)`` with ``C_b = min(C, lens[b])`` (evenly spaced
        valid positions) — and ``c_eff`` ``(B,)`` int64, the number of used centroids ``C_b``.
    """
    B, H, N = codes.shape
    c_eff = torch.clamp(lens, max=clusters)
    cidx = torch.arange(clusters, device=codes.device)
    init_pos = (cidx[None, :] * lens[:, None]) // c_eff.clamp(min=1)[:, None]
    init_pos = init_pos.clamp(max=N - 1)
    centroids = codes.gather(2, init_pos[:, None, :].expand(B, H, clusters))
    return centroids.contiguous(), c_eff


@torch.no_grad()
def hamming_kmeans(
    codes: torch.Tensor,
    lengths: torch.Tensor | None,
    clusters: int,
    iterations: int,
    generator: torch.Generator | None = None,
    *,
    bits: int = MAX_BITS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd's K-means on hash codes with Hamming distance (see the module docstring).

    Args:
        codes: ``(B, H, N)`` int64 codes of at most ``bits`` bits.
        lengths: ``(B,)`` valid lengths or None.
        clusters: number of centroids ``C >= 1``; sequences shorter than ``C`` use
            one centroid per valid position.
        iterations: Lloyd iterations ``>= 0``.
        generator: unused; the initialisation is deterministic. Accepted so that
            every backend shares one signature.
        bits: how many low bits of each code are significant (default 63; fewer
            bits only saves work, the result is the same when the higher bits
            are zero).

    Returns:
        ``assignments`` ``(B, H, N)`` int64 in ``[0, C)``, ``-1`` for padded
        positions, and ``counts`` ``(B, H, C)`` int64 members per centroid.

    Implementation: with bits mapped to +-1, ``popcount(a ^ c) = (bits - <a, c>) / 2``
    (exact in float32), so the nearest centroid is the largest dot product, found
    with one matmul; an extra constant feature carries a large negative bias for
    unused centroids. ``argmax`` returns the first maximum: ties go to the lowest
    centroid index.
    """
    del generator
    if clusters < 1:
        raise ValueError(f"hamming_kmeans: clusters={clusters}; expected >= 1")
    if iterations < 0:
        raise ValueError(f"hamming_kmeans: iterations={iterations}; expected >= 0")
    B, H, N = codes.shape
    device = codes.device
    C = clusters
    if N == 0:
        return (
            torch.full((B, H, 0), -1, dtype=torch.int64, device=device),
            torch.zeros(B, H, C, dtype=torch.int64, device=device),
        )
    lens = (
        torch.full((B,), N, dtype=torch.int64, device=device)
        if lengths is None
        else lengths.to(device=device, dtype=torch.int64)
    )
    valid = valid_mask(lens, B, N, device)[:, None, :]  # (B,1,N)
    centroid_codes, c_eff = initial_centroids(codes, lens, C)  # (B,H,C), (B,)
    used = torch.arange(C, device=device)[None, :] < c_eff[:, None]  # (B,C)

    bits01 = unpack_bits(codes, bits)  # (B,H,N,bits)
    feats = torch.cat([bits01 * 2 - 1, torch.ones_like(bits01[..., :1])], dim=-1)
    centroids = torch.cat(
        [
            unpack_bits(centroid_codes, bits) * 2 - 1,
            torch.where(used, 0.0, -4.0 * bits)[:, None, :, None].expand(B, H, C, 1),
        ],
        dim=-1,
    )  # (B,H,C,bits+1): +-1 bits, then the bias

    def assign() -> torch.Tensor:
        return torch.matmul(feats, centroids.transpose(-1, -2)).argmax(dim=-1)  # (B,H,N)

    for _ in range(iterations):
        slot = torch.where(valid, assign(), C)  # padded positions -> dropped row C
        ones = bits01.new_zeros(B, H, C + 1, bits).scatter_add_(
            2, slot[..., None].expand(B, H, N, bits), bits01
        )[:, :, :C]
        counts = bits01.new_zeros(B, H, C + 1).scatter_add_(
            2, slot, torch.ones_like(bits01[..., 0])
        )[..., :C]
        majority = (2 * ones > counts[..., None]).to(bits01.dtype) * 2 - 1
        centroids[..., :bits] = torch.where(counts[..., None] > 0, majority, centroids[..., :bits])

    assignments = torch.where(valid, assign(), -1)
    counts = torch.zeros(B, H, C + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(
        2, torch.where(assignments < 0, C, assignments), torch.ones_like(assignments)
    )
    return assignments, counts[..., :C]


# --- gathers with chunked, memory-light autograd ---------------------------------


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


def _per_query_index(topk_idx: torch.Tensor, assignments: torch.Tensor) -> torch.Tensor:
    """``(B,H,C,K)`` per-cluster key indices -> ``(B,H,N,K)`` per-query (cluster 0 for padded)."""
    K = topk_idx.shape[-1]
    a = assignments.clamp(min=0)
    return topk_idx.gather(2, a[..., None].expand(*a.shape, K))


def clustered_dot(
    q: torch.Tensor, k: torch.Tensor, topk_idx: torch.Tensor, assignments: torch.Tensor
) -> torch.Tensor:
    """Dot products of every query with the top keys of its cluster.

    Args:
        q: ``(B, H, N, E)`` queries; k: ``(B, H, N, E)`` keys.
        topk_idx: ``(B, H, C, K)`` int64 key positions selected per cluster.
        assignments: ``(B, H, N)`` int64 cluster of each query, ``-1`` if padded.

    Returns:
        ``(B, H, N, K)``: ``q[n] . k[topk_idx[assignments[n], t]]``; 0 for padded queries.
        Differentiable in ``q`` and ``k``.
    """
    out = gather_dot(q, k, _per_query_index(topk_idx, assignments))
    return out.masked_fill((assignments < 0)[..., None], 0)


def clustered_weighted_sum(
    w: torch.Tensor, v: torch.Tensor, topk_idx: torch.Tensor, assignments: torch.Tensor
) -> torch.Tensor:
    """Weighted sum of the values at the top keys of each query's cluster.

    Args:
        w: ``(B, H, N, K)`` weights; v: ``(B, H, N, E)`` values.
        topk_idx: ``(B, H, C, K)`` int64 key positions selected per cluster.
        assignments: ``(B, H, N)`` int64 cluster of each query, ``-1`` if padded.

    Returns:
        ``(B, H, N, E)``: ``sum_t w[n, t] * v[topk_idx[assignments[n], t]]``; 0 for
        padded queries. Differentiable in ``w`` and ``v``.
    """
    w = w.masked_fill((assignments < 0)[..., None], 0)
    return gather_weighted_sum(w, v, _per_query_index(topk_idx, assignments))
