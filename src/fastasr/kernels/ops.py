"""The clustering ops the attention modules call, dispatched by device.

Every op here has the signature and semantics of its namesake in
:mod:`fastasr.kernels.reference` (read that module for shapes and the exact
K-means rules). Three implementations:

* ``reference``: the PyTorch reference (any device; the ground truth);
* ``native``: the C++ CPU kernels (:mod:`fastasr.kernels.native`, built by
  ``make install``): hashing, K-means, top-k selection and the fused per-query part
  of improved clustered attention;
* ``triton``: the Triton kernels (``triton_hashing``, ``triton_kmeans``,
  ``triton_clustered``, ``triton_topk``, ``triton_centroid``, ``triton_broadcast``) for CUDA
  tensors, each for the shapes it serves.

An op an implementation lacks runs the reference (the clustered products on CPU are
fused into ``improved_sparse``; ``topk_indices`` on CUDA takes ``torch.topk`` for rows
longer than ``triton_topk.MAX_N`` and for other dtypes than float32).
All give the same cluster assignments for the same inputs.

``FASTASR_KERNELS`` overrides the choice, read at every call:

* ``auto`` (default, or unset): CUDA -> Triton (float64 clustered products: the
  reference; the model's layer norms and bias gradients while their switches are on,
  ``layer_norm.TRITON_LAYER_NORM`` (on) and ``linear.TRITON_BIAS_GRADIENTS`` (off): ``kernel_backend``'s
  ``auto_triton``), CPU -> the C++ kernels when they are built, else the reference with a
  one-time warning saying why and how to build them.
* ``reference``: the PyTorch reference on every device.
* ``native``: the C++ kernels; CPU tensors only, and an error (not a fallback) when
  they are not built.
* ``triton``: the Triton kernels on every device. CPU tensors then need the
  Triton interpreter (``TRITON_INTERPRET=1`` set before fastasr is imported),
  which is how the kernels are tested without a GPU; if neither CUDA nor the
  interpreter can run them, the first call raises
  :class:`~fastasr.kernels.availability.TritonUnavailableError` saying why.
"""

from __future__ import annotations

import os
from types import ModuleType

import torch

from fastasr.kernels import native, reference
from fastasr.kernels.availability import import_kernel_module
from fastasr.kernels.padding import key_mask
from fastasr.kernels.ranges import profiled_range
from fastasr.kernels.varlen import as_rows, padded_offsets, varlen_attn, varlen_available

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
    "KERNELS_ENV",
    "kernel_choice",
    "kernel_backend",
]

#: Environment variable that forces one implementation: auto | reference | native | triton.
KERNELS_ENV = "FASTASR_KERNELS"

#: Clustered attention's centroid values (no top keys) where the Triton kernels run: for sequences
#: of at least this many keys (padded length), the split-key kernels of
#: :mod:`fastasr.kernels.triton_centroid` (``cdiv(N, SPLIT_KEYS)`` programs a (batch, head), their
#: partial outputs merged by a second launch; one launch backward); shorter ones one fused SDPA
#: call (:func:`fused_centroid_values`), whose forward has one program a (batch, head) and 128
#: centroids: 6 programs for one 65,536-key sequence of 6 heads. The split-key kernels are the
#: faster at 65,536 keys, SDPA at 16,384 and below (benchmarks/gpu/notes.md "Decisions").
SPLIT_KEY_VALUES_FROM = 32768
#: Whether :func:`fused_centroid_values` runs FlashAttention's variable-length kernel where it
#: can (:func:`fastasr.kernels.varlen.varlen_available`: CUDA, half precision) instead of SDPA
#: with a key mask (its memory-efficient kernel): each sequence's ``C`` centroids against its
#: valid keys, the keys read in the attention layer's layout (the ``(B·N, H, E)`` view of its
#: projection), the padding a sequence of keys without queries. Off until a GPU times it:
#: ``make gpu-check``'s step, call and parts tables ("varlen centroid values").
VARLEN_CENTROID_VALUES = False
_CHOICES = ("auto", "reference", "native", "triton")

