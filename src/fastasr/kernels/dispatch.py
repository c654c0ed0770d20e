"""Which implementation an op runs for given tensors: the ``FASTASR_KERNELS`` rules.

Shared by the clustering ops (:mod:`fastasr.kernels.clustering.ops`) and the model's layers
(:mod:`fastasr.kernels.layers`): each asks :func:`kernel_backend` at every call. Three
implementations:

* ``reference``: PyTorch (any device; the ground truth);
* ``native``: the C++ CPU kernels (:mod:`fastasr.kernels.native`, built by ``make install``);
* ``triton``: the Triton kernels, for CUDA tensors (or the CPU under the Triton interpreter).

An op an implementation lacks runs the reference. ``FASTASR_KERNELS`` overrides the choice,
read at every call:

* ``auto`` (default, or unset): CUDA -> Triton (the clustered products in float64: the
  reference; an op whose Triton kernels are off until a GPU times them, by its module's
  switch, passes ``auto_triton=False`` and takes the reference), CPU -> the C++ kernels when
  they are built, else the reference with a one-time warning saying why and how to build them.
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

import torch

from fastasr.kernels import native

__all__ = ["KERNELS_ENV", "TRITON_MODULES", "NATIVE_OPS", "kernel_choice", "kernel_backend"]

#: Environment variable that forces one implementation: auto | reference | native | triton.
KERNELS_ENV = "FASTASR_KERNELS"
_CHOICES = ("auto", "reference", "native", "triton")

#: The ops with Triton kernels: op -> the module holding them (under ``fastasr.kernels``).
TRITON_MODULES = {
    "hash_codes": "clustering.triton_hashing",
    "hamming_kmeans": "clustering.triton_kmeans",
    "clustered_dot": "clustering.triton_clustered",
    "clustered_weighted_sum": "clustering.triton_clustered",
    "improved_sparse": "clustering.triton_clustered",
    "topk_indices": "clustering.triton_topk",
    "broadcast_clusters": "clustering.triton_broadcast",
    "cluster_means": "clustering.triton_broadcast",
    "layer_norm": "layers.triton_layer_norm",  # layers.layer_norm's LayerNorm (its own switch)
    "column_sums": "layers.triton_column_sums",  # layers.linear's bias gradients (likewise)
    "gelu_dropout": "layers.triton_gelu_dropout",  # layers.dropout's GeluDropout (likewise)
}
#: The ops with C++ kernels (in :mod:`fastasr.kernels.native`).
NATIVE_OPS = frozenset({
    "hash_codes",
    "hamming_kmeans",
    "topk_indices",
    "centroid_attention",
    "improved_sparse",
    "dropout",  # layers.dropout's Dropout
})
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
        elif op in NATIVE_OPS and x.device.type == "cpu" and native.available():
            choice = "native"
        else:
            choice = "reference"
    if choice == "triton" and op not in TRITON_MODULES:
        return "reference"
    if choice == "native" and op not in NATIVE_OPS:
        return "reference"
    return choice
