"""Dropout whose CPU mask is drawn on all of torch's threads.

torch's CPU dropout fills its mask with ``bernoulli_`` from one sequential generator,
on one thread. The C++ kernel (``csrc/dropout.cpp``) instead makes element ``i`` of
the mask a function of ``(seed, i)`` alone (a counter-based stream, like the Philox
stream of GPU dropout), so both cores draw it, and the result does not depend on the
number of threads. The seed of each call is drawn from torch's default generator:
``torch.manual_seed`` (``seed=`` of a training run) makes a run's masks reproducible.

:func:`dropout` runs the kernel on CPU tensors when the C++ kernels are built
(``FASTASR_KERNELS`` = ``auto`` or ``native``) and ``p < 1``; otherwise it is
``torch.nn.functional.dropout``: the same distribution (each element kept with
probability ``1 - p``, kept ones scaled by ``1 / (1 - p)``) from torch's own stream.
:func:`keep_mask` is the kernel's stream written in PyTorch, the ground truth its tests
compare against bit for bit.

Element ``i`` (row-major order of the tensor, up to 2^32 elements) is kept iff
``u(i) >= round(p * 2^24)``, where ``u(i)`` is the top 24 bits of
``mix(mix(i * 0x9E3779B9 + seed_lo) ^ seed_hi)`` in 32-bit arithmetic, ``mix`` is
lowbias32 (Wellons' hash-prospector) and ``seed_lo`` / ``seed_hi`` are the seed's
low and high 32 bits.

:class:`GeluDropout` is a feed-forward's GELU and the dropout after it, one module:
:func:`gelu_dropout`, which is ``dropout(gelu(x))`` (the same calls, so the same numbers
and draws), or where the Triton kernels of :mod:`fastasr.kernels.layers.triton_gelu_dropout` run it
(``FASTASR_KERNELS``' rules for the op ``"gelu_dropout"``: ``auto`` on a CUDA tensor when
:data:`TRITON_GELU_DROPOUT` is True, off until a GPU times it, ``make gpu-check``'s step table
"Triton GELU dropout"; ``triton`` everywhere) both in one pass each way, with this module's
stream for the mask, drawn again by the backward instead of stored.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fastasr.kernels import native
from fastasr.kernels.availability import import_kernel_module
from fastasr.kernels.dispatch import kernel_backend

__all__ = ["Dropout", "dropout", "keep_mask", "uses_native", "GeluDropout", "gelu_dropout", "TRITON_GELU_DROPOUT",
           "stream_words", "drop_threshold"]

#: Whether ``FASTASR_KERNELS=auto`` runs a CUDA tensor's :func:`gelu_dropout` by the Triton kernels.
TRITON_GELU_DROPOUT = False

_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2^32`` for int64 ``x`` in ``[0, 2^32)``, without int64 overflow."""
    low = x * (c & 0xFFFF)
    high = ((x * (c >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def stream_words(seed: int) -> tuple[int, int]:
    """The stream's ``(seed_lo, seed_hi)``: a seed's low and high 32 bits, as an unsigned 64-bit value."""
    seed &= 2**64 - 1
    return seed & _MASK32, seed >> 32


def drop_threshold(p: float) -> int:
    """The 24-bit bound below which the stream drops an element: ``round(p * 2^24)``."""
    return round(p * 2**24)


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, seed: int) -> torch.Tensor:
    """The kernel's bool mask of ``shape`` for ``(p, seed)``, computed in PyTorch (CPU)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"keep_mask: p must be in [0, 1), got {p}")
    numel = math.prod(int(size) for size in shape)
    if numel > 2**32:
        raise ValueError(f"keep_mask: {numel} elements; the counter-based stream has 2^32")
    lo, hi = stream_words(seed)
    index = torch.arange(numel, dtype=torch.int64)
    u = _mix32(_mix32((_mul32(index, 0x9E3779B9) + lo) & _MASK32) ^ hi) >> 8
    return (u >= drop_threshold(p)).reshape(tuple(shape))


def uses_native(x: torch.Tensor, p: float) -> bool:
    """True if :func:`dropout` runs the C++ kernel for ``x`` and ``p`` in training."""
    # FASTASR_KERNELS=native with the kernels not built: native.dropout raises NativeUnavailableError
    return x.device.type == "cpu" and 0.0 < p < 1.0 and kernel_backend(x, "dropout") == "native"


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``torch.nn.functional.dropout(x, p, training)``, drawn on all threads on CPU (module doc)."""
    if not training or p == 0.0:
        return x
    if uses_native(x, p):
        return native.dropout(x, p, _seed())
    return F.dropout(x, p, training=True)


class Dropout(nn.Dropout):
    """``nn.Dropout`` through :func:`dropout` (no parameters or state: checkpoints are unchanged)."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def _seed() -> int:
    """A mask's seed from torch's default (CPU) generator: no device read."""
    return int(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64))


def _capturing_cuda_graph() -> bool:
    """Whether a CUDA graph is being captured on the current stream."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def gelu_dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``dropout(gelu(x), p, training)`` (exact GELU), in one Triton pass each way where the
    kernels run (module doc). While a CUDA graph is captured it is torch's: the kernels' seed is
    drawn on the host, so a graph would hold one seed and replay one mask at every step, where
    torch's dropout draws a new one each replay."""
    if training and 0.0 < p < 1.0 and kernel_backend(x, "gelu_dropout", auto_triton=TRITON_GELU_DROPOUT) == "triton":
        kernels = import_kernel_module("layers.triton_gelu_dropout")
        if kernels.applies(x) and not _capturing_cuda_graph():
            return kernels.gelu_dropout(x, p, _seed())
    return dropout(F.gelu(x), p, training)


class GeluDropout(nn.Dropout):
    """GELU then dropout, by :func:`gelu_dropout`: an ``nn.Dropout`` (its ``p``, which
    ``callbacks.BudgetDropout`` sets, and no parameters or state) whose forward applies GELU
    first."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_dropout(x, self.p, self.training)
