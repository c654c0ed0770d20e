"""Triton kernels: layer normalisation over the last dimension, forward and backward.

``layer_norm(x, weight, bias, eps)``: ``x (..., D)`` -> ``(x - mean) / sqrt(var + eps) * weight +
bias`` over each row of ``D`` values (the biased variance, as ``torch.nn.functional.layer_norm``),
with its autograd backward. For rows many and short, as a sequence model's activations are
(a batch of 64,000 positions of 192 values), where torch's CUDA kernels are far from the memory
traffic: on the H100 and the H200 a training step's layer-norm backward took 330 µs for
``(64000, 192)`` float32 rows, 263 of them in the kernel summing the weight's and bias's
gradients, and the forward 114 µs, against 20-30 µs to read and write the rows once
(``benchmarks/gpu/notes.md``).

Design:

* ``_forward_kernel``: one program a tile of ``ROWS`` rows held whole in registers (``D`` padded
  to a power of two): the mean, the variance of the centred rows (two passes over registers, not
  over memory), the normalised rows scaled and shifted; each row's mean and ``1 / std`` kept for
  the backward (float32, one ``(2, M)`` tensor);
* ``_backward_kernel``: a fixed number of programs, each walking every ``programs``-th tile of
  rows: a row's input gradient from its ``x̂`` and ``w·dy`` in registers, and the tile's column
  sums of ``dy·x̂`` and ``dy`` (the weight's and bias's gradients) added to two running sums in
  registers; each program stores its two ``(D,)`` sums once, and one ``sum`` over the programs'
  ``(2, P, D)`` partials gives the gradients. No atomics, one read of ``x`` and ``dy`` and one
  write of ``dx``. A tile is one row and a program a warp for each 256 values of the row
  (:func:`backward_tile`), :data:`BACKWARD_WARPS_PER_SM` warps an SM: for the model's rows of
  192, every sum over a row stays inside one warp (shuffles, no barrier across warps). On the
  H200 at a677210, (64,000 × 192) rows: 202 against 412 µs bfloat16 for tiles of 8 rows × 8
  warps, 3 programs an SM, 210 against 202 float32 (inside the noise; torch's: 404)
  (``benchmarks/results/layer_norm_nvidia-h200.md``; the host's issue time in every figure).

The launchers cache each shape's launch (grid, tile, warps) and allocate once a call what the
kernels write: the host's time a call counts as much as the kernels' where a step waits for its
host (``benchmarks/step/layer_norm_gpu.py``'s second table: on the H200's host a forward + backward
through these kernels took 384 µs to issue, torch's 164; the model's pre-norm call under
autocast 483 against 199).

Float32 arithmetic whatever the input's dtype; the output has the input's dtype or the one asked
for, the input's gradient the input's, the weight's and bias's gradients theirs. Rows are read
and written through their stride (the last dimension contiguous). Rows wider than
:data:`MAX_WIDTH` and other dtypes are not served (:func:`applies`); :mod:`fastasr.kernels.layer_norm`
sends them to torch. Nothing reads a value back to the host.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from fastasr.kernels.availability import kernels_interpreted, prepare_interpreter, require_triton
from fastasr.kernels.grid import cdiv, multiprocessors, next_power_of_2
from fastasr.kernels.rows import unit_stride

prepare_interpreter()

__all__ = ["layer_norm", "applies", "forward_tile", "backward_tile", "backward_programs", "backward_programs_per_sm",
           "MAX_WIDTH"]

#: Widest rows served: a tile of rows is held in registers.
MAX_WIDTH = 4096
#: Values in a forward tile of rows (``ROWS × D`` padded): 8 rows of 256 (sm_90, D = 192: 64
#: registers, 8 programs an SM; no spills), held 16 values a thread (the warps a program).
TILE = 2048
FORWARD_VALUES_PER_THREAD = 16
#: The backward: a warp a :data:`BACKWARD_VALUES_PER_WARP` values of a row (one row a tile), and
#: as many programs as make :data:`BACKWARD_WARPS_PER_SM` warps an SM (each walks its share of
#: the rows, holding two ``(D,)`` sums): (64,000 × 192) bfloat16 rows on the H200 in 202 µs
#: against 412 for 8-row tiles of 8 warps, 3 programs an SM (float32: 210 against 202).
BACKWARD_VALUES_PER_WARP = 256
BACKWARD_WARPS_PER_SM = 32
_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _forward_kernel(x_ptr, w_ptr, b_ptr, y_ptr, stats_ptr, M, D, s_xm, s_ym, eps,
                    ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_D)
    in_rows = rows < M
    in_cols = cols < D
    inside = in_rows[:, None] & in_cols[None, :]
    rows = rows.to(tl.int64)
    x = tl.load(x_ptr + rows[:, None] * s_xm + cols[None, :], mask=inside, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / D
    centred = tl.where(inside, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / D + eps)
    w = tl.load(w_ptr + cols, mask=in_cols, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=in_cols, other=0.0).to(tl.float32)
    y = centred * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + rows[:, None] * s_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=inside)
    tl.store(stats_ptr + rows, mean, mask=in_rows)  # the means, then the 1 / std
    tl.store(stats_ptr + M + rows, rstd, mask=in_rows)


@triton.jit
def _backward_kernel(x_ptr, dy_ptr, w_ptr, stats_ptr, dx_ptr, partial_ptr, M, D, s_xm, s_dym, s_dxm,
                     ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    program = tl.program_id(0)
    programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_D)
    in_cols = cols < D
    w = tl.load(w_ptr + cols, mask=in_cols, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_D,), tl.float32)
    db = tl.zeros((BLOCK_D,), tl.float32)
    for tile in range(program, tl.cdiv(M, ROWS), programs):
        rows = tile * ROWS + tl.arange(0, ROWS)
        in_rows = rows < M
        inside = in_rows[:, None] & in_cols[None, :]
        rows = rows.to(tl.int64)
        x = tl.load(x_ptr + rows[:, None] * s_xm + cols[None, :], mask=inside, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + rows[:, None] * s_dym + cols[None, :], mask=inside, other=0.0).to(tl.float32)
        mean = tl.load(stats_ptr + rows, mask=in_rows, other=0.0)
        rstd = tl.load(stats_ptr + M + rows, mask=in_rows, other=0.0)
        xhat = tl.where(inside, (x - mean[:, None]) * rstd[:, None], 0.0)
        wdy = w[None, :] * dy
        c1 = tl.sum(xhat * wdy, axis=1) / D
        c2 = tl.sum(wdy, axis=1) / D
        dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        tl.store(dx_ptr + rows[:, None] * s_dxm + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=inside)
        dw += tl.sum(dy * xhat, axis=0)
        db += tl.sum(dy, axis=0)
    tl.store(partial_ptr + program * D + cols, dw, mask=in_cols)
    tl.store(partial_ptr + (programs + program) * D + cols, db, mask=in_cols)


def applies(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> bool:
    """Whether :func:`layer_norm` serves ``x`` normalised over its last dimension with ``weight``
    and ``bias``: both given, of the row's width, at most :data:`MAX_WIDTH` wide, float32 or
    half precision, the rows non-empty."""
    d = x.shape[-1] if x.dim() else 0
    return (weight is not None and bias is not None and 0 < d <= MAX_WIDTH and x.numel() > 0
            and weight.shape == (d,) and bias.shape == (d,)
            and x.dtype in _SUPPORTED and weight.dtype in _SUPPORTED and bias.dtype in _SUPPORTED)


def forward_tile(d: int) -> dict:
    """The forward's launch for rows of ``d`` values: rows a program, the padded width, warps."""
    block_d = next_power_of_2(d)
    rows = max(1, TILE // block_d)
    return {"ROWS": rows, "BLOCK_D": block_d,
            "num_warps": max(4, min(16, rows * block_d // (32 * FORWARD_VALUES_PER_THREAD)))}


def backward_tile(d: int) -> dict:
    """The backward's launch for rows of ``d`` values: rows a tile (one), the padded width, and a
    warp a :data:`BACKWARD_VALUES_PER_WARP` values of it (1 to 16)."""
    block_d = next_power_of_2(d)
    return {"ROWS": 1, "BLOCK_D": block_d, "num_warps": max(1, min(16, block_d // BACKWARD_VALUES_PER_WARP))}


def backward_programs(m: int, d: int, device: torch.device) -> int:
    """How many backward programs walk ``m`` rows of ``d`` values: one a tile, at most as many as
    make :data:`BACKWARD_WARPS_PER_SM` warps an SM (4 SMs on the CPU's interpreter)."""
    return min(cdiv(m, backward_tile(d)["ROWS"]), backward_programs_per_sm(d) * multiprocessors(device))


def backward_programs_per_sm(d: int) -> int:
    """The backward's programs an SM for rows of ``d`` values: :data:`BACKWARD_WARPS_PER_SM` warps
    (at least one program)."""
    return max(1, BACKWARD_WARPS_PER_SM // backward_tile(d)["num_warps"])


@functools.lru_cache(maxsize=64)
def _forward_launch(m: int, d: int) -> tuple[tuple[int], dict]:
    """The forward's grid and launch arguments for ``m`` rows of ``d`` values (a step asks at
    every layer: cached)."""
    tile = forward_tile(d)
    return (cdiv(m, tile["ROWS"]),), tile


@functools.lru_cache(maxsize=64)
def _backward_launch(m: int, d: int, device: torch.device) -> tuple[int, dict]:
    """The backward's programs and launch arguments (cached as :func:`_forward_launch`)."""
    return backward_programs(m, d, device), backward_tile(d)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t (..., D)`` as ``(M, D)`` rows with a unit stride along ``D`` (a view where it can be)."""
    return unit_stride(t.reshape(-1, t.shape[-1]))


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, out_dtype):
        rows = _rows(x)
        m, d = rows.shape
        y = torch.empty((m, d), dtype=out_dtype or x.dtype, device=x.device)
        stats = torch.empty(2 * m, dtype=torch.float32, device=x.device)  # the means, the 1 / std
        grid, tile = _forward_launch(m, d)
        _forward_kernel[grid](rows, weight, bias, y, stats, m, d, rows.stride(0), y.stride(0), eps, **tile)
        ctx.save_for_backward(rows, weight, stats)
        ctx.bias_dtype = bias.dtype
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        rows, weight, stats = ctx.saved_tensors
        m, d = rows.shape
        dy_rows = _rows(dy)
        dx = torch.empty((m, d), dtype=rows.dtype, device=rows.device)
        programs, tile = _backward_launch(m, d, rows.device)
        partial = torch.empty((2, programs, d), dtype=torch.float32, device=rows.device)
        _backward_kernel[(programs,)](rows, dy_rows, weight, stats, dx, partial, m, d, rows.stride(0),
                                      dy_rows.stride(0), dx.stride(0), **tile)
        dw, db = partial.sum(1)
        return dx.view(dy.shape), dw.to(weight.dtype), db.to(ctx.bias_dtype), None, None


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.nn.functional.layer_norm(x, (D,), weight, bias, eps)`` by the Triton kernels, for
    inputs :func:`applies` serves (the caller's to check); the output in ``out_dtype`` (default:
    ``x``'s), rounded once from float32, and the input's gradient in ``x``'s."""
    require_triton("layer_norm", x.device, kernels_interpreted(_forward_kernel))
    return _LayerNorm.apply(x, weight, bias, float(eps), out_dtype)
