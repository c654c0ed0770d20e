"""Where the time of one clustered-attention call goes, stage by stage (torch.profiler).

    python -m benchmarks.attention.profile_stages                     # i-clustered-100 and clustered-100, N = 1k, 4k
    python -m benchmarks.attention.profile_stages --kernels reference # the PyTorch reference ops instead

One forward + backward of ``--spec`` on 16384 tokens (B = 16384 / N, last sequence
padded), H = 6, E = 32, one torch thread, after a warm-up call. Forward stages are the
``attention.*`` scopes the modules mark (``record_function``): hashing, K-means,
centroid means, centroid attention (scores, softmax, top-k, values), the sparse
per-query part (i-clustered) and the broadcast back to queries (clustered). Backward
stages are the autograd nodes of those steps. Times are each stage's CPU total;
fractions are of the whole call, so what the machine's load does to absolute times
matters less. ``--kernels`` sets ``FASTASR_KERNELS`` (``native``: the C++ kernels,
``reference``: the PyTorch reference that ran before them).

Writes ``benchmarks/results/profile_<machine>.md`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from benchmarks import timing

ROOT = Path(__file__).resolve().parents[2]

# backward autograd node -> stage
BACKWARD_STAGES = {
    "_CentroidAttentionBackward": "centroid attention",
    "BmmBackward0": "centroid attention",  # the reference's autograd graph, from here ...
    "SoftmaxBackward0": "centroid attention",
    "MaskedFillBackward0": "centroid attention",
    "MulBackward0": "centroid attention",
    "_GatherDotBackward": "sparse part",
    "_GatherWeightedSumBackward": "sparse part",  # ... to here
    "_ImprovedSparseBackward": "sparse part",
    "IndexAddBackward0": "centroid means",
    "DivBackward0": "centroid means",
    "GatherBackward0": "broadcast / gathers",
    "CatBackward0": "broadcast / gathers",
}


def profile_once(spec: str, N: int, args) -> tuple[dict, float]:
    """{(pass, stage): ms} and the total ms of one forward + backward."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from fastasr.attention import build_attention

    B = max(1, args.tokens // N)
    g = torch.Generator().manual_seed(N)
    q, k, v = (torch.randn(B, args.heads, N, args.dim, generator=g).requires_grad_() for _ in range(3))
    lengths = torch.full((B,), N, dtype=torch.int64)
    lengths[-1] = N - N // 4
    grad = torch.randn(B, args.heads, N, args.dim, generator=g)
    attn = build_attention(spec, seed=0)

    def call():
        for t in (q, k, v):
            t.grad = None
        attn(q, k, v, lengths).backward(grad)

    call()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = timing.Clock()
        call()
        total = 1e3 * t0.seconds()
    stages: dict[tuple[str, str], float] = {}
    prefix = "autograd::engine::evaluate_function: "
    for event in prof.key_averages():
        ms = event.cpu_time_total / 1e3
        if event.key.startswith("attention."):
            key = ("forward", event.key[len("attention."):].replace("_", " "))
        elif event.key.startswith(prefix):
            node = event.key[len(prefix):]
            key = ("backward", BACKWARD_STAGES.get(node, "other (views, sums, accumulation)"))
        else:
            continue
        stages[key] = stages.get(key, 0.0) + ms
    return stages, total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--specs", nargs="+", default=["i-clustered-100", "clustered-100"])
    p.add_argument("--ns", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--kernels", default="native", choices=["native", "reference"])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["FASTASR_KERNELS"] = args.kernels
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    from benchmarks import bench_io

    torch.set_num_threads(1)
    info = bench_io.machine_info("cpu")
    load = bench_io.load_average()
    lines = [f"# Profile of one forward + backward ({args.kernels} kernels)", "",
             f"- {info['cpu']}, {info['cores']} cores, 1 torch thread, torch {info['torch']}; "
             f"1-minute load average {load} at start",
             f"- command: `{' '.join(['python', '-m', 'benchmarks.attention.profile_stages', *sys.argv[1:]])}`",
             f"- {args.tokens} tokens per call, H = {args.heads}, E = {args.dim}, float32, last sequence "
             "padded to 3/4 N; stage times are torch.profiler CPU totals, % of the whole call", ""]
    for spec in args.specs:
        for N in args.ns:
            stages, total = profile_once(spec, N, args)
            lines += [f"## {spec}, N = {N} (B = {max(1, args.tokens // N)}): {total:.0f} ms", "",
                      "| pass | stage | ms | % |", "|---|---|---:|---:|"]
            for (pss, stage), ms in sorted(stages.items(), key=lambda kv: (kv[0][0] != "forward", -kv[1])):
                lines.append(f"| {pss} | {stage} | {ms:.1f} | {100 * ms / total:.0f} |")
            print(f"{spec} N={N}: {total:.0f} ms", flush=True)
            lines.append("")
    out = args.out or ROOT / "benchmarks" / "results" / f"profile_{info['slug']}_{args.kernels}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
