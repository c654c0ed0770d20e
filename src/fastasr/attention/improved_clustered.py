"""Improved clustered attention (Vyas et al. 2020, section 3.3, eq. 9-11).

Clustered attention plus an exact correction on the keys that matter most:
from each centroid's attention ``A^c_j`` take the ``topk`` keys ``T_j`` with the
highest weight and their mass ``m_j = sum_{l in T_j} A^c_jl``. Query ``i`` in
cluster ``j`` then gets

    out_i = m_j * softmax(q_i K_{T_j}^T / sqrt(E)) V_{T_j} + sum_{l not in T_j} A^c_jl V_l

i.e. the exact attention of the query itself, renormalised to mass ``m_j``, on
``T_j``, and the centroid's attention elsewhere. Proposition 2: the L1 distance
of every row to full attention is never larger than clustered attention's.

The second term is computed per cluster as ``A^c_j V - sum_{l in T_j} A^c_jl V_l``
(one dense product for all clusters, a K-row correction each); the first, per query,
by :func:`fastasr.kernels.clustering.ops.improved_sparse` (fused in C++ on a CPU, fused in one
Triton launch forward and one backward on a GPU, the PyTorch reference otherwise); on a GPU
both parts are one op with one backward (:func:`fastasr.kernels.clustering.ops.improved_clustered`).

Padded keys are never selected while a valid key remains: the selection ranks
the masked *logits* (``-inf`` at padded keys), not the weights, so a sequence
shorter than ``topk`` selects all its valid keys first; the padded keys that
fill the remaining slots get exactly zero weight in the per-query softmax.
"""

from __future__ import annotations

from fastasr.attention.base import compute_dtype
from fastasr.attention.clustered import CLUSTERING_PARAMS, ClusteredAttention
from fastasr.attention.masking import zero_padded_queries
from fastasr.attention.registry import register
from fastasr.attention.spec import Param
from fastasr.kernels.clustering import ops, reference

__all__ = ["ImprovedClusteredAttention"]


@register
class ImprovedClusteredAttention(ClusteredAttention):
    """Clustered attention with the exact top-k correction; extra cost O(N topk E).

    ``ImprovedClusteredAttention(100)(q, k, v, lengths)``: ``q, k`` ``(B, H, N, E)``,
    ``v`` ``(B, H, N, Ev)``, ``lengths`` ``(B,)`` or None -> ``(B, H, N, Ev)``.

    Args:
        clusters, bits, iterations, seed: as :class:`ClusteredAttention`.
        topk: keys per centroid whose attention is recomputed exactly for each query
            (paper: 32; at most ``N`` are used).

    Raises:
        ValueError: a parameter out of range, naming it and what is expected.
    """

    name = "i-clustered"
    number_param = "clusters"
    params = CLUSTERING_PARAMS + (Param("topk", low=1, doc="keys per centroid recomputed exactly"),)

    def __init__(
        self,
        clusters: int = 100,
        *,
        bits: int = 63,
        iterations: int = 10,
        seed: int | None = None,
        topk: int = 32,
    ) -> None:
        super().__init__(clusters, bits=bits, iterations=iterations, seed=seed)
        self._set_hparams(topk=topk)

    def _forward(self, q, k, v, lengths):
        q, k, vv = self.kernel_inputs(q, k, v)
        scale = self.scale(q.shape[-1])
        assignments, counts, centroids = self.cluster_queries(q, lengths)
        out = ops.improved_clustered(q, k, vv, centroids, assignments, counts, lengths, scale,
                                     min(self.topk, q.shape[2]))
        return out.to(v.dtype)

    def _dense_weights(self, q, k, lengths):
        dt = compute_dtype(q.dtype)
        q, k = q.to(dt), k.to(dt)
        B, H, N, E = q.shape
        ca = self.centroid_attention(q, k, lengths)
        top_idx = ops.topk_indices(ca.logits, min(self.topk, N))
        top_ok = ca.keys_ok[:, None, None, :].expand(*top_idx.shape[:3], N).gather(-1, top_idx)
        mass = ca.weights.gather(-1, top_idx).masked_fill(~top_ok, 0).sum(-1)
        rest = ca.weights.scatter(-1, top_idx, 0.0)
        scores = reference.clustered_dot(q, k, top_idx, ca.assignments) * self.scale(E)
        scores = scores.masked_fill(~reference.gather_clusters(top_ok, ca.assignments), float("-inf"))
        p = scores.softmax(-1) * reference.gather_clusters(mass, ca.assignments)[..., None]
        dense = reference.broadcast_clusters(rest, ca.assignments)
        dense = dense.scatter_add(-1, reference.gather_clusters(top_idx, ca.assignments), p)
        return zero_padded_queries(dense, lengths)
