"""The clustering ops the attention modules call, each sent by device to a backend.

Every op here has the signature and meaning of its method of
:class:`~fastasr.kernels.clustering.backend.ClusteringBackend` (read there for shapes; the
exact K-means rules are :mod:`~fastasr.kernels.clustering.reference`'s). Three backend
objects implement them:

* :data:`REFERENCE`: the PyTorch reference (any device; the ground truth; every op);
* :data:`NATIVE`: the C++ CPU kernels (:mod:`fastasr.kernels.native`, built by
  ``make install``): hashing, K-means, top-k selection, the centroids' attention and the
  fused per-query part of improved clustered attention;
* :data:`TRITON`: the Triton kernels (``triton_hashing``, ``triton_kmeans``,
  ``triton_clustered``, ``triton_topk``, ``triton_centroid``, ``triton_broadcast``,
  ``triton_improved``) for CUDA tensors, each for the shapes it serves.

Which one runs an op for given tensors is :func:`fastasr.kernels.dispatch.kernel_backend`'s
rule (``FASTASR_KERNELS``; re-exported here with :data:`KERNELS_ENV` and :func:`kernel_choice`).
An op a backend lacks runs the reference (the clustered products on CPU are fused into
``improved_sparse``; ``topk_indices`` on CUDA takes ``torch.topk`` for rows longer than
``triton_topk.MAX_N`` and for other dtypes than float32). All give the same cluster
assignments for the same inputs.
"""

from __future__ import annotations

from types import ModuleType

import torch

from fastasr.kernels.availability import import_kernel_module
from fastasr.kernels.clustering import reference
from fastasr.kernels.clustering.backend import MAX_BITS, OPS, ModuleBackend
from fastasr.kernels.clustering.varlen import as_rows, padded_offsets, varlen_attn, varlen_available
from fastasr.kernels.dispatch import (
    KERNELS_ENV,
    NATIVE_OPS,
    TRITON_MODULES,
    kernel_backend,
    kernel_choice,
)
from fastasr.kernels.padding import key_mask
from fastasr.kernels.ranges import profiled_range

__all__ = [
    "hash_codes",
    "hamming_kmeans",
    "hash_kmeans",
    "topk_indices",
    "clustered_dot",
    "clustered_weighted_sum",
    "centroid_attention",
    "SPLIT_KEY_VALUES_FROM",
    "broadcast_clusters",
    "cluster_means",
    "fused_centroid_attention_applies",
    "fused_centroid_values",
    "varlen_centroid_values",
    "improved_sparse",
    "improved_clustered",
    "REFERENCE",
    "NATIVE",
    "TRITON",
    "BACKENDS",
    "KERNELS_ENV",
    "kernel_choice",
    "kernel_backend",
]

#: Clustered attention's centroid values (no top keys) where the Triton kernels run: for sequences
#: of at least this many keys (padded length), the split-key kernels of
#: :mod:`fastasr.kernels.clustering.triton_centroid` (``cdiv(N, SPLIT_KEYS)`` programs a (batch, head), their
#: partial outputs merged by a second launch; one launch backward); shorter ones one fused SDPA
#: call (:func:`fused_centroid_values`), whose forward has one program a (batch, head) and 128
#: centroids: 6 programs for one 65,536-key sequence of 6 heads. The split-key kernels are the
#: faster at 65,536 keys, SDPA at 16,384 and below (benchmarks/gpu/notes.md "Decisions").
SPLIT_KEY_VALUES_FROM = 32768
#: Whether :func:`fused_centroid_values` runs FlashAttention's variable-length kernel where it
#: can (:func:`fastasr.kernels.clustering.varlen.varlen_available`: CUDA, half precision) instead of SDPA
#: with a key mask (its memory-efficient kernel): each sequence's ``C`` centroids against its
#: valid keys, the keys read in the attention layer's layout (the ``(B·N, H, E)`` view of its
#: projection), the padding a sequence of keys without queries. Off until a GPU times it:
#: ``make gpu-check``'s step, call and parts tables ("varlen centroid values").
VARLEN_CENTROID_VALUES = False

