"""Triton kernel: random-hyperplane hashing of vectors into packed int64 codes.

``hash_codes(x, planes, lengths)`` is the Triton twin of
``fastasr.kernels.clustering.reference.hash_codes``: bit ``b`` of the code of ``x[b, h, n]`` is
``x[b, h, n] · planes[:E, b] + planes[E, b] > 0``, bits ≤ 63 so codes are
non-negative, and padded positions (``n >= lengths[b]``) get code 0.

Design. One program hashes ``BLOCK_N`` vectors of one (batch, head): it streams the
feature dimension in ``BLOCK_E`` chunks, multiplies the ``(BLOCK_N, BLOCK_E)`` tile by
the ``(BLOCK_E, 64)`` plane tile, adds the offset row, and packs the signs with a
shift-and-sum (distinct powers of two, so the sum is the OR). The projection is
computed in the reference's precision — full fp32 (``input_precision="ieee"``, no
tf32, inputs upcast) for fp32/fp16/bf16 inputs, fp64 for fp64 inputs — so the codes
equal the reference's except where a projection is within rounding of 0, which
random inputs do not produce. The kernel reads each vector once and writes
8 bytes: it is memory-bound and a negligible part of clustered attention.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastasr.kernels.availability import (
    kernels_interpreted,
    prepare_interpreter,
    require_triton,
)
from fastasr.kernels.clustering.reference import check_hash_inputs
from fastasr.kernels.grid import cdiv, next_power_of_2

prepare_interpreter()

__all__ = ["hash_codes"]

BLOCK_N = 64  # vectors per program


@triton.jit
def _hash_kernel(
    x_ptr, planes_ptr, len_ptr, out_ptr,
    H, N, E, BITS,
    stride_xb, stride_xh, stride_xn, stride_xe,
    stride_pe, stride_pb,
    HAS_LENGTHS: tl.constexpr, ACC_DTYPE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_BITS: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_bits = tl.arange(0, BLOCK_BITS)
    mask_n = offs_n < N
    mask_bits = offs_bits < BITS

    x_base = x_ptr + b * stride_xb + h * stride_xh
    acc = tl.zeros((BLOCK_N, BLOCK_BITS), dtype=ACC_DTYPE)
    if ACC_DTYPE == tl.float64:  # rare: outer-product FMAs, one feature at a time
        for e in range(0, E):
            x_col = tl.load(x_base + offs_n * stride_xn + e * stride_xe, mask=mask_n, other=0.0)
            p_row = tl.load(planes_ptr + e * stride_pe + offs_bits * stride_pb, mask=mask_bits, other=0.0)
            acc += x_col.to(tl.float64)[:, None] * p_row.to(tl.float64)[None, :]
    else:
        for e0 in range(0, E, BLOCK_E):
            offs_e = e0 + tl.arange(0, BLOCK_E)
            mask_e = offs_e < E
            x = tl.load(
                x_base + offs_n[:, None] * stride_xn + offs_e[None, :] * stride_xe,
                mask=mask_n[:, None] & mask_e[None, :], other=0.0,
            ).to(tl.float32)
            p = tl.load(
                planes_ptr + offs_e[:, None] * stride_pe + offs_bits[None, :] * stride_pb,
                mask=mask_e[:, None] & mask_bits[None, :], other=0.0,
            ).to(tl.float32)
            acc = tl.dot(x, p, acc, input_precision="ieee")
    bias = tl.load(planes_ptr + E * stride_pe + offs_bits * stride_pb, mask=mask_bits, other=0.0)
    acc = acc + bias.to(ACC_DTYPE)[None, :]

    one = tl.full((BLOCK_BITS,), 1, dtype=tl.int64)
    powers = one << offs_bits.to(tl.int64)
    on = (acc > 0.0) & mask_bits[None, :]
    code = tl.sum(tl.where(on, powers[None, :], 0), axis=1)

    valid = mask_n
    if HAS_LENGTHS:
        length = tl.load(len_ptr + b)
        valid = valid & (offs_n < length)
    code = tl.where(valid, code, 0)
    tl.store(out_ptr + pid_bh.to(tl.int64) * N + offs_n, code, mask=mask_n)


def hash_codes(
    x: torch.Tensor,
    planes: torch.Tensor,
    lengths: torch.Tensor | None = None,
    *,
    block_n: int = BLOCK_N,
) -> torch.Tensor:
    """Pack the signs of ``bits`` random affine projections into one int64 per vector.

    Args:
        x: ``(B, H, N, E)`` float vectors (fp32/fp16/bf16, projected in fp32; fp64 in fp64).
        planes: ``(E + 1, bits)`` hyperplanes; row ``E`` is the offset. ``bits <= 63``.
        lengths: ``(B,)`` integer valid lengths, or ``None`` (all positions valid).
        block_n: vectors per program (power of two, >= 16).

    Returns:
        ``(B, H, N)`` int64 codes; bit ``b`` is ``x·planes[:E, b] + planes[E, b] > 0``;
        positions ``n >= lengths[b]`` are 0.
    """
    require_triton("hash_codes", x.device, kernels_interpreted(_hash_kernel))
    B, H, N, E = check_inputs("hash_codes", x, planes, lengths)
    bits = planes.shape[1]
    out = torch.empty((B, H, N), dtype=torch.int64, device=x.device)
    if out.numel() == 0:
        return out
    has_lengths = lengths is not None
    len_arg = lengths.to(device=x.device, dtype=torch.int64).contiguous() if has_lengths else out  # None: never read
    fp64 = x.dtype == torch.float64
    grid = (B * H, cdiv(N, block_n))
    _hash_kernel[grid](
        x, planes, len_arg, out,
        H, N, E, bits,
        *x.stride(), *planes.stride(),
        HAS_LENGTHS=has_lengths, ACC_DTYPE=tl.float64 if fp64 else tl.float32,
        BLOCK_N=block_n, BLOCK_E=block_e(E), BLOCK_BITS=64,
    )
    return out


def block_e(features: int) -> int:
    """The features a product of the projection takes at once: ``E`` rounded up to a power of
    two, 16 to 32 (a longer row takes several)."""
    return min(32, max(16, next_power_of_2(features)))


def check_inputs(op: str, x: torch.Tensor, planes: torch.Tensor, lengths: torch.Tensor | None):
    """``x`` and ``planes`` as ``reference.check_hash_inputs`` checks them, ``planes`` on ``x``'s
    device, ``lengths`` ``(B,)`` or None, else a ValueError naming ``op``, the argument and what
    is expected. Returns ``(B, H, N, E)``."""
    B, H, N, E = check_hash_inputs(op, x, planes)
    if planes.device != x.device:
        raise ValueError(f"{op}: planes on {planes.device}, x on {x.device}; expected one device")
    if lengths is not None and lengths.shape != (B,):
        raise ValueError(f"{op}: lengths must be ({B},), got {tuple(lengths.shape)}")
    return B, H, N, E
