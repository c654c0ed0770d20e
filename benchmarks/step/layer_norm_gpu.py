"""The model's layer norm on a GPU: torch's kernels against the Triton ones, each backward launch
shape, and what the host spends issuing a call.

    python -m benchmarks.step.layer_norm_gpu                    # (64,000 × 192): the step at N = 800
    python -m benchmarks.step.layer_norm_gpu --rows 64000 --width 192 --tiles 8:8:3 1:1:16

The paper model's step normalises 64,000 rows of 192 values nineteen times, forward and
backward (float32 rows: the residual stream, as CUDA autocast runs a layer norm). Two tables:

* **GPU time** (CUDA events, the median of ``--repeats`` after warm-ups): the forward, and the
  backward as the step runs it (``torch.autograd.grad`` of a kept graph: the input's, weight's
  and bias's gradients, the partial sums' reduction included), by torch's kernels and by the
  Triton kernels with each backward launch shape of ``--tiles``: ``ROWS:WARPS:PROGRAMS`` =
  rows a tile, warps a program, programs an SM (``triton_layer_norm.backward_tile`` and
  ``BACKWARD_WARPS_PER_SM``; the default's first). A CUDA event pair brackets one call, so the
  host's time from the first event to the kernel's launch is in every figure (the same for
  every Triton variant: their differences are the kernels'; ``step/gpu.py --profile`` has the
  kernels alone). Beside each, the time to read and write
  the rows once at the GPU's bandwidth (``--bandwidth-tbs``): the floor. Every Triton variant's
  gradients are checked against torch's first.
* **The host's time a call** (µs): forward + backward of a (8 × width) input issued
  ``--host-calls`` times without waiting (the GPU idles: the host sets the pace), by torch and by
  the Triton kernels; and one bare launch of a Triton kernel (the forward's) against one of
  torch's (an in-place add), the same way. Where the model's step waits for its host (at
  N = 800, ``step/gpu.py``'s third table), this is what each of its 38 layer-norm calls adds.

Writes ``benchmarks/results/layer_norm_<gpu>.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import sys
from pathlib import Path
from unittest import mock

from benchmarks import bench_io, timing

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from fastasr.kernels.grid import next_power_of_2  # noqa: E402
from fastasr.kernels.layers import layer_norm as fastasr_ln  # noqa: E402
from fastasr.kernels.layers import triton_layer_norm as tln  # noqa: E402


def parse_tile(text: str) -> tuple[int, int, int]:
    """``ROWS:WARPS:PROGRAMS`` -> three positive ints, else a SystemExit naming the value."""
    try:
        rows, warps, programs = (int(p) for p in text.split(":"))
    except ValueError:
        raise SystemExit(f"--tiles: {text!r}; expected ROWS:WARPS:PROGRAMS, e.g. 8:8:3") from None
    if min(rows, warps, programs) < 1 or warps & (warps - 1) or rows & (rows - 1):
        raise SystemExit(f"--tiles: {text!r}; expected powers of two for ROWS and WARPS, PROGRAMS >= 1")
    return rows, warps, programs


def default_tile(width: int) -> tuple[int, int, int]:
    tile = tln.backward_tile(width)
    return tile["ROWS"], tile["num_warps"], tln.backward_programs_per_sm(width)


@contextlib.contextmanager
def backward_shape(rows: int, warps: int, programs: int):
    """A context in which the Triton backward launches ``rows`` a tile, ``warps`` a program and
    ``programs`` programs an SM (the launchers' cached launches cleared on the way in and out)."""
    def tile(d: int) -> dict:
        return {"ROWS": rows, "BLOCK_D": next_power_of_2(d), "num_warps": warps}
    tln._backward_launch.cache_clear()
    try:
        with mock.patch.multiple(tln, backward_tile=tile, BACKWARD_WARPS_PER_SM=programs * warps):
            yield
    finally:
        tln._backward_launch.cache_clear()


def timed_ms(fn, repeats: int) -> float:
    """Median CUDA-event milliseconds of ``fn()`` after three warm-ups."""
    return timing.measure(fn, warmup=3, repeats=repeats, device="cuda").median_ms


def norm_fn(kind: str):
    if kind == "torch":
        return lambda x, w, b: F.layer_norm(x, x.shape[-1:], w.to(x.dtype), b.to(x.dtype), 1e-5)
    return lambda x, w, b: tln.layer_norm(x, w, b, 1e-5)


def gpu_times(args, dtype) -> list[tuple[str, float, float]]:
    """``(variant, forward ms, backward ms)`` on ``(rows, width)`` rows of ``dtype``."""
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (args.rows, args.width)
    x = (torch.randn(shape, device="cuda", generator=g) * 3 + 1).to(dtype).requires_grad_()
    w = torch.randn(args.width, device="cuda", generator=g).requires_grad_()
    b = torch.randn(args.width, device="cuda", generator=g).requires_grad_()
    dy = torch.randn(shape, device="cuda", generator=g).to(dtype)
    leaves = (x, w, b)

    def grads(kind):
        y = norm_fn(kind)(*leaves)
        return y, torch.autograd.grad(y, leaves, dy, retain_graph=True)

    _, want = grads("torch")
    out = []
    shapes = [default_tile(args.width)] + [t for t in map(parse_tile, args.tiles) if t != default_tile(args.width)]
    for kind, shape_ in [("torch", None)] + [("triton", s) for s in shapes]:
        label = "torch" if kind == "torch" else "Triton {}:{}:{}".format(*shape_) + (
            " (default)" if shape_ == shapes[0] else "")
        with backward_shape(*shape_) if shape_ else contextlib.nullcontext():
            y, got = grads(kind)
            for name, a, e in zip(("x", "weight", "bias"), got, want):
                tol = 2e-2 if dtype != torch.float32 else 1e-3
                torch.testing.assert_close(a.float(), e.float(), atol=tol * e.abs().max().item(), rtol=tol,
                                           msg=lambda m, n=name, lb=label: f"{lb}: d{n}: {m}")
            fwd = timed_ms(lambda k=kind: norm_fn(k)(*leaves), args.repeats)
            bwd = timed_ms(lambda y=y: torch.autograd.grad(y, leaves, dy, retain_graph=True), args.repeats)
        out.append((label, fwd, bwd))
    return out


def host_us(fn, calls: int) -> float:
    """Wall µs a call of ``fn()`` issued ``calls`` times in a row, the GPU's queue drained once at
    the end (after a warm-up of the same)."""
    def issue():
        for _ in range(calls):
            fn()

    return 1e3 * timing.measure(issue, warmup=1, repeats=1, device="cuda", clock="wall").median_ms / calls


def host_times(args) -> list[tuple[str, float]]:
    x = torch.randn(8, args.width, device="cuda", requires_grad=True)
    w = torch.ones(args.width, device="cuda", requires_grad=True)
    b = torch.zeros(args.width, device="cuda", requires_grad=True)
    rows = []
    for kind in ("torch", "triton"):
        fn = norm_fn(kind)

        def call(fn=fn):
            y = fn(x, w, b)
            torch.autograd.grad(y, (x, w, b), torch.ones_like(y))
        rows.append((f"layer norm forward + backward, {kind}", host_us(call, args.host_calls)))
    for kind in ("torch", "triton"):  # as the model calls it: a pre-norm layer's norm under bf16 autocast

        def model_call():
            with torch.autocast("cuda", torch.bfloat16):
                y = fastasr_ln.layer_norm(x, (args.width,), w, b, cast_output=True)
            torch.autograd.grad(y, (x, w, b), torch.ones_like(y))
        with mock.patch.object(fastasr_ln, "TRITON_LAYER_NORM", kind == "triton"):
            rows.append((f"the model's pre-norm call (`fastasr.kernels.layers.layer_norm`, bf16 autocast), {kind}",
                         host_us(model_call, args.host_calls)))
    y = torch.empty_like(x.detach())
    stats = torch.empty(16, device="cuda")
    grid, tile = tln._forward_launch(8, args.width)
    xd = x.detach()

    def bare_triton():
        tln._forward_kernel[grid](xd, w, b, y, stats, 8, args.width, xd.stride(0), y.stride(0), 1e-5, **tile)
    rows.append(("one Triton launch (the forward kernel)", host_us(bare_triton, args.host_calls)))
    rows.append(("one torch launch (an in-place add)", host_us(lambda: y.add_(1.0), args.host_calls)))
    return rows


def write_table(args, info, tables, host) -> Path:
    floor_us = lambda passes: args.rows * args.width * passes / (args.bandwidth_tbs * 1e6)  # noqa: E731
    lines = [f"# Layer norm on the GPU: torch's kernels against the Triton ones ({info['gpu']})", "",
             bench_io.command_line("step/layer_norm_gpu.py"), "",
             f"{datetime.date.today()}, torch {torch.__version__}, commit {bench_io.git_commit(ROOT)}. "
             f"({args.rows:,} × {args.width}) rows, the gradients checked against torch's before timing; "
             f"CUDA events, median of {args.repeats} after 3 warm-ups. Backward launch shapes "
             "`ROWS:WARPS:PROGRAMS` (rows a tile, warps a program, programs an SM). Floor: the rows "
             f"read and written once at {args.bandwidth_tbs} TB/s (forward: x in, y out; backward: x, dy "
             "in, dx out).", ""]
    for dtype, rows in tables:
        size = torch.finfo(dtype).bits // 8
        fwd_floor, bwd_floor = floor_us(2 * size), floor_us(3 * size)
        lines += [f"## {str(dtype).removeprefix('torch.')} rows", "",
                  f"| variant | forward µs | × floor ({fwd_floor:.0f} µs) | backward µs | × floor ({bwd_floor:.0f} µs) |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| {label} | {fwd * 1e3:.0f} | {fwd * 1e3 / fwd_floor:.1f} | {bwd * 1e3:.0f} | "
                  f"{bwd * 1e3 / bwd_floor:.1f} |" for label, fwd, bwd in rows]
        lines.append("")
    lines += [f"## The host's time a call ({info['cpu']}, {info['cores']} cores; {args.host_calls} calls "
              f"issued back to back, (8 × {args.width}) rows)", "", "| call | µs |", "|---|---:|"]
    lines += [f"| {label} | {us:.1f} |" for label, us in host]
    path = bench_io.result_stem(args.out_dir, "layer_norm", info).with_suffix(".md")
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return path


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=64000)
    p.add_argument("--width", type=int, default=192)
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16", "float16"])
    p.add_argument("--tiles", nargs="*", default=["8:8:3", "8:8:8", "2:1:16", "1:1:16", "16:8:2"],
                   help="backward launch shapes ROWS:WARPS:PROGRAMS besides the default")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--host-calls", type=int, default=300)
    p.add_argument("--bandwidth-tbs", type=float, default=4.8, help="HBM bandwidth for the floor (H200: 4.8)")
    p.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    args = p.parse_args(argv)
    for t in args.tiles:
        parse_tile(t)
    if not torch.cuda.is_available():
        raise SystemExit("step/layer_norm_gpu.py times CUDA kernels: no CUDA device here")
    info = bench_io.machine_info("cuda")
    tables = [(getattr(torch, d), gpu_times(args, getattr(torch, d))) for d in args.dtypes]
    print(f"wrote {write_table(args, info, tables, host_times(args))}")


if __name__ == "__main__":
    main()
