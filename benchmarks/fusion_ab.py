"""A/B: how to fuse what dominates on the CPU — torch.compile, a C++ operator, or Triton.

    python benchmarks/fusion_ab.py          # ~10 min on 2 cores (most of it inductor compiling)

The stages that dominated the PyTorch reference (see benchmarks/profile_attention.py)
are run in one process, back to back, each implementation once per round for
``--rounds`` rounds in rotating order, so the load of the machine hits all alike:

* K-means (10 Lloyd iterations, C = 100): the reference in eager PyTorch (Hamming
  distances as one matmul of +-1 bits); ``torch.compile`` of that reference; a
  popcount formulation written for inductor (XOR, SWAR popcount and argmin fuse into
  one loop over the centroids, nothing N x C is stored) under ``torch.compile``; the
  C++ operator (``fastasr_cpu.hamming_kmeans``).
* Centroid attention, forward + backward (scores, softmax, top-32, values): eager
  reference, ``torch.compile`` of it, the C++ operator.
* Improved-clustered sparse part, forward + backward: eager reference,
  ``torch.compile`` of it, the C++ operator.
* Triton's CPU backend: the triton 3.6 wheel that ships with torch has none (its CPU
  backend, triton-cpu, is a separate fork built from source with its own LLVM); the
  only way Triton runs here is its interpreter, timed on K-means at a small size
  against the C++ operator at the same size.

Sizes: 16384 tokens (B = 16, N = 1024), H = 6, E = 32, one thread. Times: median
thread CPU time (``time.thread_time``, robust to other jobs taking the cores) and wall
time. Writes ``benchmarks/results/fusion_ab_<machine>.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def popcount_kmeans(codes, lengths, clusters: int, iterations: int, bits: int = 63):
    """The reference's K-means rules with popcount distances, in ops inductor fuses."""
    import torch

    from fastasr.kernels import reference

    B, H, N = codes.shape
    C = clusters
    x = codes & ((1 << bits) - 1)
    valid = torch.arange(N)[None, :] < lengths[:, None]
    cent, c_eff = reference.initial_centroids(x, lengths, C)
    unused = (torch.arange(C)[None, :] >= c_eff[:, None])[:, None, None, :]  # (B,1,1,C)
    shifts = torch.arange(bits)

    def assign(cent):
        d = reference.popcount(x[..., None] ^ cent[..., None, :])  # (B,H,N,C), fused away
        return d.masked_fill(unused, 127).argmin(-1)  # first minimum: lowest index

    for _ in range(iterations):
        slot = torch.where(valid[:, None, :], assign(cent), C)
        bits01 = (x[..., None] >> shifts) & 1  # (B,H,N,bits)
        ones = torch.zeros(B, H, C + 1, bits, dtype=torch.int64).scatter_add_(
            2, slot[..., None].expand(B, H, N, bits), bits01)[:, :, :C]
        counts = torch.zeros(B, H, C + 1, dtype=torch.int64).scatter_add_(
            2, slot, torch.ones_like(slot))[..., :C]
        majority = ((2 * ones > counts[..., None]).to(torch.int64) << shifts).sum(-1)
        cent = torch.where(counts > 0, majority, cent)
    a = torch.where(valid[:, None, :], assign(cent), -1)
    counts = torch.zeros(B, H, C + 1, dtype=torch.int64).scatter_add_(
        2, torch.where(a < 0, C, a), torch.ones_like(a))[..., :C]
    return a, counts


