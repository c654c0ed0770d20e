"""Triton kernel: Lloyd's K-means on packed hash codes in Hamming space.

``hamming_kmeans(codes, lengths, clusters, iterations, generator, bits=...)`` is the
Triton twin of ``fastasr.kernels.reference.hamming_kmeans`` and returns bit-for-bit
the same assignments and counts (read that module's docstring for the rules: the
evenly spaced deterministic initialisation, ``min(C, length)`` used centroids, ties
to the lowest centroid index, strict per-bit majority, empty clusters keep their
centroid, a final assignment).

Design. One Lloyd iteration is two launches:

* ``_kmeans_step_kernel``, grid ``(B*H, P)``: each program owns a contiguous span of
  positions of one (batch, head). Phase A assigns every position of the span to its
  nearest used centroid — distance = popcount(code XOR centroid), a SWAR popcount in
  plain 32-bit integer ops on the two halves of the code (no intrinsic, so the
  interpreter runs it too; 32-bit halves keep the tile in half the registers of int64
  arithmetic, which the GPU emulates with 32-bit pairs anyway), centroids streamed
  in ``BLOCK_C`` chunks with a running minimum so any ``C`` fits in registers; one
  min-reduction over ``distance · 2^16 + index`` gives the nearest centroid and the
  lowest index among equals — and writes the assignment. Phase B (after a CTA barrier, it re-reads the assignments
  its own threads wrote) counts, per centroid chunk, members and set bits: the bit
  counts are one small matrix product ``onehot(assign)^T @ bits`` of 0/1 values in
  fp16 with an fp32 accumulator (exact), then one int32 ``atomic_add`` per
  (centroid, bit) per program. Integer atomics make the sums, and so the result,
  independent of the order the programs run in: the kernel is deterministic.
* ``_kmeans_update_kernel``, grid ``(B*H, cdiv(C, BLOCK_C))``: strict majority per bit
  for non-empty clusters, packs the new centroid, and zeroes the accumulators for the
  next iteration.

A final step launch writes the assignments (``-1`` for padded positions) and the
member counts. ``P`` splits long sequences over several programs (about
``SPAN_TARGET`` positions each) so that a few long utterances still fill the GPU,
while keeping the atomics to ``C × 64`` per program. The centroid initialisation is
host-side torch: the reference's own :func:`fastasr.kernels.reference.initial_centroids`.
Tile sizes: see ``STEP_BLOCK_N`` below (chosen from ptxas' register report,
``python -m fastasr.kernels.compile_check``; not yet tuned on a GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastasr.kernels.availability import (
    ensure_interpreter_compat,
    kernels_interpreted,
    require_triton,
)
from fastasr.kernels.reference import MAX_BITS, initial_centroids

ensure_interpreter_compat()

__all__ = ["hamming_kmeans"]

SPAN_TARGET = 2048  # positions per program in the step kernel (rounded to BLOCK_N)


@triton.jit
def _popcount32(x):
    """Set bits of each element of a uint32 tensor (SWAR, plain integer ops)."""
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    x = x + (x >> 8)
    x = x + (x >> 16)
    return (x & 0x3F).to(tl.int32)


@triton.jit
def _halves(code):
    """Non-negative int64 codes -> (low, high) 32-bit halves as uint32."""
    lo = (code & 0xFFFFFFFF).to(tl.uint32)
    hi = (code >> 32).to(tl.uint32)
    return lo, hi


@triton.jit
def _kmeans_step_kernel(
    codes_ptr, cent_ptr, len_ptr, ceff_ptr, assign_ptr, ones_ptr, counts_ptr,
    H, N, C, SPAN, BITMASK,
    ACCUMULATE_BITS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_BITS: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = pid_bh // H
    length = tl.load(len_ptr + b)
    c_eff = tl.load(ceff_ptr + b)
    row = pid_bh.to(tl.int64) * N
    crow = pid_bh.to(tl.int64) * C
    start = pid_s * SPAN
    stop = tl.minimum(start + SPAN, N)

    # Phase A: nearest used centroid of every position in [start, stop).
    for n0 in range(start, stop, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < stop
        code = tl.load(codes_ptr + row + offs_n, mask=mask_n, other=0) & BITMASK
        code_lo, code_hi = _halves(code)
        best = tl.full((BLOCK_N,), 1 << 30, dtype=tl.int32)
        best_c = tl.zeros((BLOCK_N,), dtype=tl.int32)
        for c0 in range(0, C, BLOCK_C):
            offs_c = c0 + tl.arange(0, BLOCK_C)
            used = offs_c < c_eff
            cent = tl.load(cent_ptr + crow + offs_c, mask=used, other=0) & BITMASK
            cent_lo, cent_hi = _halves(cent)
            dist = (_popcount32(code_lo[:, None] ^ cent_lo[None, :])
                    + _popcount32(code_hi[:, None] ^ cent_hi[None, :]))
            # One min-reduction finds the nearest centroid and, among equals, the lowest
            # index: key = distance * 2^16 + index within the chunk (distance <= 63).
            key = tl.where(used[None, :], dist * 65536 + tl.arange(0, BLOCK_C)[None, :], 1 << 30)
            chunk_key = tl.min(key, axis=1)
            better = chunk_key < best  # strict: earlier (lower) chunks win ties
            best_c = tl.where(better, (chunk_key & 65535) + c0, best_c)
            best = tl.where(better, chunk_key - (chunk_key & 65535), best)
        valid = offs_n < length
        tl.store(assign_ptr + row + offs_n, tl.where(valid, best_c, -1).to(tl.int64), mask=mask_n)

    # Phase B reads assignments written by other threads of this program.
    tl.debug_barrier()

    # Phase B: per centroid chunk, member counts (and set-bit counts) of this span.
    offs_bits = tl.arange(0, BLOCK_BITS)
    for c0 in range(0, C, BLOCK_C):
        offs_c = c0 + tl.arange(0, BLOCK_C)
        mask_c = offs_c < C
        cnt = tl.zeros((BLOCK_C,), dtype=tl.int32)
        acc = tl.zeros((BLOCK_C, BLOCK_BITS), dtype=tl.float32)
        for n0 in range(start, stop, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < stop
            a = tl.load(assign_ptr + row + offs_n, mask=mask_n, other=-1)
            onehot = (a[:, None] == offs_c[None, :].to(tl.int64)) & mask_n[:, None]
            cnt += tl.sum(onehot.to(tl.int32), axis=0)
            if ACCUMULATE_BITS:
                code = tl.load(codes_ptr + row + offs_n, mask=mask_n, other=0) & BITMASK
                bit = ((code[:, None] >> offs_bits[None, :].to(tl.int64)) & 1).to(tl.float16)
                acc = tl.dot(tl.trans(onehot.to(tl.float16)), bit, acc)
        tl.atomic_add(counts_ptr + crow + offs_c, cnt, mask=mask_c)
        if ACCUMULATE_BITS:
            ones_ptrs = ones_ptr + (crow + offs_c[:, None]) * BLOCK_BITS + offs_bits[None, :]
            tl.atomic_add(ones_ptrs, acc.to(tl.int32), mask=mask_c[:, None])


@triton.jit
def _kmeans_update_kernel(
    cent_ptr, ones_ptr, counts_ptr,
    C, BITS,
    BLOCK_C: tl.constexpr, BLOCK_BITS: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_c = tl.program_id(1)
    crow = pid_bh.to(tl.int64) * C
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_bits = tl.arange(0, BLOCK_BITS)
    mask_c = offs_c < C
    ones_ptrs = ones_ptr + (crow + offs_c[:, None]) * BLOCK_BITS + offs_bits[None, :]
    ones = tl.load(ones_ptrs, mask=mask_c[:, None], other=0)
    cnt = tl.load(counts_ptr + crow + offs_c, mask=mask_c, other=0)
    old = tl.load(cent_ptr + crow + offs_c, mask=mask_c, other=0)

    majority = (2 * ones > cnt[:, None]) & (offs_bits[None, :] < BITS)
    powers = tl.full((BLOCK_BITS,), 1, dtype=tl.int64) << offs_bits.to(tl.int64)
    new = tl.sum(tl.where(majority, powers[None, :], 0), axis=1)
    tl.store(cent_ptr + crow + offs_c, tl.where(cnt > 0, new, old), mask=mask_c)
    tl.store(ones_ptrs, tl.zeros((BLOCK_C, BLOCK_BITS), dtype=tl.int32), mask=mask_c[:, None])
    tl.store(counts_ptr + crow + offs_c, tl.zeros((BLOCK_C,), dtype=tl.int32), mask=mask_c)


# Step-kernel tiles: (BLOCK_N, BLOCK_C) = (32, 32) with 4 warps and no software
# pipelining compiles to 79 registers and no spills for sm_90 (ptxas resource report);
# (64, 64) needed 255 registers and spilled. The update kernel's tile is 32 x 64 bits.
STEP_BLOCK_N = 32
STEP_BLOCK_C = 32
UPDATE_BLOCK_C = 32
STEP_OPTIONS = {"num_warps": 4, "num_stages": 1}


@torch.no_grad()
def hamming_kmeans(
    codes: torch.Tensor,
    lengths: torch.Tensor | None,
    clusters: int,
    iterations: int,
    generator: torch.Generator | None = None,
    *,
    bits: int = MAX_BITS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K-means in Hamming space on ``(B, H, N)`` int64 hash codes (Triton).

    Args:
        codes: ``(B, H, N)`` int64 codes; only the low ``bits`` bits are used.
        lengths: ``(B,)`` valid lengths, or ``None`` (all valid).
        clusters: ``C >= 1`` centroids; a sequence shorter than ``C`` uses one
            centroid per valid position.
        iterations: Lloyd iterations ``>= 0``.
        generator: unused (the initialisation is deterministic); kept so every
            backend shares one signature.
        bits: significant low bits of each code, ``1..63``.

    Returns:
        ``assignments`` ``(B, H, N)`` int64 in ``[0, C)`` (``-1`` for padded
        positions) and ``counts`` ``(B, H, C)`` int64, equal to the reference's.
    """
    del generator
    require_triton("hamming_kmeans", codes.device, kernels_interpreted(_kmeans_step_kernel))
    if clusters < 1:
        raise ValueError(f"hamming_kmeans: clusters={clusters}; expected >= 1")
    if iterations < 0:
        raise ValueError(f"hamming_kmeans: iterations={iterations}; expected >= 0")
    if not 1 <= bits <= MAX_BITS:
        raise ValueError(f"hamming_kmeans: bits={bits}; expected 1..{MAX_BITS}")
    if codes.dim() != 3 or codes.dtype != torch.int64:
        raise ValueError(
            f"hamming_kmeans: codes must be (B, H, N) int64, got {tuple(codes.shape)} {codes.dtype}"
        )
    B, H, N = codes.shape
    C = clusters
    device = codes.device
    if N == 0 or B * H == 0:
        return (
            torch.full((B, H, N), -1, dtype=torch.int64, device=device),
            torch.zeros(B, H, C, dtype=torch.int64, device=device),
        )
    if lengths is None:
        lens = torch.full((B,), N, dtype=torch.int64, device=device)
    else:
        if lengths.shape != (B,):
            raise ValueError(f"hamming_kmeans: lengths must be ({B},), got {tuple(lengths.shape)}")
        lens = lengths.to(device=device, dtype=torch.int64).contiguous()
    codes = codes.contiguous()
    centroids, c_eff = initial_centroids(codes, lens, C)

    block_n, block_c, block_c_update = STEP_BLOCK_N, STEP_BLOCK_C, UPDATE_BLOCK_C
    span = triton.cdiv(min(N, SPAN_TARGET), block_n) * block_n
    grid_step = (B * H, triton.cdiv(N, span))
    grid_update = (B * H, triton.cdiv(C, block_c_update))
    bitmask = (1 << bits) - 1

    assign = torch.empty((B, H, N), dtype=torch.int64, device=device)
    counts = torch.zeros((B, H, C), dtype=torch.int32, device=device)
    ones = torch.zeros((B, H, C, 64), dtype=torch.int32, device=device) if iterations else counts
    for _ in range(iterations):
        _kmeans_step_kernel[grid_step](
            codes, centroids, lens, c_eff, assign, ones, counts,
            H, N, C, span, bitmask,
            ACCUMULATE_BITS=True, BLOCK_N=block_n, BLOCK_C=block_c, BLOCK_BITS=64, **STEP_OPTIONS,
        )
        _kmeans_update_kernel[grid_update](
            centroids, ones, counts, C, bits, BLOCK_C=block_c_update, BLOCK_BITS=64,
        )
    _kmeans_step_kernel[grid_step](
        codes, centroids, lens, c_eff, assign, ones, counts,
        H, N, C, span, bitmask,
        ACCUMULATE_BITS=False, BLOCK_N=block_n, BLOCK_C=block_c, BLOCK_BITS=64, **STEP_OPTIONS,
    )
    return assign, counts.to(torch.int64)
