"""Speed and memory of one attention call (forward + backward) against sequence length.

Like Figure 4 of the clustered-attention paper: the number of tokens per call is
fixed (``B = tokens / N``), so a linear-cost attention has a flat per-token cost
and full attention's grows with N.

    python -m benchmarks.attention.sweep                   # CUDA if available, else CPU
    python -m benchmarks.attention.sweep --device cpu --max-n 8192 --quick

Measurement:
* time: ``attn(q, k, v)`` then ``out.backward(g)``; ``--warmup`` untimed calls, then
  the median of ``--repeats`` timed calls (``time.perf_counter`` on CPU, CUDA events
  on GPU). No padding (``lengths=None``) unless ``--masked``.
* peak memory: the extra memory one forward + backward needs beyond its inputs
  (saved activations, temporaries, outputs, input gradients). CUDA:
  ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus the
  memory allocated before the call. CPU: torch has no CPU peak counter, so one
  extra call runs under ``torch.profiler`` with ``profile_memory=True`` and the
  peak of the running sum of its allocation/free events is taken. This counts
  every tensor torch's CPU allocator hands out, but not BLAS/oneDNN scratch
  buffers or Python objects.
* a variant whose single call exceeds ``--max-call-s`` is not run at larger N (the
  table says so); an out-of-memory error is recorded, not fatal.

Writes ``benchmarks/results/attention_<machine>_<device>.{csv,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks import bench_io, timing

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from fastasr.attention import build_attention  # noqa: E402

DEFAULT_VARIANTS = ["full", "clustered-100", "i-clustered-100", "lsh-1", "lsh-4", "topk-32"]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class Row:
    variant: str
    n: int
    batch: int
    tokens: int
    heads: int
    dim: int
    dtype: str
    device: str
    time_ms: float | None = None
    time_per_token_us: float | None = None
    peak_mb: float | None = None
    mem_per_token_kb: float | None = None
    runs: int = 0
    status: str = "ok"


# --------------------------------------------------------------------------- measuring
def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_call(attn, batch, n, heads, dim, dtype, device, masked, seed=0):
    """Inputs for one (variant, N) cell and a closure running forward + backward."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, heads, n, dim)
    q = torch.randn(shape, generator=g).to(device=device, dtype=dtype).requires_grad_()
    k = (
        q
        if attn.requires_shared_qk
        else torch.randn(shape, generator=g).to(device, dtype).requires_grad_()
    )
    v = torch.randn(shape, generator=g).to(device=device, dtype=dtype).requires_grad_()
    grad = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
    lengths = torch.full((batch,), n, dtype=torch.int64, device=device) if masked else None
    leaves = [q, v] if k is q else [q, k, v]

    def call():
        for t in leaves:
            t.grad = None
        attn(q, k, v, lengths).backward(grad)

    return call


def time_call(call, device, repeats: int) -> list[float]:
    """Seconds of ``repeats`` calls of ``call()``, no warm-up (:func:`benchmarks.timing.measure`)."""
    return [ms / 1e3 for ms in timing.measure(call, warmup=0, repeats=repeats, device=device).samples]


def peak_memory_bytes(call, device) -> int:
    """Extra memory of one call beyond what was allocated before it (see module docstring)."""
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        call()
        _sync(device)
        return torch.cuda.max_memory_allocated(device) - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, acc_events=True) as prof:
        call()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    mem = sorted(
        (e["ts"], e["args"]["Bytes"])
        for e in events
        if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0
    )
    running = peak = 0
    for _, nbytes in mem:
        running += nbytes
        peak = max(peak, running)
    return peak