#: The PyTorch reference: every op.
REFERENCE = ModuleBackend("reference", dict.fromkeys(OPS, "clustering.reference"))
#: The C++ CPU kernels: the ops :data:`fastasr.kernels.dispatch.NATIVE_OPS` names.
NATIVE = ModuleBackend("native", {op: "native" for op in OPS if op in NATIVE_OPS})
#: The Triton kernels: the ops :data:`fastasr.kernels.dispatch.TRITON_MODULES` sends to them, and
#: the three this module calls them for itself where they serve the shapes (hash_kmeans,
#: centroid_attention, improved_clustered).
TRITON = ModuleBackend(
    "triton",
    {op: module for op, module in TRITON_MODULES.items() if op in OPS}
    | {"hash_kmeans": "clustering.triton_kmeans", "centroid_attention": "clustering.triton_centroid",
       "improved_clustered": "clustering.triton_improved"},
    load=import_kernel_module,
)
#: The backend object of each :func:`kernel_backend` answer.
BACKENDS = {"reference": REFERENCE, "native": NATIVE, "triton": TRITON}


def _backend(x: torch.Tensor, op: str) -> ModuleBackend:
    """The backend implementing ``op`` for tensors like ``x`` (see :func:`kernel_backend`)."""
    return BACKENDS[kernel_backend(x, op)]


def hash_codes(
    x: torch.Tensor, planes: torch.Tensor, lengths: torch.Tensor | None = None
) -> torch.Tensor:
    """``(B,H,N,E)`` vectors, ``(E+1, bits)`` planes -> ``(B,H,N)`` int64 codes (padded: 0):
    :meth:`~fastasr.kernels.clustering.backend.ClusteringBackend.hash_codes`."""
    return _backend(x, "hash_codes").hash_codes(x, planes, lengths)


def hamming_kmeans(
    codes: torch.Tensor,
    lengths: torch.Tensor | None,
    clusters: int,
    iterations: int,
    generator: torch.Generator | None = None,
    *,
    bits: int = MAX_BITS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B,H,N)`` codes -> assignments ``(B,H,N)`` (padded: -1) and counts ``(B,H,C)``:
    :meth:`~fastasr.kernels.clustering.backend.ClusteringBackend.hamming_kmeans`."""
    backend = _backend(codes, "hamming_kmeans")
    return backend.hamming_kmeans(codes, lengths, clusters, iterations, generator, bits=bits)


def hash_kmeans(
    x: torch.Tensor,
    planes: torch.Tensor,
    lengths: torch.Tensor | None,
    clusters: int,
    iterations: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`hash_codes` of ``x`` by ``planes``, clustered by :func:`hamming_kmeans` (``bits``:
    the planes' columns) -> assignments ``(B,H,N)`` (padded: -1) and counts ``(B,H,C)``.

    Where the Triton kernels run both, one op (``triton_kmeans.hash_kmeans``): with
    ``triton_kmeans.HASH_IN_KMEANS`` (off until a GPU times it), where K-means takes one launch,
    that launch hashes each sequence's vectors itself (no codes written or read, no launch of
    the hash's own); elsewhere the two ops."""
    if kernel_backend(x, "hash_codes") == "triton" and kernel_backend(x, "hamming_kmeans") == "triton":
        return TRITON.hash_kmeans(x, planes, lengths, clusters, iterations, generator)
    codes = hash_codes(x, planes, lengths)
    return hamming_kmeans(codes, lengths, clusters, iterations, generator, bits=planes.shape[1])


def topk_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """``(..., N)`` scores -> ``(..., k)`` int64 indices of each row's ``k`` largest, unordered."""
    return _backend(scores, "topk_indices").topk_indices(scores, k)


def clustered_dot(
    q: torch.Tensor, k: torch.Tensor, topk_idx: torch.Tensor, assignments: torch.Tensor
) -> torch.Tensor:
    """``(B,H,N,E)`` q, k, ``(B,H,C,K)`` key indices, ``(B,H,N)`` clusters -> ``(B,H,N,K)`` dots."""
    return _backend(q, "clustered_dot").clustered_dot(q, k, topk_idx, assignments)


def clustered_weighted_sum(
    w: torch.Tensor, v: torch.Tensor, topk_idx: torch.Tensor, assignments: torch.Tensor
) -> torch.Tensor:
    """``(B,H,N,K)`` weights, ``(B,H,N,E)`` values -> ``(B,H,N,E)`` per-query weighted sums."""
    return _backend(w, "clustered_weighted_sum").clustered_weighted_sum(w, v, topk_idx, assignments)


