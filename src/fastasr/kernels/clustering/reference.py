"""The PyTorch reference backend of the clustering ops: every op of
:class:`~fastasr.kernels.clustering.backend.ClusteringBackend` (its signatures, shapes and
conventions), and the helpers the other backends share.

These are the ground truth the C++ and Triton kernels are tested against, and what
:mod:`fastasr.kernels.clustering.ops` runs where no kernel does. They are written
for clarity first and reasonable speed second (no Python loops over batch,
heads or positions).

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

from fastasr.kernels.clustering.backend import MAX_BITS
from fastasr.kernels.clustering.gathers import gather_dot, gather_weighted_sum
from fastasr.kernels.padding import key_mask, valid_positions

__all__ = [
    "MAX_BITS",
    "popcount",
    "unpack_bits",
    "pack_bits",
    "hash_codes",
    "check_hash_inputs",
    "hamming_kmeans",
    "hash_kmeans",
    "fixed_point_iteration",
    "clustered_dot",
    "clustered_weighted_sum",
    "gather_clusters",
    "broadcast_clusters",
    "cluster_sums",
    "cluster_means",
    "topk_indices",
    "centroid_logits",
    "centroid_attention",
    "improved_sparse",
    "improved_clustered",
]


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
    """:meth:`ClusteringBackend.hash_codes <fastasr.kernels.clustering.backend.ClusteringBackend.hash_codes>`:
    one product with the planes, its signs packed."""
    B, H, N, E = check_hash_inputs("hash_codes", x, planes)
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    w = planes.to(device=x.device, dtype=dtype)
    proj = torch.matmul(x.detach().to(dtype), w[:E]) + w[E]
    codes = pack_bits(proj > 0)
    valid = valid_positions(lengths, B, N, x.device)
    return codes.masked_fill(~valid[:, None, :], 0)


def check_hash_inputs(op: str, x: torch.Tensor, planes: torch.Tensor) -> tuple[int, int, int, int]:
    """``x`` ``(B, H, N, E)`` and ``planes`` ``(E + 1, bits)`` with ``1 <= bits <= MAX_BITS``, else
    a ValueError naming ``op``, the argument and what is expected (every backend's hash checks
    these). Returns ``(B, H, N, E)``."""
    if x.dim() != 4:
        raise ValueError(f"{op}: x must be (B, H, N, E), got shape {tuple(x.shape)}")
    B, H, N, E = x.shape
    if planes.dim() != 2 or planes.shape[0] != E + 1:
        raise ValueError(f"{op}: planes must be (E+1, bits): E + 1 = {E + 1} rows, got {tuple(planes.shape)}")
    bits = planes.shape[1]
    if not 1 <= bits <= MAX_BITS:
        raise ValueError(f"{op}: {bits} bits; expected 1..{MAX_BITS} (one int64 per code)")
    return B, H, N, E


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
    """:meth:`ClusteringBackend.hamming_kmeans <fastasr.kernels.clustering.backend.ClusteringBackend.hamming_kmeans>`
    by the rules of the module docstring.

    Implementation: with bits mapped to +-1, ``popcount(a ^ c) = (bits - <a, c>) / 2``
    (exact in float32), so the nearest centroid is the largest dot product, found
    with one matmul; an extra constant feature carries a large negative bias for
    unused centroids. ``argmax`` returns the first maximum: ties go to the lowest
    centroid index.
    """
    del generator
    _check_kmeans("hamming_kmeans", clusters, iterations)
    B, H, N = codes.shape
    device = codes.device
    C = clusters
    if N == 0:
        return (
            torch.full((B, H, 0), -1, dtype=torch.int64, device=device),
            torch.zeros(B, H, C, dtype=torch.int64, device=device),
        )
    lloyd = _Lloyd(codes, lengths, C, bits)
    for _ in range(iterations):
        lloyd.iterate()
    assignments = torch.where(lloyd.valid, lloyd.assign(), -1)
    counts = torch.zeros(B, H, C + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(
        2, torch.where(assignments < 0, C, assignments), torch.ones_like(assignments)
    )
    return assignments, counts[..., :C]


def hash_kmeans(
    x: torch.Tensor,
    planes: torch.Tensor,
    lengths: torch.Tensor | None,
    clusters: int,
    iterations: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:meth:`ClusteringBackend.hash_kmeans <fastasr.kernels.clustering.backend.ClusteringBackend.hash_kmeans>`:
    :func:`hash_codes`, then :func:`hamming_kmeans` on the planes' bits."""
    codes = hash_codes(x, planes, lengths)
    return hamming_kmeans(codes, lengths, clusters, iterations, generator, bits=planes.shape[1])


