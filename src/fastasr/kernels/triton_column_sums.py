"""Triton kernel: the sums of a matrix's columns over many rows (a bias's gradient).

``column_sums(rows)``: ``rows (M, D)`` -> ``(D,)``, each column's sum over the ``M`` rows, in
float32 and returned in the rows' dtype (as ``rows.sum(0)``). For many short rows, as a linear
layer's output gradient is (64,000 positions of 192 or 768 values), where torch's reduction over
the outer dimension was far from the memory traffic: on the H100 and the H200 a training step's
bias gradients took 104-109 µs a call, against 5-20 µs to read the rows once
(``benchmarks/gpu/notes.md``).

Design: ``programs`` × column blocks of programs (a few an SM in all), each walking every
``programs``-th tile of ``ROWS`` rows of its columns and adding the tile to a ``(ROWS, BLOCK_D)``
running sum in registers (no reduction inside the walk), which it sums over its rows once and
stores as its partial; one ``sum`` over the ``(programs, D)`` partials gives the columns' sums.
No atomics; the rows are read once, through their stride (the columns contiguous). Rows of
float32 and half precision are served (:func:`applies`); others are the caller's to sum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastasr.kernels.availability import kernels_interpreted, prepare_interpreter, require_triton
from fastasr.kernels.grid import cdiv, multiprocessors, next_power_of_2
from fastasr.kernels.rows import unit_stride

prepare_interpreter()

__all__ = ["column_sums", "applies", "column_tile", "column_programs"]

#: Rows a tile and the widest column block: 32 rows × 256 columns, 8 warps (32 values a thread
#: in the running sum; sm_90: 78 registers, 3 programs an SM, no spills) ...
ROWS = 32
MAX_BLOCK_D = 256
WARPS = 8
#: ... and programs an SM in all (each column block's share of them): one wave.
PROGRAMS_PER_SM = 3
_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _column_sums_kernel(x_ptr, partial_ptr, M, D, s_xm, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    program = tl.program_id(0)
    programs = tl.num_programs(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    in_cols = cols < D
    total = tl.zeros((ROWS, BLOCK_D), tl.float32)
    for tile in range(program, tl.cdiv(M, ROWS), programs):
        rows = tile * ROWS + tl.arange(0, ROWS)
        inside = (rows < M)[:, None] & in_cols[None, :]
        total += tl.load(x_ptr + rows.to(tl.int64)[:, None] * s_xm + cols[None, :], mask=inside,
                         other=0.0).to(tl.float32)
    tl.store(partial_ptr + program * D + cols, tl.sum(total, axis=0), mask=in_cols)


def applies(x: torch.Tensor) -> bool:
    """Whether :func:`column_sums` serves ``x``'s rows (``x (..., D)`` as ``(M, D)``): non-empty,
    float32 or half precision."""
    return x.dim() >= 1 and x.numel() > 0 and x.dtype in _SUPPORTED


def column_tile(d: int) -> dict:
    """The launch for rows of ``d`` values: rows a tile, the column block, warps."""
    return {"ROWS": ROWS, "BLOCK_D": min(MAX_BLOCK_D, next_power_of_2(d)), "num_warps": WARPS}


def column_programs(m: int, d: int, device: torch.device) -> int:
    """Programs a column block for ``m`` rows of ``d`` values: one a tile, at most
    :data:`PROGRAMS_PER_SM` an SM over all column blocks (4 SMs on the CPU's interpreter)."""
    blocks = cdiv(d, column_tile(d)["BLOCK_D"])
    return max(1, min(cdiv(m, ROWS), PROGRAMS_PER_SM * multiprocessors(device) // blocks))


def column_sums(rows: torch.Tensor) -> torch.Tensor:
    """``rows (M, D)`` -> ``(D,)`` in ``rows``' dtype: ``rows.sum(0)``, summed in float32 (module
    doc); for rows :func:`applies` serves (the caller's to check)."""
    require_triton("column_sums", rows.device, kernels_interpreted(_column_sums_kernel))
    rows = unit_stride(rows)
    m, d = rows.shape
    tile = column_tile(d)
    warps = tile.pop("num_warps")
    programs = column_programs(m, d, rows.device)
    partial = torch.empty((programs, d), dtype=torch.float32, device=rows.device)
    _column_sums_kernel[(programs, cdiv(d, tile["BLOCK_D"]))](rows, partial, m, d, rows.stride(0), **tile,
                                                              num_warps=warps)
    return partial.sum(0).to(rows.dtype)
