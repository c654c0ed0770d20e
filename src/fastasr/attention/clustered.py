"""Clustered attention (Vyas et al. 2020, section 3.2).

Queries are hashed by the sign of random projections, grouped by K-means in
Hamming space, and each group's mean query (its *centroid*) attends to the keys
once; every query receives its centroid's output. Cost O(N C E) instead of
O(N^2 E). The clustering is a discrete choice and is not differentiated; the
gradient flows through the centroid means (to the queries), the keys and the
values.

Hashing and K-means run as kernels (:mod:`fastasr.kernels.clustering.ops`: C++ on a CPU,
Triton on a GPU); the centroid attention is two batched matrix products and a
softmax (C++ with BLAS on a CPU; on a GPU one fused SDPA call or the split-key Triton
kernels, and with top keys the fused Triton kernels); the centroids (their members' mean
query) and the broadcast of their values to the queries are ``ops.cluster_means`` and
``ops.broadcast_clusters`` (Triton kernels where they run, else torch's ``index_add`` and gather).
Half-precision inputs on a GPU stay half precision up to the matrix products (float32
accumulation); centroid means and softmaxes are float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastasr.attention.base import InnerAttention, compute_dtype, kernel_dtype
from fastasr.attention.masking import key_mask
from fastasr.attention.registry import register
from fastasr.attention.spec import Param
from fastasr.kernels.clustering import ops, reference
from fastasr.kernels.clustering.reference import MAX_BITS
from fastasr.kernels.ranges import profiled_range

__all__ = ["ClusteredAttention", "CentroidAttention"]

CLUSTERING_PARAMS = (
    Param("clusters", low=1, doc="number of query clusters C"),
    Param("bits", low=1, high=MAX_BITS, doc="hash bits per query"),
    Param("iterations", low=0, doc="Lloyd iterations of Hamming K-means"),
    Param("seed", low=0, optional=True, doc="seed of the hash planes (None: global RNG)"),
)


@dataclass
class CentroidAttention:
    """What the clustering step produces.

    Attributes:
        assignments: ``(B, H, N)`` int64 cluster of each query, -1 if padded.
        counts: ``(B, H, C)`` int64 members per cluster.
        logits: ``(B, H, C, N)`` centroid scores, ``-inf`` at masked keys (float32, or
            float64 for float64 inputs).
        weights: ``(B, H, C, N)`` ``softmax(logits)``: the centroid attention ``A^c``.
        keys_ok: ``(B, N)`` bool, keys that may be attended.
    """

    assignments: torch.Tensor
    counts: torch.Tensor
    logits: torch.Tensor
    weights: torch.Tensor
    keys_ok: torch.Tensor


@register
class ClusteredAttention(InnerAttention):
    """Clustered attention with ``clusters`` centroids per sequence and head.

    ``ClusteredAttention(100)(q, k, v, lengths)``: ``q, k`` ``(B, H, N, E)``, ``v``
    ``(B, H, N, Ev)``, ``lengths`` ``(B,)`` or None -> ``(B, H, N, Ev)``.

    Args:
        clusters: query clusters ``C`` per sequence and head (paper: 100; 25 for short text).
        bits: sign-random-projection hash bits per query, 1 to 63.
        iterations: Lloyd iterations of K-means in Hamming space.
        seed: seed of the hash planes, redrawn identically at every call; None: torch's
            global RNG (new planes every call).

    Raises:
        ValueError: a parameter out of range, naming it and what is expected.
    """

    name = "clustered"
    number_param = "clusters"
    params = CLUSTERING_PARAMS

    def __init__(
        self, clusters: int = 100, *, bits: int = 63, iterations: int = 10, seed: int | None = None
    ) -> None:
        super().__init__()
        self._set_hparams(clusters=clusters, bits=bits, iterations=iterations, seed=seed)

    def hash_planes(self, dim: int, device: torch.device) -> torch.Tensor:
        """``(dim + 1, bits)`` float32 hyperplanes (last row: offsets), drawn on ``device``."""
        return self._randn(dim + 1, self.bits, device=device)

    def cluster_queries(
        self, q: torch.Tensor, lengths: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Hash and cluster the queries ``(B, H, N, E)`` (kernel dtype, :func:`kernel_dtype`).

        Returns ``assignments`` ``(B, H, N)`` (-1 padded), ``counts`` ``(B, H, C)`` and the
        ``(B, H, C, E)`` float32 (float64) centroids, differentiable in ``q``.
        """
        with profiled_range("attention.hash_kmeans"):
            assignments, counts = ops.hash_kmeans(
                q, self.hash_planes(q.shape[-1], q.device), lengths, self.clusters, self.iterations
            )
        with profiled_range("attention.centroid_means"):
            centroids = ops.cluster_means(q, assignments, counts, self.clusters)
        return assignments, counts, centroids

    def centroid_attention(
        self, q: torch.Tensor, k: torch.Tensor, lengths: torch.Tensor | None
    ) -> CentroidAttention:
        """Clustering and the dense ``(B, H, C, N)`` centroid attention (PyTorch reference).

        For :meth:`dense_weights` and tests; the forward pass gets the same numbers
        from the fused :func:`fastasr.kernels.clustering.ops.centroid_attention`.
        """
        B, H, N, E = q.shape
        assignments, counts, centroids = self.cluster_queries(q, lengths)
        logits = reference.centroid_logits(centroids, k, lengths, self.scale(E))
        keys_ok = key_mask(lengths, B, N, q.device)
        return CentroidAttention(assignments, counts, logits, logits.softmax(-1), keys_ok)

    @staticmethod
    def kernel_inputs(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``q, k, v`` in the kernel dtype (:func:`kernel_dtype`), in their own layout where the
        Triton kernels run, else contiguous.

        The model passes head-split views of its projections. The Triton kernels read and
        write rows in that layout (:mod:`fastasr.kernels.rows`), so nothing is copied, forward
        or backward. The C++ kernels and the reference take ``(B, H, N, E)``-contiguous rows:
        one copy each, without which every op of the forward would copy them again.
        """
        dt = kernel_dtype(q)
        if ops.kernel_backend(q, "improved_sparse") == "triton":
            return tuple(t.to(dt) for t in (q, k, v))
        return tuple(t.to(dt).contiguous() for t in (q, k, v))

    def _forward(self, q, k, v, lengths):
        q, k, vv = self.kernel_inputs(q, k, v)
        assignments, _, centroids = self.cluster_queries(q, lengths)
        with profiled_range("attention.centroid_attention"):
            values, _, _ = ops.centroid_attention(
                centroids, k, vv, lengths, self.scale(q.shape[-1]), 0
            )
        with profiled_range("attention.broadcast"):
            return ops.broadcast_clusters(values, assignments, like=q).to(v.dtype)

    def _dense_weights(self, q, k, lengths):
        dt = compute_dtype(q.dtype)
        ca = self.centroid_attention(q.to(dt), k.to(dt), lengths)
        return reference.broadcast_clusters(ca.weights, ca.assignments)