# The ops each implementation has (the Triton ones: the module holding each kernel).
_TRITON_MODULES = {
    "hash_codes": "triton_hashing",
    "hamming_kmeans": "triton_kmeans",
    "clustered_dot": "triton_clustered",
    "clustered_weighted_sum": "triton_clustered",
    "improved_sparse": "triton_clustered",
    "topk_indices": "triton_topk",
    "broadcast_clusters": "triton_broadcast",
    "cluster_means": "triton_broadcast",
    "layer_norm": "triton_layer_norm",  # fastasr.kernels.layer_norm (not a clustering op; its own switch)
    "column_sums": "triton_column_sums",  # fastasr.kernels.linear's bias gradients (likewise)
    "gelu_dropout": "triton_gelu_dropout",  # fastasr.kernels.dropout's GeluDropout (likewise)
}
_NATIVE_OPS = {
    "hash_codes",
    "hamming_kmeans",
    "topk_indices",
    "centroid_attention",
    "improved_sparse",
    "dropout",  # fastasr.kernels.dropout (not a clustering op; dispatched by the same rules)
}
_NO_FLOAT64 = {"clustered_dot", "clustered_weighted_sum", "improved_sparse",  # Triton: no float64 dots
               "broadcast_clusters", "cluster_means"}


def kernel_choice() -> str:
    """The ``FASTASR_KERNELS`` setting: ``"auto"`` (default), ``"reference"``, ``"native"`` or ``"triton"``."""
    raw = os.environ.get(KERNELS_ENV, "")
    value = raw.strip().lower() or "auto"
    if value not in _CHOICES:
        raise ValueError(f"{KERNELS_ENV}={raw!r}; expected one of: {', '.join(_CHOICES)}")
    return value


def kernel_backend(x: torch.Tensor, op: str = "hash_codes", *, auto_triton: bool = True) -> str:
    """``"triton"``, ``"native"`` or ``"reference"``: what ``op`` runs for tensors like ``x``.
    ``auto_triton``: whether ``auto`` takes the Triton kernels for a CUDA tensor (False: an op
    whose kernels are off until a GPU times them, by its module's switch, takes the reference
    there; ``FASTASR_KERNELS=triton`` still takes them)."""
    choice = kernel_choice()
    if choice == "auto":
        if auto_triton and x.device.type == "cuda":  # (the cheap tests first: the layers ask every call)
            choice = "reference" if op in _NO_FLOAT64 and x.dtype == torch.float64 else "triton"
        elif op in _NATIVE_OPS and x.device.type == "cpu" and native.available():
            choice = "native"
        else:
            choice = "reference"
    if choice == "triton" and op not in _TRITON_MODULES:
        return "reference"
    if choice == "native" and op not in _NATIVE_OPS:
        return "reference"
    return choice


def _backend(x: torch.Tensor, op: str) -> ModuleType:
    """The module implementing ``op`` for tensors like ``x`` (see :func:`kernel_backend`)."""
    backend = kernel_backend(x, op)
    if backend == "reference":
        return reference
    if backend == "native":
        return native
    return import_kernel_module(_TRITON_MODULES[op])


def hash_codes(
    x: torch.Tensor, planes: torch.Tensor, lengths: torch.Tensor | None = None
) -> torch.Tensor:
    """``(B,H,N,E)`` vectors, ``(E+1, bits)`` planes -> ``(B,H,N)`` int64 codes (padded: 0)."""
    return _backend(x, "hash_codes").hash_codes(x, planes, lengths)