def _check_kmeans(op: str, clusters: int, iterations: int) -> None:
    if clusters < 1:
        raise ValueError(f"{op}: clusters={clusters}; expected >= 1")
    if iterations < 0:
        raise ValueError(f"{op}: iterations={iterations}; expected >= 0")


class _Lloyd:
    """Lloyd's iterations in Hamming space, the state of :func:`hamming_kmeans`: ``centroids``
    ``(B, H, C, bits + 1)`` (+-1 bits, then a bias column: 0 for used centroids, a large negative
    value for unused ones) against ``feats`` ``(B, H, N, bits + 1)`` (+-1 bits, then 1).
    ``codes`` ``(B, H, N)``, ``N >= 1``; ``lengths`` ``(B,)`` or None (all valid)."""

    def __init__(self, codes: torch.Tensor, lengths: torch.Tensor | None, clusters: int, bits: int) -> None:
        B, H, N = codes.shape
        C = self.clusters = clusters
        self.bits = bits
        lens = (torch.full((B,), N, dtype=torch.int64, device=codes.device) if lengths is None
                else lengths.to(device=codes.device, dtype=torch.int64))
        self.valid = valid_positions(lens, B, N, codes.device)[:, None, :]  # (B,1,N)
        centroid_codes, c_eff = initial_centroids(codes, lens, C)  # (B,H,C), (B,)
        used = torch.arange(C, device=codes.device)[None, :] < c_eff[:, None]  # (B,C)
        self.bits01 = unpack_bits(codes, bits)  # (B,H,N,bits)
        self.feats = torch.cat([self.bits01 * 2 - 1, torch.ones_like(self.bits01[..., :1])], dim=-1)
        self.centroids = torch.cat(
            [
                unpack_bits(centroid_codes, bits) * 2 - 1,
                torch.where(used, 0.0, -4.0 * bits)[:, None, :, None].expand(B, H, C, 1),
            ],
            dim=-1,
        )

    def assign(self) -> torch.Tensor:
        """``(B, H, N)`` nearest used centroid of every position (ties: the lowest index)."""
        return torch.matmul(self.feats, self.centroids.transpose(-1, -2)).argmax(dim=-1)

    def iterate(self) -> None:
        """One iteration: assign, then the strict per-bit majority of each non-empty cluster."""
        bits01, C, bits = self.bits01, self.clusters, self.bits
        B, H, N, _ = bits01.shape
        slot = torch.where(self.valid, self.assign(), C)  # padded positions -> dropped row C
        ones = bits01.new_zeros(B, H, C + 1, bits).scatter_add_(
            2, slot[..., None].expand(B, H, N, bits), bits01
        )[:, :, :C]
        counts = bits01.new_zeros(B, H, C + 1).scatter_add_(2, slot, torch.ones_like(bits01[..., 0]))[..., :C]
        majority = (2 * ones > counts[..., None]).to(bits01.dtype) * 2 - 1
        self.centroids[..., :bits] = torch.where(counts[..., None] > 0, majority, self.centroids[..., :bits])


@torch.no_grad()
def fixed_point_iteration(
    codes: torch.Tensor, lengths: torch.Tensor | None, clusters: int, iterations: int, *, bits: int = MAX_BITS
) -> torch.Tensor:
    """``(B, H)`` int64: the first of :func:`hamming_kmeans`' Lloyd iterations that moved no
    centroid of the sequence (1-based), or -1 if every one moved some.

    From there every later iteration repeats it exactly, so the kernels stop (the C++ kernel
    after that iteration, the Triton one-launch kernel after that sweep) and return what all
    ``iterations`` would. benchmarks/gpu/notes.md "Answered questions" has its counts on models' queries.
    """
    _check_kmeans("fixed_point_iteration", clusters, iterations)
    B, H, N = codes.shape
    if N == 0:
        raise ValueError("fixed_point_iteration: codes have no positions; expected (B, H, N >= 1)")
    lloyd = _Lloyd(codes, lengths, clusters, bits)
    first = torch.full((B, H), -1, dtype=torch.int64, device=codes.device)
    for it in range(1, iterations + 1):
        before = lloyd.centroids[..., :bits].clone()
        lloyd.iterate()
        still = (lloyd.centroids[..., :bits] == before).all(-1).all(-1)
        first = torch.where((first < 0) & still, it, first)
    return first


