"""Triton kernels: GELU then dropout in one pass, forward and backward, the mask never stored.

``gelu_dropout(x, p, seed)``: ``dropout(gelu(x))`` (exact GELU, ``x Φ(x)``), each element kept
with probability ``1 - p`` and the kept ones scaled by ``1 / (1 - p)``; differentiable in ``x``.
The mask is :func:`fastasr.kernels.layers.dropout.keep_mask`'s counter-based stream, the C++ CPU
kernel's: element ``i`` (row-major) is kept by a hash of ``(seed, i)`` alone, so the backward
draws it again instead of reading a stored one.

What it saves against torch's ``gelu`` and ``dropout`` (a feed-forward's ``(B, N, 4d)``
activations, 64,000 × 768 bf16 in the paper model's step: 98 MB a tensor): forward, one read of
``x`` and one write (torch: the GELU's output written and read again, and a byte-a-value mask
written); backward, ``dy`` and ``x`` read and ``dx`` written (torch: the mask read, and the
dropout's gradient written and read again). About 0.5 GB less traffic a layer, and two launches
instead of four.

Each program takes ``BLOCK`` contiguous elements; the products are float32 and the result is
rounded once to ``x``'s dtype (torch rounds the GELU's output, then the dropout's). At most
2^32 elements (the stream's counter is 32 bits; :func:`applies`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastasr.kernels.availability import kernels_interpreted, prepare_interpreter, require_triton
from fastasr.kernels.grid import cdiv
from fastasr.kernels.layers.dropout import drop_threshold, stream_words

prepare_interpreter()

__all__ = ["gelu_dropout", "applies", "BLOCK"]

#: Elements a program (8 a thread of 4 warps: 16-byte loads of bf16).
BLOCK = 1024
WARPS = 4
_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)
_SQRT1_2 = tl.constexpr(0.7071067811865476)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)


@triton.jit
def _mix32(x):
    """lowbias32 (``fastasr.kernels.layers.dropout._mix32``) on uint32 values."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _kept(offs, seed_lo, seed_hi, threshold):
    """Whether elements ``offs`` are kept: the top 24 bits of the stream's hash of ``(seed, i)``
    at least ``threshold`` (``fastasr.kernels.layers.dropout.keep_mask``)."""
    h = offs.to(tl.uint32) * 0x9E3779B9 + seed_lo.to(tl.uint32)
    h = _mix32(_mix32(h) ^ seed_hi.to(tl.uint32))
    return (h >> 8) >= threshold


@triton.jit(do_not_specialize=["seed_lo", "seed_hi", "threshold"])  # a new seed each call
def _forward_kernel(x_ptr, y_ptr, n, seed_lo, seed_hi, threshold, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    x = tl.load(x_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    y = 0.5 * x * (1.0 + tl.math.erf(x * _SQRT1_2))
    y = tl.where(_kept(offs, seed_lo, seed_hi, threshold), y * scale, 0.0)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=inside)


@triton.jit(do_not_specialize=["seed_lo", "seed_hi", "threshold"])  # a new seed each call
def _backward_kernel(x_ptr, dy_ptr, dx_ptr, n, seed_lo, seed_hi, threshold, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    x = tl.load(x_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    # d/dx x Φ(x) = Φ(x) + x φ(x)
    slope = 0.5 * (1.0 + tl.math.erf(x * _SQRT1_2)) + x * _INV_SQRT_2PI * tl.exp(-0.5 * x * x)
    dx = tl.where(_kept(offs, seed_lo, seed_hi, threshold), dy * (scale * slope), 0.0)
    tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=inside)


def applies(x: torch.Tensor) -> bool:
    """Whether :func:`gelu_dropout` serves ``x``: float32 or half precision, at most 2^32 elements."""
    return x.dtype in _SUPPORTED and 0 < x.numel() <= 2**32


class _GeluDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p, seed):
        # the mask's words, its bound and the kept values' scale: the backward's too
        mask = (*stream_words(seed), drop_threshold(p), 1.0 / (1.0 - p))
        y = torch.empty_like(x)
        n = x.numel()
        _forward_kernel[(cdiv(n, BLOCK),)](x, y, n, *mask, BLOCK=BLOCK, num_warps=WARPS)
        ctx.save_for_backward(x)
        ctx.mask = mask
        return y

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        dy = dy.contiguous()
        dx = torch.empty_like(x)
        n = x.numel()
        _backward_kernel[(cdiv(n, BLOCK),)](x, dy, dx, n, *ctx.mask, BLOCK=BLOCK, num_warps=WARPS)
        return dx, None, None


def gelu_dropout(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """``dropout(gelu(x))`` with the counter-based mask of ``seed`` (module doc), in ``x``'s
    dtype; for ``0 <= p < 1`` and tensors :func:`applies` serves (the caller's to check).

    Raises:
        ValueError: ``p`` out of ``[0, 1)``.
    """
    require_triton("gelu_dropout", x.device, kernels_interpreted(_forward_kernel))
    if not 0.0 <= p < 1.0:
        raise ValueError(f"gelu_dropout: p must be in [0, 1), got {p}")
    return _GeluDropout.apply(x.contiguous(), float(p), int(seed))