def hamming_kmeans(
    codes: torch.Tensor,
    lengths: torch.Tensor | None,
    clusters: int,
    iterations: int,
    generator: torch.Generator | None = None,
    *,
    bits: int = reference.MAX_BITS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B,H,N)`` codes -> assignments ``(B,H,N)`` (padded: -1) and counts ``(B,H,C)``."""
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
        kmeans = import_kernel_module(_TRITON_MODULES["hamming_kmeans"])
        return kmeans.hash_kmeans(x, planes, lengths, clusters, iterations, generator)
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


def _cluster_rows_backend(x: torch.Tensor, op: str, *shape):
    """:mod:`fastasr.kernels.triton_broadcast` for ``op`` where the Triton kernels run and serve
    ``x`` (and ``shape``'s cluster count); else the reference.

    The Triton kernels take a clustered-100 call 20-26 % less time than the reference's
    ``index_add`` and gather, an i-clustered-100 call 8-12 %, at every N from 1,024 to 65,536
    (benchmarks/gpu/notes.md "Decisions")."""
    backend = _backend(x, op)
    return backend if backend is reference or backend.applies(x, *shape) else reference


def broadcast_clusters(x: torch.Tensor, assignments: torch.Tensor, *, like: torch.Tensor | None = None) -> torch.Tensor:
    """``(B,H,C,D)`` per-cluster rows -> ``(B,H,N,D)`` per-position rows, zeros where padded (-1).

    The Triton kernels (:mod:`fastasr.kernels.triton_broadcast`) where they run, for the shapes
    they serve, with the memory layout of ``like`` (per-position rows, e.g. the queries:
    :mod:`fastasr.kernels.rows`); otherwise the reference's gather (contiguous).
    """
    backend = _cluster_rows_backend(x, "broadcast_clusters")
    if backend is reference:
        return reference.broadcast_clusters(x, assignments)
    return backend.broadcast_clusters(x, assignments, like=like)


def cluster_means(rows: torch.Tensor, assignments: torch.Tensor, counts: torch.Tensor, clusters: int) -> torch.Tensor:
    """``(B,H,N,D)`` rows -> ``(B,H,C,D)`` each cluster's mean of its members' rows, float32
    (``counts (B,H,C)``: its members; padded positions belong to none, an empty cluster's mean is 0).

    The Triton kernels (:mod:`fastasr.kernels.triton_broadcast`: the sum and the division in one
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

    Where the Triton kernels run, :func:`fastasr.kernels.triton_centroid.centroid_attention`
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
    if backend is reference:  # the reference's products, its top keys chosen by this module's topk_indices
        return reference.centroid_attention(centroids, k, v, lengths, scale, topk, select=topk_indices)
    return backend.centroid_attention(centroids, k, v, lengths, scale, topk)


def _triton_centroid_kernels(centroids, k, v, topk: int) -> ModuleType | None:
    """:mod:`~fastasr.kernels.triton_centroid` where :func:`centroid_attention` takes it for
    this call (see there), else None."""
    if kernel_backend(k, "improved_sparse") != "triton":
        return None
    if not topk and k.shape[2] < SPLIT_KEY_VALUES_FROM:
        return None
    kernels = import_kernel_module("triton_centroid")
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
    (:mod:`fastasr.kernels.varlen`): sequence ``b``'s ``C`` centroids against its keys
    ``[0, L_b)``, its padding keys a sequence of no queries. ``k`` and ``v`` are read as the
    ``(B·N, H, E)`` rows they are in the attention layer's layout (copied where they are not);
    the centroids, ``B·C`` rows, are copied. A sequence without valid keys attends to all of
    them, as :func:`fastasr.kernels.padding.key_mask` has it. Needs
    :func:`fastasr.kernels.varlen.varlen_available`."""
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
    (:mod:`fastasr.kernels.triton_improved`: their launches forward, one backward for both,
    without casting and adding two gradients of every key and value); otherwise the two ops in
    turn.
    """
    if topk and kernel_backend(q, "improved_sparse") == "triton":
        kernels = import_kernel_module("triton_improved")
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
    """The per-query part of improved clustered attention -> ``(B,H,N,Ev)``; see the reference."""
    backend = _backend(q, "improved_sparse")
    return backend.improved_sparse(q, k, v, values, top_w, top_idx, assignments, lengths, scale, counts=counts)
