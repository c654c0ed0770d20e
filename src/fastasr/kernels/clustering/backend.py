"""The clustering ops' one interface: each op's signature, shapes and meaning, written once.

:class:`ClusteringBackend` is what every implementation provides: the PyTorch reference
(:mod:`~fastasr.kernels.clustering.reference`, every op), the C++ CPU kernels
(:mod:`fastasr.kernels.native`: the ops in :data:`fastasr.kernels.dispatch.NATIVE_OPS`), the
Triton kernels (the ``triton_*`` modules, the ops in
:data:`fastasr.kernels.dispatch.TRITON_MODULES`) and the dispatcher
(:mod:`~fastasr.kernels.clustering.ops`, every op, each call sent to one of the others by the
tensors' device and ``FASTASR_KERNELS``). A backend lacking an op leaves it to the reference.

Each implementation's function takes the parameters of its method here, with the same names,
order, kinds and defaults (``tests/test_kernels_backend.py`` holds it), so a call written
against this interface runs on any of them. An implementation may take further parameters
after these, each with a default (a tuning knob for tests and benchmarks, such as the Triton
hash's ``block_n``, or the reference's hooks through which the Triton backend passes its
kernels); a call through the interface leaves them at their defaults.

Conventions shared by every op (``B`` batch, ``H`` heads, ``N`` positions, ``E`` features,
``Ev`` value features, ``C`` clusters, ``K`` selected keys a cluster):

* ``lengths`` is ``(B,)`` integer or ``None`` (all positions valid); position ``n`` of
  sequence ``b`` is valid iff ``n < lengths[b]``.
* A hash code is an ``int64`` holding up to :data:`MAX_BITS` bits (never negative).
* Padded positions hash to ``0``, get cluster ``-1``, are never counted, and produce ``0`` in
  the per-query outputs.

Every implementation gives the reference's results: the same codes and cluster assignments
bit for bit, the products to float rounding.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Protocol, runtime_checkable

import torch

__all__ = ["MAX_BITS", "ClusteringBackend", "OPS", "op_signature", "ModuleBackend"]

MAX_BITS = 63  # a code must fit a non-negative int64


@runtime_checkable
class ClusteringBackend(Protocol):
    """The clustering ops, as every backend implements them (module docstring)."""

    def hash_codes(
        self, x: torch.Tensor, planes: torch.Tensor, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Sign-random-projection hash codes.

        Args:
            x: ``(B, H, N, E)`` vectors (any float dtype; projected in float32, or float64 if
                ``x`` is float64).
            planes: ``(E + 1, bits)`` hyperplanes, the last row being their offsets;
                ``1 <= bits <= MAX_BITS``.
            lengths: ``(B,)`` valid lengths or None.

        Returns:
            ``(B, H, N)`` int64: bit ``b`` is set iff ``x @ planes[:E, b] + planes[E, b] > 0``.
            Padded positions are 0. No autograd.
        """
        ...

    def hamming_kmeans(
        self,
        codes: torch.Tensor,
        lengths: torch.Tensor | None,
        clusters: int,
        iterations: int,
        generator: torch.Generator | None = None,
        *,
        bits: int = MAX_BITS,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Lloyd's K-means on hash codes with Hamming distance, by the exact rules of
        :mod:`~fastasr.kernels.clustering.reference`'s module docstring (deterministic start,
        ties to the lowest centroid, a strict per-bit majority).

        Args:
            codes: ``(B, H, N)`` int64 codes of at most ``bits`` bits.
            lengths: ``(B,)`` valid lengths or None.
            clusters: number of centroids ``C >= 1``; sequences shorter than ``C`` use one
                centroid per valid position.
            iterations: Lloyd iterations ``>= 0``.
            generator: unused; the initialisation is deterministic. Accepted so that every
                backend shares one signature.
            bits: how many low bits of each code are significant, ``1..MAX_BITS`` (fewer bits
                only save work; the result is the same when the higher bits are zero).

        Returns:
            ``assignments`` ``(B, H, N)`` int64 in ``[0, C)``, ``-1`` for padded positions,
            and ``counts`` ``(B, H, C)`` int64 members per centroid.
        """
        ...

    def hash_kmeans(
        self,
        x: torch.Tensor,
        planes: torch.Tensor,
        lengths: torch.Tensor | None,
        clusters: int,
        iterations: int,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`hash_codes` of ``x`` by ``planes``, clustered by :meth:`hamming_kmeans`
        (``bits``: the planes' columns).

        Args:
            x, planes: as :meth:`hash_codes`'s; lengths, clusters, iterations, generator: as
                :meth:`hamming_kmeans`'s.

        Returns:
            ``assignments`` ``(B, H, N)`` (-1 padded) and ``counts`` ``(B, H, C)``, int64.
        """
        ...

    def topk_indices(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        """Indices ``(..., k)`` int64 of the ``k`` largest entries of each row of ``scores (..., N)``.

        The order of the ``k`` indices is unspecified (callers use them as a set); ties between
        equal scores are broken by each implementation's own rule. No autograd.
        """
        ...

    def clustered_dot(
        self, q: torch.Tensor, k: torch.Tensor, topk_idx: torch.Tensor, assignments: torch.Tensor
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
        ...

    def clustered_weighted_sum(
        self, w: torch.Tensor, v: torch.Tensor, topk_idx: torch.Tensor, assignments: torch.Tensor
    ) -> torch.Tensor:
        """Weighted sum of the values at the top keys of each query's cluster.

        Args:
            w: ``(B, H, N, K)`` weights; v: ``(B, H, N, E)`` values.
            topk_idx: ``(B, H, C, K)`` int64 key positions selected per cluster.
            assignments: ``(B, H, N)`` int64 cluster of each query, ``-1`` if padded.

        Returns:
            ``(B, H, N, E)``: ``sum_t w[n, t] * v[topk_idx[assignments[n], t]]``; 0 for padded
            queries. Differentiable in ``w`` and ``v``.
        """
        ...

    def broadcast_clusters(
        self, x: torch.Tensor, assignments: torch.Tensor, *, like: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Per-cluster rows -> per-position rows.

        Args:
            x: ``(B, H, C, D)`` per-cluster rows.
            assignments: ``(B, H, N)`` int64 cluster of each position in ``[0, C)``, -1 padded.
            like: per-position rows ``(B, H, N, ·)`` whose memory layout the result may take
                (heads inner or not, :mod:`fastasr.kernels.rows`); None: contiguous.

        Returns:
            ``(B, H, N, D)`` in ``x``'s dtype: each position's cluster's row, zeros where
            padded. Differentiable in ``x`` (each cluster's gradient: the sum of its members').
        """
        ...

    def cluster_means(
        self, rows: torch.Tensor, assignments: torch.Tensor, counts: torch.Tensor, clusters: int
    ) -> torch.Tensor:
        """Each cluster's mean of its members' rows.

        Args:
            rows: ``(B, H, N, D)`` per-position rows.
            assignments: ``(B, H, N)`` int64 cluster of each position in ``[0, clusters)``, -1 padded.
            counts: ``(B, H, C)`` integer members of each cluster (K-means gives them).
            clusters: ``C``.

        Returns:
            ``(B, H, C, D)`` float32 (float64 stays float64): the sum of each cluster's members'
            rows over ``max(count, 1)``; padded positions belong to none, an empty cluster's
            mean is 0. Differentiable in ``rows``.
        """
        ...

    def centroid_attention(
        self,
        centroids: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        lengths: torch.Tensor | None,
        scale: float,
        topk: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each centroid's attention over the keys, its output and its top keys.

        Args:
            centroids: ``(B, H, C, E)``; k: ``(B, H, N, E)``; v: ``(B, H, N, Ev)``;
                lengths: ``(B,)`` or None; scale: the logits' factor, ``1/sqrt(E)``;
                topk: keys to select per centroid, ``0 <= topk <= N`` (0: none).

        Returns:
            ``values`` ``(B, H, C, Ev)`` = ``softmax(scale · centroids k^T, padded keys masked)
            @ v`` in ``v``'s dtype (the softmax in the centroids' dtype), ``top_w``
            ``(B, H, C, topk)`` the softmax at the ``top_idx`` ``(B, H, C, topk)`` int64 keys of
            the largest logits (unordered). Differentiable in ``centroids``, ``k``, ``v``
            (``values`` and ``top_w``).
        """
        ...

    def improved_sparse(
        self,
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
        """The per-query part of improved clustered attention (Vyas et al. 2020, eq. 9-11).

        For query ``n`` of cluster ``a`` and the valid keys ``T`` among ``top_idx[a]``::

            out[n] = rest[a] + mass[a] * softmax_t(scale * q_n . k_T[t]) @ v_T
            mass[a] = sum_t top_w[a, t]          rest[a] = values[a] - sum_t top_w[a, t] v_T[t]

        i.e. the centroid's output with the part of its top keys replaced by the query's own
        attention on them, renormalised to the same mass. Keys at or beyond a sequence's
        length are not in ``T`` (they get no weight, even when the sequence is shorter than K).

        Args:
            q, k: ``(B, H, N, E)``; v: ``(B, H, N, Ev)``.
            values: ``(B, H, C, Ev)`` the centroid outputs ``A^c V``.
            top_w: ``(B, H, C, K)`` the centroid weights ``A^c`` at the top keys.
            top_idx: ``(B, H, C, K)`` int64 key positions; assignments: ``(B, H, N)`` int64,
                ``-1`` for padded queries; lengths: ``(B,)`` or None; scale: ``1/sqrt(E)``.
            counts: ``(B, H, C)`` members per cluster when the caller has them (K-means returns
                them); an implementation that orders the queries by cluster takes them instead
                of counting.

        Returns:
            ``(B, H, N, Ev)`` in ``v``'s dtype, 0 for padded queries; differentiable in ``q``,
            ``k``, ``v``, ``values`` and ``top_w``.
        """
        ...

    def improved_clustered(
        self,
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
        """Improved clustered attention given its clusters: :meth:`centroid_attention` with
        ``topk`` top keys, then :meth:`improved_sparse`.

        Args:
            q, k: ``(B, H, N, E)``; v: ``(B, H, N, Ev)``; centroids: ``(B, H, C, E)``;
                assignments: ``(B, H, N)`` int64 cluster of each query, -1 padded;
                counts: ``(B, H, C)`` members per cluster, or None; lengths: ``(B,)`` or None;
                scale: the logits' factor; topk: ``1 <= topk <= N``.

        Returns:
            ``(B, H, N, Ev)`` in ``v``'s dtype, 0 for padded queries; differentiable in ``q``,
            ``k``, ``v`` and ``centroids``.
        """
        ...


#: The ops of :class:`ClusteringBackend`, in the order it lists them.
OPS: tuple[str, ...] = tuple(
    name for name, member in vars(ClusteringBackend).items()
    if inspect.isfunction(member) and not name.startswith("_")
)


def op_signature(op: str) -> inspect.Signature:
    """``op``'s signature as :class:`ClusteringBackend` writes it, without ``self``: the one every
    implementation's function starts with."""
    signature = inspect.signature(getattr(ClusteringBackend, op))
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def _import(name: str) -> ModuleType:
    return importlib.import_module(f"fastasr.kernels.{name}")


class ModuleBackend:
    """A backend object: the ops of :class:`ClusteringBackend` it implements, each the function
    of that name in the module ``modules[op]`` names (under ``fastasr.kernels``, as
    ``clustering.triton_topk``), imported by ``load`` at each use (a module already imported
    costs a dictionary look-up); an op it lacks raises AttributeError (the dispatcher runs the
    reference's)."""

    def __init__(self, name: str, modules: Mapping[str, str],
                 load: Callable[[str], ModuleType] = _import) -> None:
        unknown = sorted(set(modules) - set(OPS))
        if unknown:
            raise ValueError(f"{name} backend: {unknown} are not ops of ClusteringBackend")
        self.name = name
        self.modules = dict(modules)
        self._load = load

    def implements(self, op: str) -> bool:
        return op in self.modules

    def module(self, op: str) -> ModuleType:
        """The module holding this backend's ``op``."""
        return self._load(self.modules[op])

    def __getattr__(self, op: str):
        modules = self.__dict__.get("modules", {})
        if op not in modules:
            raise AttributeError(f"the {self.__dict__.get('name')} backend has no op {op!r}")
        return getattr(self.module(op), op)

    def __repr__(self) -> str:
        return f"ModuleBackend({self.name!r}, {len(self.modules)} ops)"