def _per_query_index(topk_idx: torch.Tensor, assignments: torch.Tensor) -> torch.Tensor:
    """``(B,H,C,K)`` per-cluster key indices -> ``(B,H,N,K)`` per-query (cluster 0 for padded)."""
    K = topk_idx.shape[-1]
    a = assignments.clamp(min=0)
    return topk_idx.gather(2, a[..., None].expand(*a.shape, K))


def clustered_dot(
    q: torch.Tensor, k: torch.Tensor, topk_idx: torch.Tensor, assignments: torch.Tensor
) -> torch.Tensor:
    """:meth:`ClusteringBackend.clustered_dot <fastasr.kernels.clustering.backend.ClusteringBackend.clustered_dot>`:
    each query's keys gathered (:func:`~fastasr.kernels.clustering.gathers.gather_dot`)."""
    out = gather_dot(q, k, _per_query_index(topk_idx, assignments))
    return out.masked_fill((assignments < 0)[..., None], 0)


def clustered_weighted_sum(
    w: torch.Tensor, v: torch.Tensor, topk_idx: torch.Tensor, assignments: torch.Tensor
) -> torch.Tensor:
    """:meth:`ClusteringBackend.clustered_weighted_sum <fastasr.kernels.clustering.backend.ClusteringBackend.clustered_weighted_sum>`:
    each query's values gathered (:func:`~fastasr.kernels.clustering.gathers.gather_weighted_sum`)."""
    w = w.masked_fill((assignments < 0)[..., None], 0)
    return gather_weighted_sum(w, v, _per_query_index(topk_idx, assignments))


# --- improved clustered attention: the per-query part -----------------------------


def gather_clusters(x: torch.Tensor, assignments: torch.Tensor) -> torch.Tensor:
    """Per-cluster rows ``x (B, H, C, ...)`` -> per-query rows ``(B, H, N, ...)`` (cluster 0 for padded)."""
    a = assignments.clamp(min=0)
    index = a.view(*a.shape, *([1] * (x.dim() - 3))).expand(*a.shape, *x.shape[3:])
    return x.gather(2, index)


def broadcast_clusters(x: torch.Tensor, assignments: torch.Tensor, *, like: torch.Tensor | None = None) -> torch.Tensor:
    """:meth:`ClusteringBackend.broadcast_clusters <fastasr.kernels.clustering.backend.ClusteringBackend.broadcast_clusters>`:
    one gather from ``x`` with an appended zero row that the padded positions index; the result
    contiguous (``like`` unused)."""
    B, H, C, D = x.shape
    padded = torch.cat([x, x.new_zeros(B, H, 1, D)], dim=2)
    slot = assignments.remainder(C + 1)  # padded (-1): C, the zero row
    return padded.gather(2, slot[..., None].expand(*slot.shape, D))


def cluster_sums(rows: torch.Tensor, assignments: torch.Tensor, clusters: int) -> torch.Tensor:
    """Per-position rows ``(B, H, N, D)`` -> each cluster's sum of its members' rows ``(B, H, C, D)``,
    float32 (float64 stays); positions whose assignment is -1 (padded) belong to none.

    One ``index_add`` over the flattened rows; padded positions go to a dropped extra row.
    Differentiable in ``rows`` (each position's gradient: its cluster's).
    """
    B, H, N, D = rows.shape
    C = clusters
    dt = torch.float64 if rows.dtype == torch.float64 else torch.float32
    slot = assignments.remainder(C + 1)  # padded (-1): C, the extra row
    index = (torch.arange(B * H, device=rows.device).view(B, H, 1) * (C + 1) + slot).reshape(-1)
    sums = torch.zeros(B * H * (C + 1), D, dtype=dt, device=rows.device)
    sums = sums.index_add(0, index, rows.reshape(B * H * N, D).to(dt)).view(B, H, C + 1, D)
    return sums[:, :, :C]


def cluster_means(rows: torch.Tensor, assignments: torch.Tensor, counts: torch.Tensor, clusters: int) -> torch.Tensor:
    """:meth:`ClusteringBackend.cluster_means <fastasr.kernels.clustering.backend.ClusteringBackend.cluster_means>`:
    :func:`cluster_sums` over ``max(count, 1)`` (each position's gradient: its cluster's over
    its count)."""
    sums = cluster_sums(rows, assignments, clusters)
    return sums / counts.clamp(min=1)[..., None].to(sums.dtype)


