"""Full attention on a CPU in half precision: torch's flash kernel in bfloat16 against the same
call in float32 (inputs cast in, the output cast back), and the one fastasr takes.

    python benchmarks/cpu_half_attention.py                       # N = 80 … 2,048, 4,000 tokens a call
    python benchmarks/cpu_half_attention.py --ns 325 1300 --rounds 7

Under ``bf16-mixed`` the projections hand full attention bfloat16 queries, keys and values. Each
cell is one forward + backward of SDPA with a key-padding mask (the CPU's path,
:func:`fastasr.attention.full.masked_attention`) on ``--tokens`` tokens (B = tokens / N, the
last sequence N / 2), 6 heads × 32: ``bfloat16`` as given, ``float32`` cast in and out. Rounds
are interleaved in alternating order; the table has the medians, their ratio, and whether
:func:`fastasr.attention.full.attends_in_float32` casts at that N. Writes
``benchmarks/results/cpu_half_attention_<machine>.md``.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

import bench_io  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from fastasr.attention.full import attends_in_float32, masked_attention  # noqa: E402

NS = [80, 160, 325, 650, 1024, 1300, 2048]
VARIANTS = ("bfloat16", "float32")


def _inputs(n: int, tokens: int, heads: int, dim: int):
    g = torch.Generator().manual_seed(n)
    b = max(1, tokens // n)
    q, k, v = (torch.randn(b, heads, n, dim, generator=g).bfloat16().requires_grad_() for _ in range(3))
    lengths = torch.full((b,), n)
    lengths[-1] = n // 2
    grad = torch.randn(b, heads, n, dim, generator=g).bfloat16()
    return q, k, v, lengths, grad


def _step(variant: str, q, k, v, lengths, grad) -> float:
    for t in (q, k, v):
        t.grad = None
    t0 = time.perf_counter()
    if variant == "float32":
        out = masked_attention(q.float(), k.float(), v.float(), lengths).bfloat16()
    else:
        out = masked_attention(q, k, v, lengths)
    out.backward(grad)
    return time.perf_counter() - t0


def measure(args) -> list[dict]:
    rows = []
    for n in args.ns:
        inputs = _inputs(n, args.tokens, args.heads, args.dim)
        for variant in VARIANTS:  # warm-up
            _step(variant, *inputs)
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for r in range(args.rounds):
            for variant in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
                times[variant].append(_step(variant, *inputs))
        med = {v: statistics.median(t) * 1e3 for v, t in times.items()}
        casts = attends_in_float32(inputs[0])
        rows.append({"n": n, "batch": inputs[0].shape[0], **med, "ratio": med["bfloat16"] / med["float32"],
                     "fastasr": "float32" if casts else "bfloat16"})
        print(f"N={n} B={inputs[0].shape[0]}: bf16 {med['bfloat16']:.1f} ms, fp32 {med['float32']:.1f} ms, "
              f"bf16/fp32 {rows[-1]['ratio']:.2f}; fastasr takes {rows[-1]['fastasr']}", flush=True)
    return rows


def write_table(rows: list[dict], args, info: dict, load_before: str, load_after: str) -> Path:
    path = bench_io.result_stem(args.out_dir, "cpu_half_attention", info).with_suffix(".md")
    lines = [
        "# Full attention on a CPU: the flash kernel in bfloat16 against float32",
        "",
        bench_io.command_line("cpu_half_attention.py"),
        "",
        f"{datetime.date.today()}, {info['cpu']}, {info['cores']} cores, {args.threads} torch threads, "
        f"torch {info['torch']}, code {bench_io.git_commit(ROOT)}; load average {load_before} before, "
        f"{load_after} after. SDPA with a key-padding mask, forward + backward, {args.tokens} tokens a call "
        f"(B = {args.tokens} // N, the last sequence N / 2), {args.heads} heads × {args.dim}; float32 = the "
        f"bfloat16 inputs cast in and the output cast back. Median of {args.rounds} interleaved rounds.",
        "",
        "| N (batch) | bfloat16 | float32 | bf16 / fp32 | fastasr takes |",
        "|---|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(f"| {r['n']} ({r['batch']}) | {r['bfloat16']:.1f} ms | {r['float32']:.1f} ms | "
                     f"{r['ratio']:.2f} | {r['fastasr']} |")
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ns", type=int, nargs="+", default=NS, help="positions N per sequence")
    p.add_argument("--tokens", type=int, default=4000, help="tokens a call (B = tokens // N)")
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (the median counts)")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    bench_io.measure_and_write(measure, write_table, args)


if __name__ == "__main__":
    main()