def _cluster_rows_backend(x: torch.Tensor, op: str, *shape) -> ModuleBackend:
    """:data:`TRITON` for ``op`` where the Triton kernels run and serve ``x`` (and ``shape``'s
    cluster count: :func:`fastasr.kernels.clustering.triton_broadcast.applies`); else the reference.

    The Triton kernels take a clustered-100 call 20-26 % less time than the reference's
    ``index_add`` and gather, an i-clustered-100 call 8-12 %, at every N from 1,024 to 65,536
    (benchmarks/gpu/notes.md "Decisions")."""
    backend = _backend(x, op)
    return backend if backend is REFERENCE or backend.module(op).applies(x, *shape) else REFERENCE


def broadcast_clusters(x: torch.Tensor, assignments: torch.Tensor, *, like: torch.Tensor | None = None) -> torch.Tensor:
    """``(B,H,C,D)`` per-cluster rows -> ``(B,H,N,D)`` per-position rows, zeros where padded (-1).

    The Triton kernels (:mod:`fastasr.kernels.clustering.triton_broadcast`) where they run, for the shapes
    they serve, with the memory layout of ``like`` (per-position rows, e.g. the queries:
    :mod:`fastasr.kernels.rows`); otherwise the reference's gather (contiguous).
    """
    return _cluster_rows_backend(x, "broadcast_clusters").broadcast_clusters(x, assignments, like=like)


def cluster_means(rows: torch.Tensor, assignments: torch.Tensor, counts: torch.Tensor, clusters: int) -> torch.Tensor:
    """``(B,H,N,D)`` rows -> ``(B,H,C,D)`` each cluster's mean of its members' rows, float32
    (``counts (B,H,C)``: its members; padded positions belong to none, an empty cluster's mean is 0).

    The Triton kernels (:mod:`fastasr.kernels.clustering.triton_broadcast`: the sum and the division in one
    launch forward, one backward) where they run, for the shapes they serve; otherwise the
    reference's ``index_add`` and division (float64 stays float64).
    """
    return _cluster_rows_backend(rows, "cluster_means", clusters).cluster_means(rows, assignments, counts, clusters)