def topk_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """:meth:`ClusteringBackend.topk_indices <fastasr.kernels.clustering.backend.ClusteringBackend.topk_indices>`:
    ``torch.topk``, unsorted (ties broken as it breaks them)."""
    return scores.detach().topk(k, dim=-1, sorted=False).indices


def centroid_logits(
    centroids: torch.Tensor, k: torch.Tensor, lengths: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """``scale * centroids @ k^T`` ``(B, H, C, N)`` in the centroids' dtype, ``-inf`` at masked keys.

    Args:
        centroids: ``(B, H, C, E)`` float32/float64; k: ``(B, H, N, E)`` (multiplied in
            its own dtype, so half-precision keys use half-precision products).
        lengths: ``(B,)`` or None (keys as :func:`~fastasr.kernels.padding.key_mask`).
    """
    B, _, _, _ = centroids.shape
    N = k.shape[2]
    scores = torch.matmul(centroids.to(k.dtype), k.transpose(-1, -2))
    logits = scores.to(centroids.dtype) * scale
    keys_ok = key_mask(lengths, B, N, k.device)
    return logits.masked_fill(~keys_ok[:, None, None, :], float("-inf"))


def centroid_attention(
    centroids: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor | None,
    scale: float,
    topk: int,
    *,
    select=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:meth:`ClusteringBackend.centroid_attention <fastasr.kernels.clustering.backend.ClusteringBackend.centroid_attention>`:
    the ``(B, H, C, N)`` logits (:func:`centroid_logits`), their softmax, its product with ``v``.

    ``select``: an implementation of :func:`topk_indices` (default: this module's; the
    dispatcher passes its own, so that on CUDA the Triton top-k selects).
    """
    logits = centroid_logits(centroids, k, lengths, scale)
    weights = logits.softmax(-1)
    values = torch.matmul(weights.to(v.dtype), v)
    top_idx = (select or topk_indices)(logits, topk) if topk else logits.new_empty(
        *logits.shape[:3], 0, dtype=torch.int64
    )
    return values, weights.gather(-1, top_idx), top_idx


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
    dot=None,
    wsum=None,
) -> torch.Tensor:
    """:meth:`ClusteringBackend.improved_sparse <fastasr.kernels.clustering.backend.ClusteringBackend.improved_sparse>`
    by its formula, half-precision inputs computed in float32 (``counts`` unused).

    ``dot``, ``wsum``: implementations of :func:`clustered_dot` and
    :func:`clustered_weighted_sum` (default: this module's). With others given, half-precision
    ``q``, ``k``, ``v`` reach them as they are (the softmax, the mass and the rest are float32).
    """
    out_dtype = v.dtype
    if dot is None:
        dt = torch.float64 if q.dtype == torch.float64 else torch.float32
        q, k, v, values, top_w = (t.to(dt) for t in (q, k, v, values, top_w))
    dot = dot or clustered_dot
    wsum = wsum or clustered_weighted_sum
    B, H, N, _ = q.shape
    C = top_idx.shape[2]
    keys_ok = key_mask(lengths, B, N, q.device)
    top_ok = keys_ok[:, None, None, :].expand(B, H, C, N).gather(-1, top_idx)
    top_w = top_w.masked_fill(~top_ok, 0)
    mass = top_w.sum(-1)  # (B,H,C)
    rest = values - gather_weighted_sum(top_w, v.to(top_w.dtype), top_idx)  # (B,H,C,Ev)
    scores = dot(q, k, top_idx, assignments).to(top_w.dtype) * scale
    scores = scores.masked_fill(~gather_clusters(top_ok, assignments), float("-inf"))
    p = scores.softmax(-1) * gather_clusters(mass, assignments)[..., None]
    out = wsum(p.to(v.dtype), v, top_idx, assignments) + gather_clusters(rest, assignments)
    valid = valid_positions(lengths, B, N, q.device)
    return out.masked_fill(~valid[:, None, :, None], 0).to(out_dtype)


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
    """:meth:`ClusteringBackend.improved_clustered <fastasr.kernels.clustering.backend.ClusteringBackend.improved_clustered>`:
    :func:`centroid_attention`, then :func:`improved_sparse`."""
    values, top_w, top_idx = centroid_attention(centroids, k, v, lengths, scale, topk)
    return improved_sparse(q, k, v, values, top_w, top_idx, assignments, lengths, scale, counts=counts)
