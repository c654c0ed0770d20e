"""The clustering ops the attention modules call, dispatched by device.

Every op here has the signature and semantics of its namesake in
:mod:`fastasr.kernels.reference` (read that module for shapes and the exact
K-means rules). CUDA tensors run the Triton kernels (``triton_hashing``,
``triton_kmeans``, ``triton_clustered``), CPU tensors the PyTorch reference; both
give the same cluster assignments for the same inputs.

``FASTASR_KERNELS`` overrides the choice, read at every call:

* ``auto`` (default, or unset): CUDA -> Triton, anything else -> reference.
  Float64 clustered products on CUDA also run the reference (the Triton
  products take fp32/fp16/bf16).
* ``reference``: the PyTorch reference on every device.
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

from fastasr.kernels import reference
from fastasr.kernels.availability import import_kernel_module

__all__ = [
    "hash_codes",
    "hamming_kmeans",
    "clustered_dot",
    "clustered_weighted_sum",
    "KERNELS_ENV",
    "kernel_choice",
    "kernel_backend",
]

#: Environment variable that forces one implementation: auto | reference | triton.
KERNELS_ENV = "FASTASR_KERNELS"
_CHOICES = ("auto", "reference", "triton")

# Triton module of each op, and the ops whose Triton kernel takes no float64.
_TRITON_MODULES = {
    "hash_codes": "triton_hashing",
    "hamming_kmeans": "triton_kmeans",
    "clustered_dot": "triton_clustered",
    "clustered_weighted_sum": "triton_clustered",
}
_NO_FLOAT64 = {"clustered_dot", "clustered_weighted_sum"}


def kernel_choice() -> str:
    """The ``FASTASR_KERNELS`` setting: ``"auto"`` (default), ``"reference"`` or ``"triton"``."""
    raw = os.environ.get(KERNELS_ENV, "")
    value = raw.strip().lower() or "auto"
    if value not in _CHOICES:
        raise ValueError(f"{KERNELS_ENV}={raw!r}; expected one of: {', '.join(_CHOICES)}")
    return value


def kernel_backend(x: torch.Tensor, op: str = "hash_codes") -> str:
    """``"triton"`` or ``"reference"``: the implementation ``op`` uses for tensors like ``x``."""
    choice = kernel_choice()
    if choice != "auto":
        return choice
    if x.device.type != "cuda":
        return "reference"
    if op in _NO_FLOAT64 and x.dtype == torch.float64:
        return "reference"
    return "triton"


def _backend(x: torch.Tensor, op: str) -> ModuleType:
    """The module implementing ``op`` for tensors like ``x`` (see :func:`kernel_backend`)."""
    if kernel_backend(x, op) == "reference":
        return reference
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
