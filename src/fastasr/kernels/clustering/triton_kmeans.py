"""Triton kernel: Lloyd's K-means on packed hash codes in Hamming space.

``hamming_kmeans(codes, lengths, clusters, iterations, generator, bits=...)`` is the
Triton twin of ``fastasr.kernels.clustering.reference.hamming_kmeans`` and returns bit-for-bit
the same assignments and counts (read that module's docstring for the rules: the
evenly spaced deterministic initialisation, ``min(C, length)`` used centroids, ties
to the lowest centroid index, strict per-bit majority, empty clusters keep their
centroid, a final assignment).

Design: one kernel, ``_lloyd_kernel``, that does a whole Lloyd pass over a span of
positions in one sweep, on chip:

* the span's codes are read in ``BLOCK_N`` tiles and unpacked to +-1 bit vectors;
  with the centroids' +-1 vectors (``(64, BLOCK_C)``, ``BLOCK_C = next_pow2(C)``,
  held in registers for the whole pass), ``popcount(a ^ c) = (63 - <a, c>) / 2``, so
  every distance of the tile is one tensor-core product (fp16 +-1 values, fp32
  accumulation: exact);
* bit 63 of a code is always clear, so its column carries constants: a bias
  ``-c/256`` per used centroid (``-4096`` for an unused one) in the distance product,
  which makes the row maximum the nearest used centroid, the lowest index among
  equals, with the index in its fraction (exact in fp16 and fp32): one max-reduction;
* the same tile then adds its members' signs into a ``(BLOCK_C, 64)`` accumulator:
  ``onehot(assign)^T @ signs``, a second product of the same +-1 tile (exact), whose column
  63 carries +1 and so counts the members; a bit's sum is ``2 * set - members``, so the
  strict majority is a positive sum.

In one launch (below) the tiles' +-1 signs are unpacked from the codes once, into a
``(B, H, N, 64)`` float16 scratch the kernel writes before its first sweep, and every sweep
reads them (one 16-byte vector load a thread and row) instead of unpacking each bit of each
code again: on sm_90, C = 100, 64 positions x 4 warps, one pipeline stage, a sweep's tile
compiles to 277 instructions a thread against 754 (the unpacking's shifts, masks and selects, and scalar loads
of the codes), for 128 bytes read a position and sweep against 8: 21-30 % faster a call of
the one launch at N = 800-4,096 (benchmarks/gpu/notes.md "Decisions"). Split sweeps unpack the
codes: there the scratch gained nothing.

When one program owns a whole sequence (``P = 1`` span per sequence) the program reads
its initial centroids from the codes and runs
**every iteration and the final assignment in one launch**: after each sweep the
strict per-bit majority updates the centroids in registers, and nothing but the
assignments and counts is ever written; a sequence whose centroids stop moving stops there,
as the C++ kernel's does (``reference.fixed_point_iteration``: on trained models' queries half
of the 11 sweeps for Mini LibriSpeech utterances, 79 % for 430–770-position ones,
benchmarks/gpu/notes.md "Answered questions"). That is the case whenever the batch has
enough sequences (``ONE_LAUNCH_FROM``). When it has not (a few long sequences), each
sequence is split over ``P`` programs and every iteration is two launches: the sweep,
whose programs add their accumulators with int32 atomics (order-independent, so the
result is deterministic), and ``_update_kernel``, the majority vote that packs the
new centroids, zeroes the accumulators and counts the centroids it moved. After a vote
that moved none, the sequence's later sweeps and votes exit at once (the launches stay:
the grid depends only on shapes), so a fixed point ends its work there too.

Nothing reads a value back to the host: the launch grid depends only on shapes.
``C`` above ``MAX_CLUSTERS`` (the register budget of the accumulator) has no Triton
kernel; :func:`hamming_kmeans` then runs the PyTorch reference (the same result) on
the tensors' device.
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
from fastasr.kernels.clustering import reference, triton_hashing
from fastasr.kernels.clustering.reference import MAX_BITS, initial_centroids
from fastasr.kernels.grid import cdiv, next_power_of_2

prepare_interpreter()

__all__ = ["hamming_kmeans", "hash_kmeans", "spans_per_sequence", "MAX_CLUSTERS"]


#: Largest ``C`` with a Triton kernel: the ``(next_pow2(C), 64)`` accumulator and the
#: centroids' bit vectors live in registers. ``C = 100`` (the paper's) uses 128.
MAX_CLUSTERS = 256
#: With at least this many sequences (batch x heads) every sequence gets one program and all
#: iterations run in one launch (measured by ``attention/clustering_gpu.py``'s K-means table: one launch
#: is as fast or faster from 96 sequences of N = 4,096, 1.67 against 2.05 ms at 120 of 3,200;
#: 8.3 against 1.4 ms at 24 of 16,384; benchmarks/results/clustering_*.md).
ONE_LAUNCH_FROM = 96
#: Fewer sequences are split until about this many programs run.
FILL_PROGRAMS = 256
#: Shortest span when a sequence is split over several programs.
MIN_SPAN = 512
BLOCK_N = 32  # positions per tile
#: Launch options of ``_lloyd_kernel``: 4 warps for C <= 128 (measured fastest on two GPUs,
#: benchmarks/results/clustering_*.md), 8 above so the 256-centroid tile does not spill.
LLOYD_OPTIONS = {"num_warps": 4, "num_stages": 1}
LLOYD_OPTIONS_WIDE = {"num_warps": 8, "num_stages": 1}
#: The tile of a one-launch sweep (one program a sequence, every iteration in it) for C <= 128,
#: by sequence length: 64 positions x 4 warps below ``WIDE_TILE_FROM`` positions, 128 x 8 from
#: there. Measured in two runs (benchmarks/results/kmeans_tiles_*.md),
#: ms a call against 32 x 4: N = 800: 1.06-1.10 against 1.15-1.23 (128 x 8: 1.15-1.37);
#: N = 1,024-4,096: 1.00-1.48 against 1.30-2.30. Split sweeps keep 32 x 4 (no tile beat it in both runs).
#: Two software-pipeline stages (Triton prefetches the next tile's codes): 0.84-0.93 of one
#: stage's time at N = 800-4,096 on Hopper (benchmarks/results/clustering_nvidia-h200.md "auto, 2
#: stages"); split sweeps keep one (1.01 at 16,384 and 65,536).
ONE_LAUNCH_TILES = ((64, {"num_warps": 4, "num_stages": 2}), (128, {"num_warps": 8, "num_stages": 2}))
#: The pipeline depth of the one launch that also hashes (:data:`HASH_IN_KMEANS`): the hash's
#: registers beside two stages spill on sm_90 (255 registers and 8 stack bytes with float32 vectors).
HASH_IN_KMEANS_STAGES = 1
WIDE_TILE_FROM = 1024
UPDATE_BLOCK_C = 32
#: Whether :func:`hash_kmeans` hashes the vectors inside K-means' one launch (False: the hash
#: kernel's launch, then K-means on its codes). Inside, the hash's products move into each
#: sequence's program (1,272 instructions a 64-position tile on sm_90, once before the sweeps'
#: 11 × 277) and the codes' write and read, the hash's launch and its gap go
#: (benchmarks/gpu/notes.md "The hash inside K-means"). Off until a GPU times it: ``make gpu-check`` times
#: both (``bench_io.KERNEL_SWITCHES`` "hash inside K-means").
HASH_IN_KMEANS = False


@triton.jit
def _signs(code, offs_bits):
    """``(M,)`` codes (bit 63 clear) -> ``(M, 64)`` float16 +-1 signs of their bits, +1 in column 63.

    Built as the halves' bits: 1.0 is 0x3C00, and a clear bit sets the sign (0x8000), so each sign
    is a shift, a mask and an or, with no integer-to-float conversion."""
    lo = (code & 0xFFFFFFFF).to(tl.uint32)
    hi = (code >> 32).to(tl.uint32) | 0x80000000  # column 63: set, +1
    word = tl.where(offs_bits[None, :] < 32, lo[:, None], hi[:, None])
    clear = ((word >> (offs_bits[None, :] & 31).to(tl.uint32)) & 1) ^ 1
    return ((clear << 15) | 0x3C00).to(tl.uint16).to(tl.float16, bitcast=True)


@triton.jit
def _code_signs(codes_ptr, row, offs_n, mask_n, BITMASK, offs_bits):
    """The ``(M, 64)`` float16 signs (:func:`_signs`) of the codes at positions ``offs_n`` of
    the sequence at ``row``, their bits above ``BITMASK`` cleared."""
    code = tl.load(codes_ptr + row + offs_n, mask=mask_n, other=0) & BITMASK
    return _signs(code, offs_bits)


@triton.jit
def _hashed_signs(x_base, planes_ptr, offs_n, mask_n, E, BITS, stride_xn, stride_xe, stride_pe, stride_pb,
                  offs_bits, BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr):
    """The ``(BLOCK_N, 64)`` float16 signs (:func:`_signs`) of the codes that
    ``triton_hashing.hash_codes`` gives the vectors at positions ``offs_n`` of ``x_base``: bit
    ``b < BITS`` set where ``x · planes[:E, b] + planes[E, b] > 0``, in float32 products of
    ``BLOCK_E`` features (the hash kernel's precision and order); bits from ``BITS`` clear,
    column 63 +1."""
    mask_bits = offs_bits < BITS
    acc = tl.zeros((BLOCK_N, 64), dtype=tl.float32)
    for e0 in range(0, E, BLOCK_E):
        offs_e = e0 + tl.arange(0, BLOCK_E)
        mask_e = offs_e < E
        x = tl.load(x_base + offs_n[:, None] * stride_xn + offs_e[None, :] * stride_xe,
                    mask=mask_n[:, None] & mask_e[None, :], other=0.0).to(tl.float32)
        p = tl.load(planes_ptr + offs_e[:, None] * stride_pe + offs_bits[None, :] * stride_pb,
                    mask=mask_e[:, None] & mask_bits[None, :], other=0.0).to(tl.float32)
        acc = tl.dot(x, p, acc, input_precision="ieee")
    bias = tl.load(planes_ptr + E * stride_pe + offs_bits * stride_pb, mask=mask_bits, other=0.0).to(tl.float32)
    on = (((acc + bias[None, :]) > 0.0) & mask_bits[None, :]) | (offs_bits[None, :] == 63)
    return tl.where(on, 1.0, -1.0).to(tl.float16)


@triton.jit
def _pack_bits(bits, offs_bits):
    """``(M, 64)`` 0/1 (or bool) -> ``(M,)`` int64 codes, packed as two 32-bit halves."""
    power = (tl.full((64,), 1, dtype=tl.uint32) << (offs_bits & 31).to(tl.uint32))[None, :]
    lo = tl.sum(tl.where((bits != 0) & (offs_bits[None, :] < 32), power, 0), axis=1)
    hi = tl.sum(tl.where((bits != 0) & (offs_bits[None, :] >= 32), power, 0), axis=1)
    return lo.to(tl.int64) | (hi.to(tl.int64) << 32)


@triton.jit
def _vote(ones, cnt, old, offs_bits, BITS):
    """New centroids ``(C,)`` int64: the strict per-bit majority of each cluster's ``ones``
    ``(C, 64)`` over its ``cnt`` members, for its first ``BITS`` bits; empty clusters keep ``old``."""
    majority = (2 * ones > cnt[:, None]) & (offs_bits[None, :] < BITS)
    return tl.where(cnt > 0, _pack_bits(majority, offs_bits), old)


@triton.jit
def _lloyd_kernel(
    codes_ptr, cent_ptr, len_ptr, assign_ptr, ones_ptr, counts_ptr, moved_ptr, signs_ptr,
    x_ptr, planes_ptr,
    H, N, C, SPAN, BITMASK, BITS, PASSES,
    E, stride_xb, stride_xh, stride_xn, stride_xe, stride_pe, stride_pb,
    IN_KERNEL: tl.constexpr, ACCUMULATE: tl.constexpr, AFTER_VOTE: tl.constexpr,
    WRITE_SIGNS: tl.constexpr, READ_SIGNS: tl.constexpr, HASH: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """Lloyd sweeps over the span ``[pid_s * SPAN, +SPAN)`` of sequence ``pid_bh``.

    ``IN_KERNEL``: the program owns the whole sequence: it reads the initial centroids
    from the codes (those at the evenly spaced valid positions, as
    ``reference.initial_centroids``) and runs ``PASSES`` sweeps (the iterations, then the
    final assignment), updating the centroids in registers, and stops after a sweep whose vote
    moved no centroid (a fixed point: the reference's later iterations repeat it exactly); it
    writes the assignments and the counts (``counts_ptr``'s integer type). Otherwise one sweep
    from the centroids at ``cent_ptr``: ``ACCUMULATE`` adds members and set bits into
    ``counts``/``ones`` (int32 atomics) for ``_update_kernel``; without it, the final
    assignment (and the counts). ``AFTER_VOTE``: an accumulating sweep after a vote, which
    exits at once when that vote moved none of the sequence's centroids (``moved_ptr``, the
    vote's count): the sweep would repeat the last one, and the final assignment follows.
    ``WRITE_SIGNS``: first unpack the span's codes into their +-1 signs at ``signs_ptr``
    (``(B * H * N, 64)`` float16, column 63: +1); ``READ_SIGNS``: the sweeps read them there
    instead of unpacking the codes (in one launch: :func:`hamming_kmeans`). ``HASH`` (with
    ``IN_KERNEL`` and both): the signs are the hash of the sequence's vectors at ``x_ptr``
    (``(B, H, N, E)`` by their strides) by the ``(E + 1, BITS)`` planes at ``planes_ptr``
    (:func:`_hashed_signs`), and the initial centroids are packed from them: no codes
    (:func:`hash_kmeans`). Without it, ``x_ptr``, ``planes_ptr``, ``E`` and the strides are
    not read.
    """
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    if AFTER_VOTE:
        if tl.load(moved_ptr + pid_bh) == 0:
            return
    b = pid_bh // H
    length = tl.load(len_ptr + b).to(tl.int32)  # 32-bit positions: the loops and masks
    x_base = x_ptr + b.to(tl.int64) * stride_xb + (pid_bh % H).to(tl.int64) * stride_xh  # HASH
    c_eff = tl.minimum(length, C)  # centroids in use
    row = pid_bh.to(tl.int64) * N
    crow = pid_bh.to(tl.int64) * C
    start = pid_s * SPAN
    stop = tl.minimum(start + SPAN, N)
    valid_stop = tl.minimum(stop, length)

    offs_c = tl.arange(0, BLOCK_C)
    in_c = offs_c < C
    offs_bits = tl.arange(0, 64)
    # Bit 63 of a code is always clear (bits <= 63), so its column is free for two constants:
    # in the distance product the codes carry +1 there and each centroid its bias, -c/256 for
    # a used centroid c (exact in fp16 and fp32) and -4096 for an unused one; the largest
    # score is then the nearest used centroid, the lowest index among equals, and its
    # fraction names it. In the accumulated bit matrix the column carries 1: the member counts.
    bias_column = offs_bits[None, :] == 63
    bias = tl.where(offs_c < c_eff, -offs_c.to(tl.float32) / 256.0, -4096.0)

    # Padded positions of the span: -1, once.
    for n0 in range(tl.maximum(start, valid_stop), stop, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        tl.store(assign_ptr + row + offs_n, tl.full((BLOCK_N,), -1, tl.int64), mask=offs_n < stop)

    if WRITE_SIGNS:  # the span's signs, once; the sweeps below read them
        for n0 in range(start, valid_stop, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < valid_stop
            if HASH:
                tile_signs = _hashed_signs(x_base, planes_ptr, offs_n, mask_n, E, BITS, stride_xn, stride_xe,
                                           stride_pe, stride_pb, offs_bits, BLOCK_N, BLOCK_E)
            else:
                tile_signs = _code_signs(codes_ptr, row, offs_n, mask_n, BITMASK, offs_bits)
            tl.store(signs_ptr + (row + offs_n)[:, None] * 64 + offs_bits[None, :], tile_signs, mask=mask_n[:, None])
        tl.debug_barrier()  # what each thread stored, visible to every thread of the program

    if IN_KERNEL:  # centroid c starts at the code of valid position floor(c * length / c_eff)
        first = tl.minimum((offs_c.to(tl.int64) * length) // tl.maximum(c_eff, 1), N - 1)
        if HASH:  # packed from the signs stored above (a padded position's code: 0, as hashed)
            first_ok = in_c & (first < length)
            first_signs = tl.load(signs_ptr + (row + first)[:, None] * 64 + offs_bits[None, :],
                                  mask=first_ok[:, None], other=-1.0)
            cent = _pack_bits(first_signs > 0, offs_bits) & BITMASK
        else:
            cent = tl.load(codes_ptr + row + first, mask=in_c, other=0) & BITMASK  # (BLOCK_C,) int64
    else:
        cent = tl.load(cent_ptr + crow + offs_c, mask=in_c, other=0) & BITMASK
    ones = tl.zeros((BLOCK_C, 64), dtype=tl.int32)  # the last sweep's set bits and members
    cnt = tl.zeros((BLOCK_C,), dtype=tl.int32)
    sweeps = 0
    moved = 1  # centroids the last vote changed (in kernel); a fixed point ends the sweeps
    while (sweeps < PASSES) & (moved > 0):
        # the centroids' +-1 halves built from their bits as the codes' are (no int-to-float
        # conversions), the bias in column 63
        cent_t = tl.trans(tl.where(bias_column, bias[:, None].to(tl.float16), _signs(cent, offs_bits)))
        acc = tl.zeros((BLOCK_C, 64), dtype=tl.float32)
        for n0 in range(start, valid_stop, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < valid_stop
            if READ_SIGNS:
                signs = tl.load(signs_ptr + (row + offs_n)[:, None] * 64 + offs_bits[None, :],
                                mask=mask_n[:, None], other=0.0)
            else:
                signs = _code_signs(codes_ptr, row, offs_n, mask_n, BITMASK, offs_bits)
            score = tl.dot(signs, cent_t)
            top = tl.max(score, axis=1)  # integer score - best / 256: exact
            best = (-top * 256.0).to(tl.int32) & 255
            tl.store(assign_ptr + row + offs_n, best.to(tl.int64), mask=mask_n)
            # The one-hot as a compare that yields 1.0 or 0.0 (FSET), packed in pairs to float16;
            # a boolean's .to(float16) compiles to a select and an int-to-float conversion a value
            # (I2F, a quarter of the ALU's rate): 277 instructions a tile against 403 on sm_90.
            # A padded row's top is +inf: no centroid.
            top_in = tl.where(mask_n, top, float("inf"))
            onehot = tl.where(score == top_in[:, None], 1.0, 0.0).to(tl.float16)
            acc = tl.dot(tl.trans(onehot), signs, acc)
        # a bit's sum over a centroid's members is 2 * (set bits) - members; column 63: members
        cnt = tl.sum(tl.where(bias_column, acc, 0.0), axis=1).to(tl.int32)
        ones = (acc.to(tl.int32) + cnt[:, None]) >> 1  # 2 * set bits: even, not negative
        if IN_KERNEL:
            voted = _vote(ones, cnt, cent, offs_bits, BITS)
            # No centroid moved: every later sweep would repeat this one exactly, so its
            # assignments (already stored) and counts are the final ones.
            moved = tl.sum((voted != cent).to(tl.int32), axis=0)
            cent = voted
        sweeps += 1
    if IN_KERNEL:
        tl.store(counts_ptr + crow + offs_c, cnt.to(counts_ptr.dtype.element_ty), mask=in_c)
    else:
        tl.atomic_add(counts_ptr + crow + offs_c, cnt, mask=in_c, sem="relaxed")
        if ACCUMULATE:
            ones_ptrs = ones_ptr + (crow + offs_c[:, None]) * 64 + offs_bits[None, :]
            tl.atomic_add(ones_ptrs, ones, mask=in_c[:, None] & (offs_bits[None, :] < 63), sem="relaxed")


@triton.jit
def _update_kernel(
    cent_ptr, ones_ptr, counts_ptr, moved_before_ptr, moved_ptr,
    C, BITS,
    AFTER_VOTE: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Strict per-bit majority of the accumulated sweep; zeroes the accumulators; adds the
    centroids it changed into ``moved`` (int32 atomics; 0 for the whole sequence: a fixed
    point). ``AFTER_VOTE``: nothing to do when the previous vote (``moved_before``) moved none
    (its sweep exited, the accumulators are zero; ``moved`` stays 0)."""
    pid_bh = tl.program_id(0)
    pid_c = tl.program_id(1)
    if AFTER_VOTE:
        if tl.load(moved_before_ptr + pid_bh) == 0:
            return
    crow = pid_bh.to(tl.int64) * C
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_bits = tl.arange(0, 64)
    mask_c = offs_c < C
    ones_ptrs = ones_ptr + (crow + offs_c[:, None]) * 64 + offs_bits[None, :]
    ones = tl.load(ones_ptrs, mask=mask_c[:, None], other=0)
    cnt = tl.load(counts_ptr + crow + offs_c, mask=mask_c, other=0)
    old = tl.load(cent_ptr + crow + offs_c, mask=mask_c, other=0)

    voted = _vote(ones, cnt, old, offs_bits, BITS)
    tl.store(cent_ptr + crow + offs_c, voted, mask=mask_c)
    tl.atomic_add(moved_ptr + pid_bh, tl.sum(((voted != old) & mask_c).to(tl.int32), axis=0), sem="relaxed")
    tl.store(ones_ptrs, tl.zeros((BLOCK_C, 64), dtype=tl.int32), mask=mask_c[:, None])
    tl.store(counts_ptr + crow + offs_c, tl.zeros((BLOCK_C,), dtype=tl.int32), mask=mask_c)


def block_c(clusters: int) -> int:
    """The centroid tile of ``clusters`` centroids: the next power of two, at least 16."""
    return max(16, next_power_of_2(clusters))


def lloyd_tile(clusters: int, one_launch: bool, length: int) -> dict:
    """``_lloyd_kernel``'s tile and launch options for sequences of ``length`` positions:
    ``BLOCK_N``, ``BLOCK_C``, warps, stages."""
    tile_c = block_c(clusters)
    if tile_c > 128:
        return {"BLOCK_N": BLOCK_N, "BLOCK_C": tile_c, **LLOYD_OPTIONS_WIDE}
    if one_launch:
        block_n, options = ONE_LAUNCH_TILES[length >= WIDE_TILE_FROM]
        return {"BLOCK_N": block_n, "BLOCK_C": tile_c, **options}
    return {"BLOCK_N": BLOCK_N, "BLOCK_C": tile_c, **LLOYD_OPTIONS}


def spans_per_sequence(sequences: int, length: int) -> int:
    """Programs per sequence: 1 from ``ONE_LAUNCH_FROM`` sequences, else about ``FILL_PROGRAMS``
    programs in all, each span at least ``MIN_SPAN`` positions."""
    if sequences >= ONE_LAUNCH_FROM:
        return 1
    return max(1, min(cdiv(length, MIN_SPAN), cdiv(FILL_PROGRAMS, sequences)))


@torch.no_grad()
def hamming_kmeans(
    codes: torch.Tensor,
    lengths: torch.Tensor | None,
    clusters: int,
    iterations: int,
    generator: torch.Generator | None = None,
    *,
    bits: int = MAX_BITS,
    spans: int | None = None,
    stored_signs: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K-means in Hamming space on ``(B, H, N)`` int64 hash codes (Triton).

    Args:
        codes: ``(B, H, N)`` int64 codes; only the low ``bits`` bits are used.
        lengths: ``(B,)`` valid lengths, or ``None`` (all valid).
        clusters: ``C >= 1`` centroids; a sequence shorter than ``C`` uses one
            centroid per valid position. ``C > MAX_CLUSTERS`` runs the reference.
        iterations: Lloyd iterations ``>= 0``.
        generator: unused (the initialisation is deterministic); kept so every
            backend shares one signature.
        bits: significant low bits of each code, ``1..63``.
        spans: programs per sequence (``None``: :func:`spans_per_sequence`); 1 runs
            every iteration in one launch. For tests and benchmarks.
        stored_signs: whether the sweeps read the codes' signs from a scratch the first launch
            writes (``None``: in one launch, not in split sweeps; module docstring). For tests
            and benchmarks.

    Returns:
        ``assignments`` ``(B, H, N)`` int64 in ``[0, C)`` (``-1`` for padded
        positions) and ``counts`` ``(B, H, C)`` int64, equal to the reference's.
    """
    require_triton("hamming_kmeans", codes.device, kernels_interpreted(_lloyd_kernel))
    _check_arguments("hamming_kmeans", clusters, iterations, bits)
    if codes.dim() != 3 or codes.dtype != torch.int64:
        raise ValueError(
            f"hamming_kmeans: codes must be (B, H, N) int64, got {tuple(codes.shape)} {codes.dtype}"
        )
    if clusters > MAX_CLUSTERS:
        return reference.hamming_kmeans(codes, lengths, clusters, iterations, generator, bits=bits)
    B, H, N = codes.shape
    C = clusters
    device = codes.device
    if N == 0 or B * H == 0:
        return (
            torch.full((B, H, N), -1, dtype=torch.int64, device=device),
            torch.zeros(B, H, C, dtype=torch.int64, device=device),
        )
    if lengths is not None and lengths.shape != (B,):
        raise ValueError(f"hamming_kmeans: lengths must be ({B},), got {tuple(lengths.shape)}")
    lens = _lengths(lengths, B, N, device)
    codes = codes.contiguous()
    programs = spans or spans_per_sequence(B * H, N)
    tile = lloyd_tile(C, programs == 1, N)
    span = cdiv(cdiv(N, programs), tile["BLOCK_N"]) * tile["BLOCK_N"]
    programs = cdiv(N, span)
    if programs == 1:  # every pass in one launch, from the initial centroids it reads itself
        return _one_launch(codes, None, None, lens, C, iterations, bits, stored_signs is not False, tile)
    bitmask = (1 << bits) - 1
    stored = bool(stored_signs)
    # the codes' +-1 signs, written by the first launch (unused without stored signs: the codes)
    signs = torch.empty((B, H, N, 64), dtype=torch.float16, device=device) if stored else codes
    assign = torch.empty((B, H, N), dtype=torch.int64, device=device)
    centroids, _ = initial_centroids(codes, lens, C)
    args = (codes, centroids, lens, assign)
    pointers, sizes, block_e = _vector_arguments(None, None, codes)
    counts = torch.zeros((B, H, C), dtype=torch.int32, device=device)
    ones = torch.zeros((B, H, C, 64), dtype=torch.int32, device=device)
    # moved[i]: the centroids vote i changed, per sequence; 0 ends the sequence's sweeps
    moved = torch.zeros((max(iterations, 1), B * H), dtype=torch.int32, device=device)
    grid = (B * H, programs)
    for i in range(iterations):
        before = moved[i - 1] if i else moved[0]  # read only after a vote
        _lloyd_kernel[grid](
            *args, ones, counts, before, signs, *pointers, H, N, C, span, bitmask, bits, 1, *sizes,
            IN_KERNEL=False, ACCUMULATE=True, AFTER_VOTE=i > 0,
            WRITE_SIGNS=stored and i == 0, READ_SIGNS=stored, HASH=False, BLOCK_E=block_e, **tile,
        )
        _update_kernel[(B * H, cdiv(C, UPDATE_BLOCK_C))](
            centroids, ones, counts, before, moved[i], C, bits, AFTER_VOTE=i > 0, BLOCK_C=UPDATE_BLOCK_C,
        )
    _lloyd_kernel[grid](
        *args, ones, counts, moved[0], signs, *pointers, H, N, C, span, bitmask, bits, 1, *sizes,
        IN_KERNEL=False, ACCUMULATE=False, AFTER_VOTE=False,
        WRITE_SIGNS=stored and iterations == 0, READ_SIGNS=stored, HASH=False, BLOCK_E=block_e, **tile,
    )
    return assign, counts.to(torch.int64)


@torch.no_grad()
def hash_kmeans(
    x: torch.Tensor,
    planes: torch.Tensor,
    lengths: torch.Tensor | None,
    clusters: int,
    iterations: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``triton_hashing.hash_codes(x, planes, lengths)`` clustered by :func:`hamming_kmeans`
    (``bits``: the planes' columns). With :data:`HASH_IN_KMEANS`, the hashing is inside K-means'
    launch where K-means takes one (:func:`spans_per_sequence`; float32, float16 and bfloat16
    vectors; ``C <= MAX_CLUSTERS``): each program hashes its sequence's vectors into the signs its sweeps read
    (:func:`_hashed_signs`, the hash kernel's products) and packs its initial centroids from
    them, so no codes are written or read and the hash takes no launch of its own. Elsewhere
    the two ops, one after the other.

    Args:
        x: ``(B, H, N, E)`` vectors, any strides (head-split views of a projection, say).
        planes: ``(E + 1, bits)`` hyperplanes, row ``E`` the offsets (``hash_codes``).
        lengths, clusters, iterations, generator: as :func:`hamming_kmeans`'s.

    Returns:
        ``assignments`` ``(B, H, N)`` (-1 padded) and ``counts`` ``(B, H, C)``, int64: the
        reference's of the reference's codes (but where a projection lies within rounding of
        0, as ``hash_codes``' do).
    """
    require_triton("hash_kmeans", x.device, kernels_interpreted(_lloyd_kernel))
    B, H, N, _ = triton_hashing.check_inputs("hash_kmeans", x, planes, lengths)
    bits = planes.shape[1]
    _check_arguments("hash_kmeans", clusters, iterations, bits)
    if (not HASH_IN_KMEANS or x.dtype == torch.float64 or clusters > MAX_CLUSTERS or N == 0 or B * H == 0
            or spans_per_sequence(B * H, N) != 1):
        codes = triton_hashing.hash_codes(x, planes, lengths)
        return hamming_kmeans(codes, lengths, clusters, iterations, generator, bits=bits)
    lens = _lengths(lengths, B, N, x.device)
    tile = {**lloyd_tile(clusters, True, N), "num_stages": HASH_IN_KMEANS_STAGES}
    return _one_launch(None, x, planes, lens, clusters, iterations, bits, True, tile)


def _check_arguments(op: str, clusters: int, iterations: int, bits: int) -> None:
    if clusters < 1:
        raise ValueError(f"{op}: clusters={clusters}; expected >= 1")
    if iterations < 0:
        raise ValueError(f"{op}: iterations={iterations}; expected >= 0")
    if not 1 <= bits <= MAX_BITS:
        raise ValueError(f"{op}: bits={bits}; expected 1..{MAX_BITS}")


def _lengths(lengths: torch.Tensor | None, B: int, N: int, device) -> torch.Tensor:
    """``(B,)`` int64 lengths on ``device`` (None: every sequence ``N`` long)."""
    if lengths is None:
        return torch.full((B,), N, dtype=torch.int64, device=device)
    return lengths.to(device=device, dtype=torch.int64).contiguous()


def _vector_arguments(x, planes, codes) -> tuple[tuple, tuple, int]:
    """``_lloyd_kernel``'s arguments for the vectors it hashes (``HASH``): the two pointers,
    ``E`` and the seven strides, and ``BLOCK_E``. Without vectors (``x`` None) the codes stand
    for the pointers and zeros for the rest: the kernel reads none of them."""
    if x is None:
        return (codes, codes), (0,) * 7, 16
    return (x, planes), (x.shape[3], *x.stride(), *planes.stride()), triton_hashing.block_e(x.shape[3])


def _one_launch(codes, x, planes, lens, clusters: int, iterations: int, bits: int, stored: bool, tile: dict):
    """Every Lloyd pass of every sequence in one launch of ``tile`` (:func:`lloyd_tile`), a
    program a sequence: on ``codes`` ``(B, H, N)``, or (``codes`` None) on the hash of ``x`` by
    ``planes`` (``HASH``, which stores the signs). Returns assignments and int64 counts."""
    hashed = codes is None
    B, H, N = (x.shape[:3] if hashed else codes.shape)
    device = lens.device
    span = cdiv(N, tile["BLOCK_N"]) * tile["BLOCK_N"]
    assign = torch.empty((B, H, N), dtype=torch.int64, device=device)
    counts = torch.empty((B, H, clusters), dtype=torch.int64, device=device)
    if hashed:
        codes = assign  # not read: the signs are hashed, and the centroids packed from them
    pointers, sizes, block_e = _vector_arguments(x, planes, codes)
    stored = stored or hashed
    # the codes' +-1 signs, written before the first sweep (unused without stored signs: the codes)
    signs = torch.empty((B, H, N, 64), dtype=torch.float16, device=device) if stored else codes
    # it reads no centroids (cent_ptr: the codes) and accumulates nothing (ones_ptr: counts)
    _lloyd_kernel[(B * H, 1)](
        codes, codes, lens, assign, counts, counts, counts, signs, *pointers, H, N, clusters, span,
        (1 << bits) - 1, bits, iterations + 1, *sizes,
        IN_KERNEL=True, ACCUMULATE=False, AFTER_VOTE=False, WRITE_SIGNS=stored, READ_SIGNS=stored,
        HASH=hashed, BLOCK_E=block_e, **tile,
    )
    return assign, counts
