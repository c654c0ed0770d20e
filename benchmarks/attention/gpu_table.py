"""GPU benchmark: the Triton clustering kernels checked, then every attention timed.

    python -m benchmarks.attention.gpu_table                       # CUDA: check, then the sweep (< 8 min, H200)
    python -m benchmarks.attention.gpu_table --quick --device cpu  # plumbing smoke test (Triton interpreter)

1. **Correctness first.** At benchmark sizes (N = 4096 and the largest N, every head
   configuration) the Triton ops are compared with the PyTorch reference on the same
   device: hash codes (equal except where a projection is within rounding of 0:
   at most 1e-5 of the codes may differ), Hamming K-means on the same codes (equal
   assignments and counts), the clustered products and their gradients (relative L2
   error < 1e-4 values / 1e-3 gradients in fp32, < 2e-2 in bf16). It also checks that
   ``fastasr.kernels.clustering.ops`` routes these tensors to Triton. Any failure stops the script
   with exit status 1 before anything is timed.
2. **Timing.** One call = ``attn(q, k, v)`` and ``out.backward(g)`` of an inner attention
   from ``fastasr.attention.build_attention`` (hashed variants built with ``seed=0``):
   ``full`` (SDPA with the flash backend forced in bf16; flash has no fp32 kernel, so
   fp32 forces the memory-efficient backend, named in the ``sdpa_backend`` column);
   ``full padded (fastasr path)``: the same on a padded batch (last sequence at 3/4 N),
   through the exact path ``fastasr.attention.full`` takes for it, with SDPA choosing its
   backends (bf16: the key mask below ``dense_from``, dense below ``varlen_from``, varlen
   flash from there; fp32: the key mask, or packing from ``pack_from``): the padded baseline every
   speed-up is measured against (``benchmarks/attention/full_paths.py`` times each path);
   ``full padded (key mask)``: the padded batch through SDPA with a key-padding mask
   (no flash: SDPA picks what takes a mask);
   ``clustered-100``, ``i-clustered-100`` (k = 32), ``lsh-4`` (shared Q/K) and
   ``topk-32``, for N = 1k … 64k with a fixed number of tokens per call (B = tokens/N),
   H=6/E=32 and H=8/E=64, fp32 and bf16, no padding. Timing: CUDA events, warm-up
   calls first (Triton compiles there), median of repeats, inputs rotated among three
   sets so repeated calls do not just re-read L2. Repeats are capped (``--target-s`` per cell, 3 to
   ``--max-repeats``); a variant whose call is predicted to exceed ``--max-call-s`` at
   the next N, or that ran out of memory, is not run at larger N; the whole run stops
   timing at ``--budget-s`` (the remaining cells say so). A second phase, if time is
   left, times clustered/i-clustered with ``FASTASR_KERNELS=reference`` to show what
   the kernels buy.
3. **Memory**: ``torch.cuda.max_memory_allocated`` during one call minus the memory
   allocated before it (inputs excluded; saved activations, temporaries, outputs and
   input gradients included), reported in MiB and in bytes per element, an element
   being one (batch, head, position) triple.

Writes ``benchmarks/results/gpu_<gpu-name>.csv``, ``.md`` and ``.png`` (``--out-dir``
to change), headed by the GPU name and the torch/triton versions. bf16 inputs reach the
clustered variants' Triton dots as bf16 (fp32 accumulation; softmaxes in fp32,
``fastasr.attention.base.kernel_dtype``); LSH and top-k compute in fp32.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import bench_io, timing
from benchmarks.attention.gpu_checks import CheckFailed, MaskedSDPA, check_kernels

ROOT = Path(__file__).resolve().parents[2]

FULL_NS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
FULL_HEADS = [(6, 32), (8, 64)]
QUICK_NS = [32, 64]
QUICK_HEADS = [(2, 16)]
DTYPE_NAMES = ["float32", "bfloat16"]


@dataclass
class Variant:
    label: str  # column name in the outputs
    spec: str  # build_attention spec, or "masked-sdpa" (the key-mask baseline below)
    overrides: dict = field(default_factory=dict)
    kernels: str = "auto"  # FASTASR_KERNELS while it runs ("auto": Triton, the point of the bench)
    quadratic: bool = False  # cost per call grows ~N at fixed tokens (vs ~flat)
    padded: bool = False  # the last sequence of the batch padded to 3/4 N (lengths passed)


def main_variants(quick: bool) -> list[Variant]:
    if quick:  # tiny clusters/k so the interpreter finishes in seconds
        return [
            Variant("full", "full", quadratic=True),
            Variant("full padded (fastasr path)", "full", quadratic=True, padded=True),
            Variant("full padded (key mask)", "masked-sdpa", quadratic=True, padded=True),
            Variant("clustered-4", "clustered-4", {"seed": 0, "iterations": 3}),
            Variant("i-clustered-4", "i-clustered-4", {"seed": 0, "iterations": 3, "topk": 8}),
            Variant("lsh-4", "lsh-4", {"seed": 0, "chunk": 8, "buckets": 4}),
            Variant("topk-8", "topk-8", quadratic=True),
        ]
    return [
        Variant("full", "full", quadratic=True),
        Variant("full padded (fastasr path)", "full", quadratic=True, padded=True),
        Variant("full padded (key mask)", "masked-sdpa", quadratic=True, padded=True),
        Variant("clustered-100", "clustered-100", {"seed": 0}),
        Variant("i-clustered-100", "i-clustered-100", {"seed": 0, "topk": 32}),
        Variant("lsh-4", "lsh-4", {"seed": 0}),
        Variant("topk-32", "topk-32", quadratic=True),
    ]


def reference_variants(quick: bool) -> list[Variant]:
    out = []
    for v in main_variants(quick):
        if "clustered" in v.spec:
            out.append(Variant(v.label + " (reference ops)", v.spec, v.overrides, "reference"))
    return out


@dataclass
class Row:
    gpu: str
    torch: str
    triton: str
    dtype: str
    heads: int
    dim: int
    n: int
    batch: int
    tokens: int
    variant: str
    kernels: str
    sdpa_backend: str = ""
    status: str = "ok"
    median_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    repeats: int = 0
    peak_mib: float | None = None
    bytes_per_element: float | None = None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--quick", action="store_true", help="tiny sizes (use with --device cpu)")
    p.add_argument("--tokens", type=int, default=None, help="tokens per call (default 65536; quick 128)")
    p.add_argument("--ns", type=int, nargs="+", default=None, help="sequence lengths")
    p.add_argument("--dtypes", nargs="+", default=DTYPE_NAMES, choices=DTYPE_NAMES + ["float16"])
    p.add_argument("--budget-s", type=float, default=420.0, help="stop timing after this many seconds")
    p.add_argument("--target-s", type=float, default=0.4, help="timed seconds aimed at per cell")
    p.add_argument("--max-repeats", type=int, default=15)
    p.add_argument("--max-call-s", type=float, default=1.5, help="skip larger N once a call would exceed this")
    p.add_argument("--check-only", action="store_true", help="run the correctness check and stop")
    p.add_argument("--skip-check", action="store_true", help="time without checking first (not advised)")
    p.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args(argv)
    if args.quick:
        args.tokens = args.tokens or 128
        args.ns = args.ns or QUICK_NS
        args.heads = QUICK_HEADS
        args.max_repeats = 1
        args.max_call_s = float("inf")
    else:
        args.tokens = args.tokens or 65536
        args.ns = args.ns or FULL_NS
        args.heads = FULL_HEADS
    return args


def _setup_environment(args) -> None:
    """Environment that must be in place before torch/triton/fastasr are imported."""
    if args.device == "cpu":
        # Kernels defined under the interpreter run on CPU tensors; ops must route CPU
        # tensors to Triton (by default it sends them to the reference).
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ["FASTASR_KERNELS"] = "triton"
    sys.path.insert(0, str(ROOT / "src"))


# ------------------------------------------------------------------------ timing
class _KernelsEnv:
    """Temporarily set FASTASR_KERNELS (read by fastasr.kernels.clustering.ops at every call)."""

    def __init__(self, value: str):
        self.value, self.saved = value, None

    def __enter__(self):
        self.saved = os.environ.get("FASTASR_KERNELS")
        os.environ["FASTASR_KERNELS"] = self.value

    def __exit__(self, *exc):
        if self.saved is None:
            os.environ.pop("FASTASR_KERNELS", None)
        else:
            os.environ["FASTASR_KERNELS"] = self.saved


def _sdpa_context(variant: Variant, dtype, device):
    """Force the flash backend for unpadded full attention (efficient for fp32: flash has none);
    the padded batch runs the path fastasr takes, whose key mask rules flash out below
    ``dense_from``."""
    import contextlib

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if variant.spec == "masked-sdpa":  # a mask rules flash out: SDPA's own choice
        return contextlib.nullcontext(), "default (the mask rules flash out)"
    if variant.spec != "full" or device.type != "cuda":
        return contextlib.nullcontext(), ("default" if variant.spec == "full" else "")
    if variant.padded:  # fastasr's padded path (key mask, dense or varlen by N) picks its kernels
        return contextlib.nullcontext(), "fastasr's padded path"
    if dtype in (torch.float16, torch.bfloat16):
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION]), "flash"
    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]), "efficient (no fp32 flash)"


def time_cell(attn, variant, B, H, N, E, dtype, device, args, remaining_s):
    """Median ms, min, max, repeats and peak extra bytes of forward+backward calls."""
    import torch

    g = torch.Generator(device=device).manual_seed(N + H)

    def randn():
        return torch.randn(B, H, N, E, generator=g, device=device).to(dtype)

    sets = []
    for _ in range(3):  # fresh random inputs, never zeros; rotated so L2 does not serve repeats
        q = randn().requires_grad_()
        k = q if attn.requires_shared_qk else randn().requires_grad_()
        sets.append((q, k, randn().requires_grad_()))
    grad = randn()
    lengths = None
    if variant.padded:
        lengths = torch.full((B,), N, dtype=torch.int64, device=device)
        lengths[-1] = N - N // 4

    def call(i):
        q, k, v = sets[i % len(sets)]
        for t in (q, k, v):
            t.grad = None
        attn(q, k, v, lengths).backward(grad)

    cuda = device.type == "cuda"
    turn = itertools.count()
    if args.quick:  # plumbing only: one call per cell
        t = timing.measure(lambda: call(0), warmup=0, repeats=1, device=device)
    else:  # a warm-up (Triton compilation, the allocator), then at least 3 calls, more to the target time
        t = timing.measure(lambda: call(next(turn)), warmup=1, repeats=3, device=device,
                           target_s=min(args.target_s, max(0.0, remaining_s)), max_repeats=args.max_repeats)

    peak = None
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        call(0)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
    return t.median_ms, t.min_ms, t.max_ms, t.count, peak


def run_sweep(args, device, versions, log, started):
    import torch

    from fastasr.attention import build_attention

    rows: list[Row] = []
    stopped: dict[tuple, str] = {}
    last_ms: dict[tuple, float] = {}
    phases = [main_variants(args.quick), reference_variants(args.quick)]
    for phase, variants in enumerate(phases):
        for N in args.ns:
            B = max(1, args.tokens // N)
            for (H, E) in args.heads:
                for dname in args.dtypes:
                    dtype = getattr(torch, dname)
                    for variant in variants:
                        kernels = "triton" if variant.kernels == "auto" else variant.kernels
                        uses_ops = "clustered" in variant.spec
                        row = Row(*versions, dname, H, E, N, B, B * N, variant.label,
                                  kernels if uses_ops else "n/a")
                        key = (variant.label, H, E, dname)
                        remaining = args.budget_s - started.seconds()
                        if key in stopped:
                            row.status = stopped[key]
                        elif remaining <= 0:
                            row.status = "skipped: time budget"
                        elif key in last_ms and last_ms[key] * (2.0 if variant.quadratic else 1.3) > 1e3 * args.max_call_s:
                            row.status = f"skipped: predicted > {args.max_call_s:g} s per call"
                            stopped[key] = row.status
                        if row.status != "ok":
                            if phase == 0 or row.status != "skipped: time budget":
                                rows.append(row)
                            continue
                        ctx, row.sdpa_backend = _sdpa_context(variant, dtype, device)
                        try:
                            attn = (MaskedSDPA() if variant.spec == "masked-sdpa"
                                    else build_attention(variant.spec, **variant.overrides))
                            with ctx, _KernelsEnv(kernels):
                                med, lo, hi, reps, peak = time_cell(attn, variant, B, H, N, E, dtype, device,
                                                                    args, remaining)
                            row.median_ms, row.min_ms, row.max_ms, row.repeats = med, lo, hi, reps
                            if peak is not None:
                                row.peak_mib = peak / 2**20
                                row.bytes_per_element = peak / (B * H * N)
                            last_ms[key] = med
                        except Exception as exc:  # noqa: BLE001 - an OOM is a result, anything else is not
                            if not bench_io.is_oom(exc):
                                raise
                            row.status = "out of memory"
                            stopped[key] = f"skipped: out of memory at N={N}"
                        finally:
                            if device.type == "cuda":
                                torch.cuda.empty_cache()
                        rows.append(row)
                        log(_row_line(row))
    return rows


def _row_line(r: Row) -> str:
    if r.median_ms is None:
        return f"{r.variant:>34} {r.dtype:>8} H={r.heads} E={r.dim} N={r.n:>6}: {r.status}"
    mem = f"{r.peak_mib:8.1f} MiB {r.bytes_per_element:8.0f} B/el" if r.peak_mib is not None else ""
    return (f"{r.variant:>34} {r.dtype:>8} H={r.heads} E={r.dim} N={r.n:>6} B={r.batch:>3}: "
            f"{r.median_ms:9.2f} ms (x{r.repeats}) {mem}")


# ------------------------------------------------------------------------ outputs
def write_csv(rows: list[Row], path: Path) -> None:
    bench_io.write_csv(rows, path, digits=4)


def write_markdown(rows, checks, args, versions, elapsed, path: Path) -> None:
    gpu, torch_v, triton_v = versions
    lines = [
        f"# Attention forward+backward on {gpu}",
        "",
        f"- torch {torch_v}, triton {triton_v}, Python {platform.python_version()}; "
        f"command `python -m benchmarks.attention.gpu_table {' '.join(sys.argv[1:])}`",
        f"- one call = forward + backward, {args.tokens} tokens per call (B = tokens / N), no padding; "
        "median of CUDA-event timed calls after warm-up, inputs rotated over 3 sets"
        if args.device == "cuda" else
        f"- one call = forward + backward, {args.tokens} tokens per call; CPU smoke run under the "
        "Triton interpreter: times are not meaningful",
        "- memory: peak allocated during one call minus allocated before it; per element = per "
        "(batch, head, position)",
        f"- total {elapsed:.0f} s. Correctness checks (Triton vs reference) passed:",
        "",
    ]
    lines += [f"  - {c}" for c in checks] or ["  - (skipped)"]
    variants = list(dict.fromkeys(r.variant for r in rows))
    for (H, E) in args.heads:
        for dname in args.dtypes:
            sub = [r for r in rows if r.heads == H and r.dim == E and r.dtype == dname]
            if not sub:
                continue
            cols = [v for v in variants if any(r.variant == v for r in sub)]
            lines += ["", f"## H={H}, E={E}, {dname}: ms per call / bytes per element", "",
                      "| N | B | " + " | ".join(cols) + " |", "|---:|---:|" + "---:|" * len(cols)]
            for N in args.ns:
                cells = []
                for v in cols:
                    r = next((r for r in sub if r.n == N and r.variant == v), None)
                    if r is None:
                        cells.append("")
                    elif r.median_ms is None:
                        cells.append(r.status)
                    elif r.bytes_per_element is None:
                        cells.append(f"{r.median_ms:.2f}")
                    else:
                        cells.append(f"{r.median_ms:.2f} / {r.bytes_per_element:.0f}")
                lines.append(f"| {N} | {max(1, args.tokens // N)} | " + " | ".join(cells) + " |")
    backends = sorted({r.sdpa_backend for r in rows if r.sdpa_backend})
    if backends:
        lines += ["", f"full attention SDPA backends: {', '.join(backends)}"]
    path.write_text("\n".join(lines) + "\n")


def write_plot(rows, args, versions, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(H, E, d) for (H, E) in args.heads for d in args.dtypes]
    fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 7.5), squeeze=False)
    for j, (H, E, dname) in enumerate(panels):
        ax_t, ax_m = axes[0][j], axes[1][j]
        for v in dict.fromkeys(r.variant for r in rows):
            pts = [r for r in rows if (r.heads, r.dim, r.dtype, r.variant) == (H, E, dname, v)
                   and r.median_ms is not None]
            if not pts:
                continue
            style = "--" if "reference" in v else "-"
            ax_t.plot([r.n for r in pts], [r.median_ms for r in pts], style, marker="o", label=v)
            mem = [r for r in pts if r.bytes_per_element is not None]
            if mem:
                ax_m.plot([r.n for r in mem], [r.bytes_per_element for r in mem], style, marker="o", label=v)
        if not ax_m.lines:
            ax_m.text(0.5, 0.5, "memory not measured (CPU)", ha="center", va="center",
                      transform=ax_m.transAxes, fontsize=9)
        ax_t.set_title(f"H={H} E={E} {dname}", fontsize=9)
        ax_t.set_ylabel("ms per call (fwd+bwd)")
        ax_m.set_ylabel("peak bytes per element")
        for ax in (ax_t, ax_m):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel(f"N ({args.tokens} tokens per call)")
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    gpu, torch_v, triton_v = versions
    fig.suptitle(f"{gpu} — torch {torch_v}, triton {triton_v}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    _setup_environment(args)
    import torch
    import triton

    started = timing.Clock()

    def log(msg):
        print(f"[{started.seconds():6.1f}s] {msg}", flush=True)

    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("gpu_bench: --device cuda but torch.cuda.is_available() is False "
                  "(use --quick --device cpu for the CPU smoke run)", file=sys.stderr)
            return 2
        device = torch.device("cuda")
        gpu = torch.cuda.get_device_name(device)
    else:
        device = torch.device("cpu")
        gpu = "cpu-interpreter"
    versions = (gpu, torch.__version__, triton.__version__)
    log(f"{gpu}; torch {versions[1]}; triton {versions[2]}; tokens/call {args.tokens}; N {args.ns}")

    checks: list[str] = []
    if not args.skip_check:
        try:
            checks = check_kernels(args, device, log)
        except CheckFailed as exc:
            print(f"gpu_bench: CORRECTNESS CHECK FAILED, nothing timed: {exc}", file=sys.stderr)
            return 1
    if args.check_only:
        return 0
    rows = run_sweep(args, device, versions, log, started)
    elapsed = started.seconds()

    args.out_dir.mkdir(parents=True, exist_ok=True)
    slug = bench_io.machine_slug(gpu)
    stem = args.out_dir / f"gpu_{slug}"
    write_csv(rows, stem.with_suffix(".csv"))
    write_markdown(rows, checks, args, versions, elapsed, stem.with_suffix(".md"))
    write_plot(rows, args, versions, stem.with_suffix(".png"))
    log(f"wrote {stem}.csv/.md/.png")
    timed = [r for r in rows if r.median_ms is not None]
    log(f"{len(timed)} of {len(rows)} cells timed in {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