def run(args) -> tuple[list[Row], dict]:
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    ns = [n for n in (512, 1024, 2048, 4096, 8192, 16384) if args.min_n <= n <= args.max_n]
    if args.quick:
        ns = ns[::2] if len(ns) > 2 else ns
    rows: list[Row] = []
    too_slow: dict[str, str] = {}
    started = timing.Clock()
    load_start = bench_io.load_average()
    for n in ns:
        batch = max(1, args.tokens // n)
        for spec in args.variants:
            row = Row(spec, n, batch, batch * n, args.heads, args.dim, args.dtype, device.type)
            rows.append(row)
            if spec in too_slow:
                row.status = too_slow[spec]
                print(f"{spec:>16} N={n:>6}: {row.status}", flush=True)
                continue
            attn = build_attention(
                spec, **({"seed": 0} if "clustered" in spec or "lsh" in spec else {})
            )
            try:
                call = make_call(attn, batch, n, args.heads, args.dim, dtype, device, args.masked)
                first = time_call(call, device, 1)[0]  # warm-up (and a guard against huge cells)
                for _ in range(args.warmup - 1):
                    call()
                if first > args.max_call_s:
                    times = [first]
                    too_slow[spec] = (
                        f"skipped: N={n} took {first:.3g} s > --max-call-s {args.max_call_s:g}"
                    )
                else:
                    times = time_call(call, device, args.repeats)
                row.time_ms = 1e3 * statistics.median(times)
                row.runs = len(times)
                row.time_per_token_us = 1e6 * statistics.median(times) / row.tokens
                peak = peak_memory_bytes(call, device)
                row.peak_mb = peak / 2**20
                row.mem_per_token_kb = peak / 2**10 / row.tokens
                if spec in too_slow:
                    row.status = "ok (1 run: slow)"
            except Exception as exc:  # noqa: BLE001 - record OOM and go on
                if not bench_io.is_oom(exc):
                    raise
                row.status = "out of memory"
                too_slow[spec] = f"skipped: out of memory at N={n}"
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            print(
                f"{spec:>16} N={n:>6} B={batch:>3}: "
                + (
                    f"{row.time_ms:9.1f} ms  {row.peak_mb:9.1f} MB"
                    if row.time_ms is not None
                    else row.status
                ),
                flush=True,
            )
    meta = {
        "elapsed_s": started.seconds(),
        "load_start": load_start,
        "load_end": bench_io.load_average(),
    }
    return rows, meta


# --------------------------------------------------------------------------- reporting
def crossovers(rows: list[Row]) -> dict[str, str]:
    """Smallest N from which a variant is faster than full for every larger measured N."""
    full = {r.n: r.time_ms for r in rows if r.variant == "full" and r.time_ms is not None}
    out = {}
    for spec in dict.fromkeys(r.variant for r in rows):
        if spec == "full":
            continue
        mine = {r.n: r.time_ms for r in rows if r.variant == spec and r.time_ms is not None}
        common = sorted(set(mine) & set(full))
        if not common:
            out[spec] = "no common measurements with full"
            continue
        faster = [n for n in common if mine[n] < full[n]]
        first = None
        for n in common:
            if all(mine[m] < full[m] for m in common if m >= n):
                first = n
                break
        beyond = [
            r.n for r in rows if r.variant == "full" and r.time_ms is None and r.n > common[-1]
        ]
        if first is None:
            out[spec] = (
                f"slower than full at every measured N <= {common[-1]}"
                if not faster
                else (f"faster only at N in {faster}")
            )
        else:
            ratio = full[common[-1]] / mine[common[-1]]
            out[spec] = f"faster from N = {first} ({ratio:.1f}x at N = {common[-1]})"
        if beyond:
            out[spec] += f"; full not measured at N = {beyond}"
    return out


def memory_growth(rows: list[Row]) -> dict[str, str]:
    """Log-log slope of per-call peak memory against N (tokens per call fixed)."""
    out = {}
    for spec in dict.fromkeys(r.variant for r in rows):
        pts = [(r.n, r.peak_mb) for r in rows if r.variant == spec and r.peak_mb]
        if len(pts) < 2:
            out[spec] = "n/a"
            continue
        (n0, m0), (n1, m1) = pts[0], pts[-1]
        slope = math.log(m1 / m0) / math.log(n1 / n0)
        out[spec] = f"{m0:.0f} MB at N={n0} -> {m1:.0f} MB at N={n1} (~N^{slope:.2f})"
    return out


def write_csv(rows: list[Row], path: Path) -> None:
    bench_io.write_csv(rows, path, digits=5)


def write_markdown(rows, info, args, meta, path: Path) -> None:
    variants = list(dict.fromkeys(r.variant for r in rows))
    ns = sorted({r.n for r in rows})
    cell = {(r.variant, r.n): r for r in rows}
    device = (
        info.get("gpu")
        or f"{info['cpu']} ({info['cores']} cores, {torch.get_num_threads()} torch threads)"
    )
    lines = [
        f"# Attention forward+backward: {device}",
        "",
        f"- machine: {device}; torch {info['torch']}, Python {info['python']}",
        f"- command: `{' '.join(['python', '-m', 'benchmarks.attention.sweep', *sys.argv[1:]])}`",
        f"- one call = forward + backward of one attention, H={args.heads}, E={args.dim}, "
        f"{args.dtype}, {args.tokens} tokens per call (B = tokens / N), "
        f"{'padding mask on' if args.masked else 'no padding mask'}; "
        f"N from {ns[0]} to {ns[-1]}" + (" (capped by --max-n)" if args.max_n < 16384 else ""),
        f"- time: median of {args.repeats} calls after {args.warmup} warm-up "
        + ("(CUDA events)" if args.device.startswith("cuda") else "(time.perf_counter)"),
        "- memory: "
        + (
            "torch.cuda.max_memory_allocated during one call minus memory allocated before it"
            if args.device.startswith("cuda")
            else "peak of torch's CPU allocations during one call (torch.profiler memory events), "
            "beyond the inputs; BLAS/oneDNN scratch not included"
        ),
        f"- hashed variants use seed 0; total benchmark time {meta['elapsed_s']:.0f} s; "
        f"1-minute load average {meta['load_start']} at start, {meta['load_end']} at end "
        f"({info['cores']} cores: a load above that means other jobs shared the CPU)",
        "- B = max(1, tokens // N), so N > tokens runs one sequence of N tokens",
        "",
        "Time per call in ms / peak memory in MB:",
        "",
        "| N | B | " + " | ".join(variants) + " |",
        "|---:|---:|" + "---:|" * len(variants),
    ]
    for n in ns:
        cells = []
        for spec in variants:
            r = cell.get((spec, n))
            if r is None or r.time_ms is None:
                cells.append(r.status if r else "")
            else:
                cells.append(
                    f"{r.time_ms:.1f} / {r.peak_mb:.0f}"
                    + ("*" if r.status.startswith("ok (1") else "")
                )
        batch = next(r.batch for r in rows if r.n == n)
        lines.append(f"| {n} | {batch} | " + " | ".join(cells) + " |")
    if any(r.status.startswith("ok (1") for r in rows):
        lines += ["", "\\* a single timed call (the cell exceeded --max-call-s)."]
    lines += ["", "Where each variant overtakes full attention:", ""]
    lines += [f"- {spec}: {text}" for spec, text in crossovers(rows).items()]
    lines += ["", "Peak memory growth with N (tokens per call fixed):", ""]
    lines += [f"- {spec}: {text}" for spec, text in memory_growth(rows).items()]
    if "full" in variants:
        lines += [
            "",
            "full calls torch's fused scaled_dot_product_attention, which never stores the N x N "
            "matrix (it keeps a log-sum-exp per query), so its memory is linear in N like the "
            "others; the fast variants save time, not memory, against it.",
        ]
    path.write_text("\n".join(lines) + "\n")


def write_plot(rows, info, args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for spec in dict.fromkeys(r.variant for r in rows):
        pts = [r for r in rows if r.variant == spec and r.time_ms is not None]
        if not pts:
            continue
        ns = [r.n for r in pts]
        ax_t.plot(ns, [r.time_per_token_us for r in pts], marker="o", label=spec)
        ax_m.plot(ns, [r.mem_per_token_kb for r in pts], marker="o", label=spec)
    for ax, label in ((ax_t, "time per token (µs)"), (ax_m, "peak memory per token (KiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=8)
    device = info.get("gpu") or f"{info['cpu']}, {info['cores']} cores"
    fig.suptitle(
        f"Attention forward+backward, {args.tokens} tokens/call, H={args.heads}, E={args.dim}, "
        f"{args.dtype} — {device}, torch {info['torch']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES))
    p.add_argument("--tokens", type=int, default=16384, help="tokens per call (B = tokens / N)")
    p.add_argument("--min-n", type=int, default=512)
    p.add_argument("--max-n", type=int, default=16384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS)
    p.add_argument("--warmup", type=int, default=None, help="untimed calls (default 1 CPU, 3 GPU)")
    p.add_argument("--repeats", type=int, default=None, help="timed calls (default 3 CPU, 10 GPU)")
    p.add_argument(
        "--max-call-s", type=float, default=60.0, help="skip larger N once a call takes longer"
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    p.add_argument(
        "--masked", action="store_true", help="pass lengths (all full) so the padding path runs"
    )
    p.add_argument("--quick", action="store_true", help="every other N, 1 warm-up, 2 repeats")
    p.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args(argv)
    gpu = args.device.startswith("cuda")
    if args.quick:
        args.warmup, args.repeats = args.warmup or 1, args.repeats or 2
    args.warmup = max(1, args.warmup if args.warmup is not None else (3 if gpu else 1))
    args.repeats = max(1, args.repeats if args.repeats is not None else (10 if gpu else 3))
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    info = bench_io.machine_info(device)
    print(json.dumps(info), flush=True)
    rows, meta = run(args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / f"attention_{info['slug']}_{device.type}"
    write_csv(rows, stem.with_suffix(".csv"))
    write_markdown(rows, info, args, meta, stem.with_suffix(".md"))
    write_plot(rows, info, args, stem.with_suffix(".png"))
    print(f"wrote {stem}.csv/.md/.png ({meta['elapsed_s']:.0f} s)")


if __name__ == "__main__":
    main()
