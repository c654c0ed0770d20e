"""Triton kernel: the indices of each row's ``k`` largest scores, by bisection in registers.

``topk_indices(scores, k)`` is the Triton twin of ``fastasr.kernels.clustering.reference.topk_indices``
for CUDA float32 rows: ``(..., N)`` scores -> ``(..., k)`` int64 indices of each row's ``k``
largest entries, each row's in increasing position (``triton_centroid``'s backward walks
them so; ``torch.topk``'s are in the scores' order). Improved clustered attention calls
it on the ``(B, H, C, N)`` centroid logits: many short rows (``B·H·C`` of them, ``N`` a few
hundred to a few thousand), which ``torch.topk``'s radix select serves with several passes
over global memory a row.

Design. One program holds ``ROWS`` whole rows in registers. Each score becomes an int32
key with the order of the floats (the bits, with the lower 31 flipped for negatives;
``-inf``, the masked keys, orders below every finite score). The ``k``-th largest key ``T`` is
found by bisection over the int32 range, a compare and a count per row a step, all on chip;
a row stops once exactly ``k`` keys lie at or above its lower bound, which then is a ``T``
that takes the same set (about ``32 - log2`` of the distance between the ``k``-th and
``k+1``-th largest keys: 15-16 steps on average, 11-25, for rows of 800 and 3,200 Gaussian
float32 scores with k = 32; ties at the ``k``-th score and ``-inf`` padding take more, at most
32), and a program once all its rows have: 29-38 % faster than 32 steps a row at
N = 800-4,096 (benchmarks/gpu/notes.md "Decisions"). A row starts from a bracket of its own
keys (:data:`BRACKET`; half the steps on Gaussian scores); then the entries above ``T``
are taken, and of those equal to ``T`` the lowest positions until ``k`` are taken: the row is
read again a chunk at a time (:data:`STORE_ELEMENTS` a thread), and one running sum of both
counts (packed in one int32) gives each taken entry its slot. ``k`` indices are written: no
sort, no host synchronisation.
Rows longer than :data:`MAX_N` (not held in registers) and other dtypes go to
``torch.topk``. ``topk_softmax(logits, lse, k)`` is the same launch that also writes the
taken entries' softmax weights ``exp(score - lse)`` (i-clustered's top weights, given each
row's log-sum-exp).
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
from fastasr.kernels.clustering import reference
from fastasr.kernels.grid import cdiv, next_power_of_2

prepare_interpreter()

__all__ = ["topk_indices", "topk_softmax", "topk_tile", "store_chunk", "MAX_N", "STORE_ELEMENTS"]

#: Longest row held in registers (one program, 8 warps, 32 scores a thread); longer rows: torch.topk.
MAX_N = 8192
_ELEMENTS = 4096  # scores a program holds at most when several rows share it
#: Entries a thread takes at a time once a row's ``k``-th largest key is known (slots, indices,
#: weights: :func:`store_chunk`); None: the whole row at once. By chunks the kernel holds 72
#: registers a thread for rows of up to 1,024 scores on one warp (sm_90, with the weights)
#: against 218 for the whole row, so 28 warps an SM run the bisection instead of 8, for 2 %
#: more instructions (the scores are read a second time, from cache). ``make gpu-check``'s
#: parts table times the whole row ("top-k: Triton, whole-row stores").
STORE_ELEMENTS: int | None = 4
#: Whether each row's bisection starts from a bracket of its keys instead of the whole int32
#: range: from below, the least of :data:`BRACKET_GROUPS` strided groups' largest keys (at least
#: that many keys lie at or above it; taken where a count finds ``k`` there, padding's and ``-inf``'s
#: groups left out), from above the row's largest key. The same keys; on rows of 800 and 3,200
#: Gaussian scores with k = 32, 6.7-7.3 steps a row after one count, against 15.0-16.4 from the
#: whole range: the top-k in 0.77-0.87 of the whole range's time at N = 800-4,096 on Hopper
#: (benchmarks/results/clustering_nvidia-h200.md). ``make gpu-check``'s parts table times the
#: whole range again ("top-k: Triton, whole int32 range").
BRACKET = True
BRACKET_GROUPS = 32
#: ``-inf``'s int32 key as :func:`_row_keys` makes it (a negative float's bits, the lower 31
#: flipped): a group of masked keys bounds nothing.
_NEG_INF_KEY = tl.constexpr(int(torch.tensor(float("-inf")).view(torch.int32)) ^ 0x7FFFFFFF)


@triton.jit
def _row_keys(x_ptr, rows, cols, R, N, ROW_STRIDE):
    """The scores of ``rows`` (``ROW_STRIDE`` apart) at ``cols`` (``(ROWS, COLS)``, -0.0 as 0.0),
    their int32 keys in the order of the floats (lanes past ``N`` or ``R``: below every score),
    and where they lie."""
    inside = (rows[:, None] < R) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * ROW_STRIDE + cols[None, :], mask=inside, other=0.0)
    x = tl.where(x == 0.0, 0.0, x)  # -0.0 and 0.0 are equal scores: one key
    bits = x.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # int32 keys in the order of the floats
    return x, tl.where(inside, key, -2147483648), inside


@triton.jit
def _topk_kernel(x_ptr, out_ptr, lse_ptr, w_ptr, R, N, K, ROW_STRIDE,
                 BLOCK_N: tl.constexpr, ROWS: tl.constexpr, WEIGHTS: tl.constexpr, CHUNK: tl.constexpr,
                 BRACKET: tl.constexpr, GROUPS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    _, key, _ = _row_keys(x_ptr, rows, tl.arange(0, BLOCK_N), R, N, ROW_STRIDE)
    # bisection, each row stopping once exactly K keys are >= lo
    lo = tl.full((ROWS,), -2147483648, tl.int64)  # count(key >= lo) >= K
    hi = tl.full((ROWS,), 2147483648, tl.int64)  # count(key >= hi) < K
    at_lo = tl.full((ROWS,), BLOCK_N, tl.int32)  # count(key >= lo): every lane at first
    if BRACKET:  # BRACKET's bracket: lanes j, j + GROUPS, ... a group; a group of -inf or padding bounds nothing
        top = tl.max(tl.reshape(key, (ROWS, BLOCK_N // GROUPS, GROUPS)), axis=1)  # (ROWS, GROUPS)
        least = tl.min(tl.where(top > _NEG_INF_KEY, top, 2147483647), axis=1)
        at_least = tl.sum((key >= least[:, None]).to(tl.int32), 1)
        lo = tl.where(at_least >= K, least.to(tl.int64), lo)
        at_lo = tl.where(at_least >= K, at_least, at_lo)
        hi = tl.max(key, axis=1).to(tl.int64) + 1
    open_rows = tl.sum(((at_lo != K) & (hi - lo > 1)).to(tl.int32), 0)
    while open_rows > 0:
        going = (at_lo != K) & (hi - lo > 1)
        mid = lo + (hi - lo) // 2  # in [lo, hi): an int32 value
        count = tl.sum((key >= mid.to(tl.int32)[:, None]).to(tl.int32), 1)
        enough = count >= K
        lo = tl.where(going & enough, mid, lo)
        at_lo = tl.where(going & enough, count, at_lo)
        hi = tl.where(going & ~enough, mid, hi)
        open_rows = tl.sum(((at_lo != K) & (hi - lo > 1)).to(tl.int32), 0)
    # exactly K keys >= lo (a threshold that takes the same set as the K-th largest key), or lo
    # the K-th largest key itself (hi = lo + 1)
    kth = lo.to(tl.int32)[:, None]
    room = K - tl.sum((key > kth).to(tl.int32), 1)  # slots left for the ties, lowest positions first
    if WEIGHTS:  # the softmax at the taken entries: exp(score - the row's log-sum-exp)
        lse = tl.load(lse_ptr + rows, mask=rows < R, other=0.0)
        lse = tl.where(lse == float("-inf"), 0.0, lse)  # a row without keys: weights 0
    # The taken entries' slots and stores, CHUNK columns at a time, the scores read again (from
    # cache): the whole row's slots, addresses and int64 indices at once hold 3x the registers
    # of the bisection, and so fewer programs an SM while it runs (STORE_ELEMENTS).
    # An entry's slot is the entries above the k-th key up to it and the ties up to it, at most
    # ``room`` of those: one running count of each, packed in one int32 (ties << 16: a row has
    # fewer than 65,536 entries) for one scan a chunk.
    before = tl.zeros((ROWS,), tl.int32)  # the packed counts of the chunks before
    for start in range(0, BLOCK_N, CHUNK):
        cols = start + tl.arange(0, CHUNK)
        x, ckey, cinside = _row_keys(x_ptr, rows, cols, R, N, ROW_STRIDE)
        above = ckey > kth
        tied = (ckey == kth) & cinside
        packed = above.to(tl.int32) | (tied.to(tl.int32) << 16)
        counts = before[:, None] + tl.cumsum(packed, 1)
        ties_up_to = counts >> 16
        take = above | (tied & (ties_up_to <= room[:, None]))
        slot = (counts & 0xFFFF) + tl.minimum(ties_up_to, room[:, None]) - 1
        out = rows.to(tl.int64)[:, None] * K + slot
        tl.store(out_ptr + out, cols[None, :].to(tl.int64), mask=take)
        if WEIGHTS:
            tl.store(w_ptr + out, tl.exp(x - lse[:, None]), mask=take)
        before += tl.sum(packed, 1)


def topk_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices ``(..., k)`` of the ``k`` largest entries of each row of ``scores (..., N)``.

    In increasing position; of equal scores at the boundary the lowest positions are taken. No
    autograd (the scores are detached). float32 rows of at most :data:`MAX_N` run the
    kernel; others ``torch.topk`` (``reference.topk_indices``).

    Raises:
        ValueError: ``k`` outside ``[0, N]``.
    """
    N = scores.shape[-1]
    if not 0 <= k <= N:
        raise ValueError(f"topk_indices: k={k} must be in [0, N={N}]")
    if scores.dtype != torch.float32 or N > MAX_N or k == 0 or scores.numel() == 0:
        return reference.topk_indices(scores, k)
    require_triton("topk_indices", scores.device, kernels_interpreted(_topk_kernel))
    return _select(scores, k)[0]