def ab(cands: dict, rounds: int) -> dict:
    """{label: (median thread s, median wall s)}, interleaved, after one warm-up each."""
    for fn in cands.values():
        fn()
    cpu = {k: [] for k in cands}
    wall = {k: [] for k in cands}
    labels = list(cands)
    for r in range(rounds):
        for label in labels[r % len(labels):] + labels[: r % len(labels)]:
            t0, w0 = time.thread_time(), time.perf_counter()
            cands[label]()
            cpu[label].append(time.thread_time() - t0)
            wall[label].append(time.perf_counter() - w0)
    return {k: (statistics.median(cpu[k]), statistics.median(wall[k])) for k in cands}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    sys.path.insert(0, str(ROOT / "src"))
    import bench_io  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
    import torch

    from fastasr.kernels import native, reference

    torch.set_num_threads(1)
    assert native.available(), native.unavailable_reason()
    B, H, N, E, C, K = max(1, args.tokens // args.n), 6, args.n, 32, 100, 32
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, E, generator=g) for _ in range(3))
    lengths = torch.full((B,), N, dtype=torch.int64)
    lengths[-1] = N - N // 4
    codes = reference.hash_codes(q, torch.randn(E + 1, 63, generator=g), lengths)
    info, load = bench_io.machine_info("cpu"), bench_io.load_average()
    sections = []

    def compiled(fn):
        t0 = time.perf_counter()
        cfn = torch.compile(fn, dynamic=False)
        return cfn, t0

    def run(title, cands, compile_fns, check):
        compile_s = {}
        for label, make in compile_fns.items():
            fn, t0 = make()
            fn()  # compiles
            compile_s[label] = time.perf_counter() - t0
            cands[label] = fn
        check(cands)
        res = ab(cands, args.rounds)
        base = res[next(iter(res))][0]
        rows = [f"| {label} | {1e3 * c:.1f} | {1e3 * w:.1f} | {base / c:.1f}x | "
                f"{compile_s.get(label, 0):.0f} |" for label, (c, w) in res.items()]
        sections.append("\n".join([f"## {title}", "", "| implementation | CPU ms | wall ms | "
                                   "speed-up over eager | compile s |", "|---|---:|---:|---:|---:|", *rows, ""]))
        print(sections[-1], flush=True)

    # --- K-means
    km = {"eager reference (matmul distances)": lambda: reference.hamming_kmeans(codes, lengths, C, 10),
          "C++ operator": lambda: native.hamming_kmeans(codes, lengths, C, 10)}

    def km_compiled_ref():
        f, t0 = compiled(reference.hamming_kmeans)
        return (lambda: f(codes, lengths, C, 10)), t0

    def km_compiled_pop():
        f, t0 = compiled(popcount_kmeans)
        return (lambda: f(codes, lengths, C, 10)), t0

    def km_check(cands):
        want = reference.hamming_kmeans(codes, lengths, C, 10)[0]
        for label, fn in cands.items():
            assert torch.equal(fn()[0], want), f"{label}: assignments differ"

    run("K-means, 10 iterations, C = 100", km,
        {"torch.compile(reference)": km_compiled_ref, "torch.compile(popcount form)": km_compiled_pop},
        km_check)

    # --- centroid attention and sparse part, forward + backward
    cent = torch.randn(B, H, C, E, generator=g)
    d_val = torch.randn(B, H, C, E, generator=g)

    def fb_centroid(fn):
        def call():
            leaves = [t.clone().requires_grad_() for t in (cent, k, v)]
            values, top_w, _ = fn(*leaves, lengths, E ** -0.5, K)
            (values * d_val).sum().add(top_w.sum()).backward()
            return values
        return call

    def compiled_centroid():
        f, t0 = compiled(reference.centroid_attention)
        return fb_centroid(f), t0

    run("Centroid attention, forward + backward (C = 100, top 32)",
        {"eager reference": fb_centroid(reference.centroid_attention),
         "C++ operator": fb_centroid(native.centroid_attention)},
        {"torch.compile(reference)": compiled_centroid}, lambda c: None)

    a, _ = native.hamming_kmeans(codes, lengths, C, 10)
    values, top_w, top_idx = native.centroid_attention(cent, k, v, lengths, E ** -0.5, K)
    grad = torch.randn(B, H, N, E, generator=g)

    def fb_sparse(fn):
        def call():
            leaves = [t.clone().requires_grad_() for t in (q, k, v, values, top_w)]
            out = fn(*leaves, top_idx, a, lengths, E ** -0.5)
            (out * grad).sum().backward()
            return out
        return call

    def compiled_sparse():
        f, t0 = compiled(reference.improved_sparse)
        return fb_sparse(f), t0

    run("Improved-clustered sparse part, forward + backward (k = 32)",
        {"eager reference": fb_sparse(reference.improved_sparse),
         "C++ operator": fb_sparse(native.improved_sparse)},
        {"torch.compile(reference)": compiled_sparse}, lambda c: None)

    # --- Triton on the CPU: the interpreter only
    sections.append(triton_section(args, info))
    print(sections[-1], flush=True)

    out = args.out or ROOT / "benchmarks" / "results" / f"fusion_ab_{info['slug']}.md"
    head = ["# Fusing the CPU hot spots: torch.compile vs a C++ operator vs Triton", "",
            f"- {info['cpu']}, {info['cores']} cores, 1 thread, torch {info['torch']}; 1-minute load "
            f"average {load} at start, {bench_io.load_average()} at end",
            f"- command: `{' '.join(['python', 'benchmarks/fusion_ab.py', *sys.argv[1:]])}`",
            f"- B = {B}, H = {H}, N = {N}, E = {E}; median of {args.rounds} interleaved rounds; "
            "CPU ms = thread CPU time", ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(head + sections) + "\n")
    return 0


def triton_section(args, info) -> str:
    """K-means under the Triton interpreter vs the C++ operator, small size, in a child process."""
    import subprocess

    code = (
        "import os, time, torch; os.environ['TRITON_INTERPRET']='1'\n"
        "from fastasr.kernels import native, reference, triton_kmeans as tk\n"
        "torch.set_num_threads(1); g=torch.Generator().manual_seed(0)\n"
        "codes=reference.hash_codes(torch.randn(1,2,256,32,generator=g),torch.randn(33,63,generator=g))\n"
        "tk.hamming_kmeans(codes,None,16,2)\n"
        "t=time.thread_time(); tk.hamming_kmeans(codes,None,16,2); a=time.thread_time()-t\n"
        "t=time.thread_time(); [native.hamming_kmeans(codes,None,16,2) for _ in range(100)]; b=(time.thread_time()-t)/100\n"
        "print(a, b)\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    try:
        interp, cpp = map(float, proc.stdout.split()[-2:])
        timing = (f"K-means at B = 1, H = 2, N = 256, C = 16, 2 iterations: Triton interpreter "
                  f"{1e3 * interp:.0f} ms, C++ operator {1e3 * cpp:.3f} ms ({interp / cpp:.0f}x).")
    except ValueError:
        timing = f"interpreter run failed: {proc.stderr[-300:]}"
    return "\n".join([
        "## Triton on the CPU", "",
        "The triton 3.6 wheel that ships with torch 2.11 compiles for GPUs only; Triton's CPU "
        "backend (triton-cpu) is a separate fork without a wheel on the package index, built from "
        "source with its own LLVM, which `make install` on 2 cores cannot afford. What runs here "
        "is the interpreter (`TRITON_INTERPRET=1`, NumPy underneath), which is for tests: " + timing, ""])


if __name__ == "__main__":
    sys.exit(main())