def centroid_attention(
    centroids: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor | None,
    scale: float,
    topk: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(B,H,C,E)`` centroids -> centroid outputs ``(B,H,C,Ev)``, top weights and top keys ``(B,H,C,topk)``.

    Where the Triton kernels run, :func:`fastasr.kernels.clustering.triton_centroid.centroid_attention`
    for the shapes it serves: with top keys always (faster than torch's products and softmax
    at every N, benchmarks/gpu/notes.md "Decisions"; its logits stay float32 where torch's
    product rounds them to bf16), without (clustered attention) for sequences of at least
    :data:`SPLIT_KEY_VALUES_FROM` keys.
    Otherwise, on CUDA without top keys, in half precision or float32 and unless
    ``FASTASR_KERNELS=reference``: one fused attention call, :func:`fused_centroid_values`.
    Where the reference runs (CUDA with top keys, or no C++ kernels), its top keys are chosen
    by :func:`topk_indices`, so on CUDA by the Triton top-k.
    """
    kernels = _triton_centroid_kernels(centroids, k, v, topk)
    if kernels is not None:
        return kernels.centroid_attention(centroids, k, v, lengths, scale, topk)
    if topk == 0 and fused_centroid_attention_applies(k):
        values = fused_centroid_values(centroids, k, v, lengths, scale)
        return values, values.new_empty(*values.shape[:3], 0), torch.empty(
            *values.shape[:3], 0, dtype=torch.int64, device=values.device)
    backend = _backend(centroids, "centroid_attention")
    if backend is REFERENCE:  # the reference's products, its top keys chosen by this module's topk_indices
        return reference.centroid_attention(centroids, k, v, lengths, scale, topk, select=topk_indices)
    return backend.centroid_attention(centroids, k, v, lengths, scale, topk)


def _triton_centroid_kernels(centroids, k, v, topk: int) -> ModuleType | None:
    """:mod:`~fastasr.kernels.clustering.triton_centroid` where :func:`centroid_attention` takes
    it for this call (see there), else None."""
    if kernel_backend(k, "improved_sparse") != "triton":
        return None
    if not topk and k.shape[2] < SPLIT_KEY_VALUES_FROM:
        return None
    kernels = TRITON.module("centroid_attention")
    return kernels if kernels.applies(centroids, k, v, topk) else None


def fused_centroid_attention_applies(k: torch.Tensor) -> bool:
    """Whether :func:`centroid_attention` without top keys runs :func:`fused_centroid_values` for ``k``."""
    return (k.device.type == "cuda" and k.dtype in (torch.float16, torch.bfloat16, torch.float32)
            and kernel_choice() != "reference")


def fused_centroid_values(
    centroids: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """``softmax(scale · centroids k^T, padded keys masked) v`` as one fused SDPA call.

    The same numbers as the reference's ``values`` (products in ``k``'s dtype, the softmax in
    float32, weights in ``v``'s dtype before the second product) without materialising the
    ``(B, H, C, N)`` logits: on a GPU SDPA's memory-efficient kernel takes the key mask,
    forward and backward; with :data:`VARLEN_CENTROID_VALUES` FlashAttention's variable-length
    kernel where it runs (:func:`varlen_centroid_values`). Differentiable in ``centroids``,
    ``k``, ``v``.
    """
    B, _, _, _ = centroids.shape
    if VARLEN_CENTROID_VALUES and lengths is not None and varlen_available(k, v):
        return varlen_centroid_values(centroids, k, v, lengths, scale)
    keys_ok = key_mask(lengths, B, k.shape[2], k.device)[:, None, None, :]
    out = torch.nn.functional.scaled_dot_product_attention(
        centroids.to(k.dtype), k, v, attn_mask=keys_ok, scale=scale
    )
    return out.to(v.dtype)


def varlen_centroid_values(
    centroids: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """:func:`fused_centroid_values` by FlashAttention's variable-length kernel
    (:mod:`fastasr.kernels.clustering.varlen`): sequence ``b``'s ``C`` centroids against its keys
    ``[0, L_b)``, its padding keys a sequence of no queries. ``k`` and ``v`` are read as the
    ``(B·N, H, E)`` rows they are in the attention layer's layout (copied where they are not);
    the centroids, ``B·C`` rows, are copied. A sequence without valid keys attends to all of
    them, as :func:`fastasr.kernels.padding.key_mask` has it. Needs
    :func:`fastasr.kernels.clustering.varlen.varlen_available`."""
    B, H, C, E = centroids.shape
    N = k.shape[2]
    lengths = lengths.to(device=k.device)
    keys = torch.where(lengths == 0, N, lengths)
    # C queries a sequence and none for its padding: the offsets of C "valid" rows of C
    queries = padded_offsets(torch.full_like(keys, C), C)
    out = varlen_attn(as_rows(centroids.to(k.dtype)), as_rows(k), as_rows(v), queries, padded_offsets(keys, N),
                      C, N, scale=scale)
    return out.view(B, C, H, v.shape[-1]).transpose(1, 2).to(v.dtype)


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
    """Improved clustered attention given its clusters -> ``(B,H,N,Ev)``: :func:`centroid_attention`
    with ``topk`` top keys, then :func:`improved_sparse`.

    Where the Triton kernels take both (up to ``triton_improved.MAX_CENTROIDS`` centroids), one op
    (:mod:`fastasr.kernels.clustering.triton_improved`: their launches forward, one backward for both,
    without casting and adding two gradients of every key and value); otherwise the two ops in
    turn.
    """
    if topk and kernel_backend(q, "improved_sparse") == "triton":
        kernels = TRITON.module("improved_clustered")
        if kernels.applies(centroids, k, v, topk):
            return kernels.improved_clustered(q, k, v, centroids, assignments, counts, lengths, scale, topk)
    with profiled_range("attention.centroid_attention"):
        values, top_w, top_idx = centroid_attention(centroids, k, v, lengths, scale, topk)
    with profiled_range("attention.sparse_part"):
        return improved_sparse(q, k, v, values, top_w, top_idx, assignments, lengths, scale, counts=counts)


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
    """The per-query part of improved clustered attention -> ``(B,H,N,Ev)``:
    :meth:`~fastasr.kernels.clustering.backend.ClusteringBackend.improved_sparse`."""
    backend = _backend(q, "improved_sparse")
    return backend.improved_sparse(q, k, v, values, top_w, top_idx, assignments, lengths, scale, counts=counts)