def topk_softmax(logits: torch.Tensor, lse: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest logits of each row and their softmax weights, in one launch.

    ``logits (..., N)`` float32, ``N <= MAX_N``, ``lse (...)`` float32 each row's
    log-sum-exp -> ``(indices, weights)``, both ``(..., k)``: the indices as
    :func:`topk_indices`, ``weights = exp(logits[indices] - lse)`` (0 in a row whose
    ``lse`` is ``-inf``). No autograd.

    Raises:
        ValueError: ``k`` outside ``[1, N]``, rows longer than :data:`MAX_N` or not float32.
    """
    N = logits.shape[-1]
    if not 1 <= k <= N or N > MAX_N or logits.dtype != torch.float32 or lse.dtype != torch.float32:
        raise ValueError(f"topk_softmax: needs float32 logits and lse, 1 <= k <= N <= {MAX_N}; "
                         f"got k={k}, N={N}, {logits.dtype} logits, {lse.dtype} lse")
    if lse.shape != logits.shape[:-1]:
        raise ValueError(f"topk_softmax: lse {tuple(lse.shape)} must be the logits' rows "
                         f"{tuple(logits.shape[:-1])}")
    require_triton("topk_softmax", logits.device, kernels_interpreted(_topk_kernel))
    return _select(logits, k, lse)


def _select(scores: torch.Tensor, k: int, lse: torch.Tensor | None = None):
    """One launch over the rows of ``scores``: ``(indices, weights)``, weights None without ``lse``."""
    N = scores.shape[-1]
    rows = scores.detach().reshape(-1, N)  # a view where the rows are evenly spaced (padded rows)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    R = rows.shape[0]
    per_program, warps = topk_tile(N, R)
    idx = torch.empty((R, k), dtype=torch.int64, device=scores.device)
    weights = None if lse is None else torch.empty((R, k), dtype=torch.float32, device=scores.device)
    if R:
        _topk_kernel[(cdiv(R, per_program),)](  # without weights the scores stand in for both
            rows, idx, rows if lse is None else lse.detach().reshape(-1).contiguous(),
            rows if weights is None else weights, R, N, k, rows.stride(0),
            BLOCK_N=next_power_of_2(N), ROWS=per_program, WEIGHTS=lse is not None,
            CHUNK=store_chunk(N, per_program, warps), BRACKET=BRACKET,
            GROUPS=min(BRACKET_GROUPS, next_power_of_2(N)), num_warps=warps,
        )
    shape = (*scores.shape[:-1], k)
    return idx.view(shape), None if weights is None else weights.view(shape)


def topk_tile(n: int, rows: int) -> tuple[int, int]:
    """``(rows a program, warps)`` for ``rows`` rows of ``n`` scores: one row and one warp a
    program for rows of up to 1,024 scores (no count crosses warps in the bisection steps);
    longer rows, as many whole rows as fit in ``_ELEMENTS`` scores a program, 8 warps from
    4,096 scores a program, else 4.

    Measured by ``attention/clustering_gpu.py`` (benchmarks/results/clustering_*.md, the parts
    table, 6 heads x 100 centroids, 65,536 tokens): at N = 800 and 1,024, 0.57 and 0.42 ms
    with a warp a row against 1.07 and 0.88 with 4 rows x 8 warps a program; at N = 3,200 to
    16,384 the two are within 6 % either way, so longer rows keep the shared program.
    ``python -m benchmarks.attention.clustering_gpu --topk-tiles`` times other tiles against this one.
    """
    block_n = next_power_of_2(n)
    if block_n <= 1024:
        return 1, 1
    per_program = max(1, min(_ELEMENTS // block_n, next_power_of_2(rows)))
    return per_program, 8 if block_n * per_program >= 4096 else 4


def store_chunk(n: int, rows: int, warps: int) -> int:
    """Columns of a program's rows the kernel takes at a time once it knows each row's ``k``-th
    largest key (slots, indices and weights): :data:`STORE_ELEMENTS` a thread, at most the
    row's block (all of it where ``STORE_ELEMENTS`` is None)."""
    block_n = next_power_of_2(n)
    if STORE_ELEMENTS is None:
        return block_n
    return min(block_n, next_power_of_2(max(1, STORE_ELEMENTS * 32 * warps // rows)))

