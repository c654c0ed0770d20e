"""FlashAttention's variable-length kernel on padded batches, without packing them.

``torch.nn.attention.varlen.varlen_attn`` takes rows ``(T, H, E)`` and cumulative sequence
offsets. A padded batch ``(B, H, N, E)`` in the attention layer's layout is already rows: its
``(B·N, H, E)`` view. Sequence ``b``'s valid positions ``[bN, bN + L_b)`` are one sequence and
its padding ``[bN + L_b, (b+1)N)`` another (:func:`padded_offsets`), so valid queries see
exactly their valid keys, nothing is gathered or scattered, and the offsets come from
``lengths`` on the device (no host synchronisation). Full attention runs its ``varlen`` path
so (``fastasr.attention.full``), and clustered attention can run its centroids' values so
(``fastasr.kernels.clustering.ops``: ``C`` centroid queries a valid sequence, none a padding one).
"""

from __future__ import annotations

import torch

try:  # torch >= 2.9: FlashAttention's variable-length kernel with autograd
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # pragma: no cover - older torch
    varlen_attn = None

__all__ = ["varlen_attn", "varlen_available", "padded_offsets", "as_rows"]


def varlen_available(q: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether :data:`varlen_attn` runs on these queries and values: CUDA, fp16/bf16, torch's
    ``varlen_attn`` present, equal head sizes, a multiple of 8 and at most 256."""
    E, Ev = q.shape[-1], v.shape[-1]
    return (varlen_attn is not None and q.device.type == "cuda"
            and q.dtype in (torch.float16, torch.bfloat16)
            and E == Ev and E % 8 == 0 and E <= 256)


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """``(B, H, T, E)`` -> the ``(B·T, H, E)`` rows ``varlen_attn`` takes: a view of a head-split
    projection (the attention layer's layout), a copy of anything else."""
    return x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[-1])


def padded_offsets(lengths: torch.Tensor, n: int) -> torch.Tensor:
    """``(2B + 1,)`` int32 offsets of a padded batch's rows as ``varlen_attn`` takes them:
    ``0, L0, N, N + L1, 2N, ..., BN`` (each sequence's valid rows, then its padding), on
    ``lengths``' device."""
    lengths = lengths.to(torch.int32)
    starts = torch.arange(lengths.shape[0], device=lengths.device, dtype=torch.int32) * n
    return torch.cat([torch.stack([starts, starts + lengths], 1).reshape(-1), starts.new_full((1,), lengths.shape[0] * n)])
