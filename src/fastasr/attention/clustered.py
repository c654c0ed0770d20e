"""Clustered attention (Vyas et al. 2020, section 3.2).

Queries are hashed by the sign of random projections, grouped by K-means in
Hamming space, and each group's mean query (its *centroid*) attends to the keys
once; every query receives its centroid's output. Cost O(N C E) instead of
O(N^2 E). The clustering is a discrete choice and is not differentiated; the
gradient flows through the centroid means (to the queries), the keys and the
values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastasr.attention.base import InnerAttention, compute_dtype
from fastasr.attention.masking import key_mask, zero_padded_queries
from fastasr.attention.registry import register
from fastasr.attention.spec import Param
from fastasr.kernels import ops
from fastasr.kernels.reference import MAX_BITS

__all__ = ["ClusteredAttention", "CentroidAttention"]

CLUSTERING_PARAMS = (
    Param("clusters", 100, low=1, doc="number of query clusters C"),
    Param("bits", 63, low=1, high=MAX_BITS, doc="hash bits per query"),
    Param("iterations", 10, low=0, doc="Lloyd iterations of Hamming K-means"),
    Param("seed", None, low=0, optional=True, doc="seed of the hash planes (None: global RNG)"),
)


@dataclass
class CentroidAttention:
    """What the clustering step produces (float tensors in the compute dtype).

    Attributes:
        assignments: ``(B, H, N)`` int64 cluster of each query, -1 if padded.
        counts: ``(B, H, C)`` int64 members per cluster.
        logits: ``(B, H, C, N)`` centroid scores, ``-inf`` at masked keys.
        weights: ``(B, H, C, N)`` ``softmax(logits)``: the centroid attention ``A^c``.
        keys_ok: ``(B, N)`` bool, keys that may be attended.
    """

    assignments: torch.Tensor
    counts: torch.Tensor
    logits: torch.Tensor
    weights: torch.Tensor
    keys_ok: torch.Tensor


def gather_clusters(x: torch.Tensor, assignments: torch.Tensor) -> torch.Tensor:
    """Per-cluster rows ``x (B, H, C, ...)`` -> per-query rows ``(B, H, N, ...)`` (cluster 0 for padded)."""
    a = assignments.clamp(min=0)
    index = a.view(*a.shape, *([1] * (x.dim() - 3))).expand(*a.shape, *x.shape[3:])
    return x.gather(2, index)


@register
class ClusteredAttention(InnerAttention):
    """Clustered attention with ``clusters`` centroids per sequence and head."""

    name = "clustered"
    number_param = "clusters"
    params = CLUSTERING_PARAMS

    def centroid_attention(
        self, q: torch.Tensor, k: torch.Tensor, lengths: torch.Tensor | None
    ) -> CentroidAttention:
        """Hash and cluster the queries, then compute each centroid's attention over the keys.

        Args:
            q, k: ``(B, H, N, E)`` in the compute dtype. lengths: ``(B,)`` or None.
        """
        B, H, N, E = q.shape
        planes = self._randn(E + 1, self.bits).to(device=q.device, dtype=q.dtype)
        codes = ops.hash_codes(q, planes, lengths)
        assignments, counts = ops.hamming_kmeans(
            codes, lengths, self.clusters, self.iterations, bits=self.bits
        )
        C = self.clusters
        # Mean query per cluster; padded queries go to an extra row that is dropped.
        slot = torch.where(assignments < 0, C, assignments)
        sums = q.new_zeros(B, H, C + 1, E).scatter_add(2, slot[..., None].expand(B, H, N, E), q)
        centroids = sums[:, :, :C] / counts.clamp(min=1)[..., None].to(q.dtype)
        keys_ok = key_mask(lengths, B, N, q.device)
        logits = torch.matmul(centroids, k.transpose(-1, -2)) * self.scale(E)
        logits = logits.masked_fill(~keys_ok[:, None, None, :], float("-inf"))
        return CentroidAttention(assignments, counts, logits, logits.softmax(-1), keys_ok)

    def _forward(self, q, k, v, lengths):
        dt = compute_dtype(q.dtype)
        ca = self.centroid_attention(q.to(dt), k.to(dt), lengths)
        values = torch.matmul(ca.weights, v.to(dt))  # (B,H,C,Ev)
        out = gather_clusters(values, ca.assignments)
        return zero_padded_queries(out, lengths).to(q.dtype)

    def _dense_weights(self, q, k, lengths):
        dt = compute_dtype(q.dtype)
        ca = self.centroid_attention(q.to(dt), k.to(dt), lengths)
        return zero_padded_queries(gather_clusters(ca.weights, ca.assignments), lengths)
