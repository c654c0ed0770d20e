"""The host's share of an attention call through the Triton kernels, measured without a GPU.

    python benchmarks/host_overhead.py                       # clustered-100 and i-clustered-100
    python benchmarks/host_overhead.py --specs i-clustered-100 --repeats 200 --profile

A training step issues its kernels one by one; where the host takes longer to issue a layer's
kernels than the GPU to run them, the GPU waits (the H200's i-clustered-100 step at N = 800 at
7f13715: 76.6 ms against 60.8 ms of kernels, the floor's 31.8 against 24.6: gpu_notes.md). This
times what the host does for one forward + backward of the attention through the Triton path
(``FASTASR_KERNELS=triton``) on the CPU: the launchers' Python, the torch ops around the
kernels and autograd, with every Triton launch stubbed out (the kernels run in the interpreter
mode and do nothing: the outputs are garbage, the host's path is the GPU's, since no forward or
backward reads a value back). What it leaves out: Triton's own launch (its argument binding and
the driver's call, about 10-20 µs a launch on a GPU host), and what torch's ops cost on a GPU
(a launch each) rather than the CPU (tiny tensors here: ``B`` × ``H`` × ``N``). Median of
``--repeats`` calls after warm-ups, in one process on one torch thread. ``--profile``: the
functions by their own time (cProfile), where the host's time goes.

Writes ``benchmarks/results/host_overhead_<machine>.md``.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before Triton and the kernels are imported
os.environ["FASTASR_KERNELS"] = "triton"

import argparse  # noqa: E402
import collections  # noqa: E402
import cProfile  # noqa: E402
import datetime  # noqa: E402
import io  # noqa: E402
import pstats  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import bench_io  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from fastasr.attention import build_attention  # noqa: E402
from fastasr.attention.masking import check_lengths  # noqa: E402
from fastasr.kernels.availability import prepare_interpreter  # noqa: E402


def stub_launches() -> collections.Counter:
    """Make every interpreted Triton launch a no-op that counts itself; the counter."""
    prepare_interpreter()
    from triton.runtime.interpreter import InterpretedFunction

    launches: collections.Counter = collections.Counter()

    def launch(self, *args, **kwargs):
        launches[self.fn.__name__] += 1

    InterpretedFunction.run = launch
    return launches


def call(spec: str, batch: int, heads: int, n: int, dim: int):
    """One forward + backward of ``spec`` on head-split views of ``(B, N, H·E)`` projections,
    the last sequence half long, as an attention layer makes them: a function of no arguments."""
    attn = build_attention(spec, seed=0)
    g = torch.Generator().manual_seed(0)
    proj = [torch.randn(batch, n, heads * dim, generator=g).requires_grad_() for _ in range(3)]
    lengths = torch.full((batch,), n)
    lengths[-1] = n // 2
    lengths = check_lengths(lengths, batch, n)

    def run():
        q, k, v = (x.view(batch, n, heads, dim).transpose(1, 2) for x in proj)
        out = attn._forward(q, k, v, lengths)
        out.transpose(1, 2).reshape(batch, n, heads * dim).sum().backward()
    return run


def measure(args, launches: collections.Counter) -> tuple[list[str], str]:
    rows, profiles = [], []
    for spec in args.specs:
        run = call(spec, args.batch, args.heads, args.n, args.dim)
        for _ in range(args.warmups):
            run()
        launches.clear()
        run()
        count = sum(launches.values())
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            run()
            times.append(1e6 * (time.perf_counter() - t0))
        rows.append(f"| {spec} | {count} | {statistics.median(times):.0f} | {min(times):.0f} | {max(times):.0f} |")
        print(rows[-1], flush=True)
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.repeats):
                run()
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
            profiles += ["", f"### {spec}: functions by their own time over {args.repeats} calls (cProfile)", "",
                         "```", out.getvalue().strip(), "```"]
    return rows, "\n".join(profiles)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--specs", nargs="+", default=["clustered-100", "i-clustered-100"])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--n", type=int, default=128, help="positions (at least the clusters' 100)")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--warmups", type=int, default=5)
    p.add_argument("--repeats", type=int, default=100)
    p.add_argument("--profile", action="store_true", help="also where the time goes (cProfile)")
    p.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    launches = stub_launches()
    info = bench_io.machine_info("cpu")
    before = bench_io.load_average()
    rows, profiles = measure(args, launches)
    lines = ["# The host's share of an attention call through the Triton kernels (launches stubbed)", "",
             bench_io.command_line("host_overhead.py"), "",
             f"{datetime.date.today()}, commit {bench_io.git_commit(ROOT)}, {info['cpu']}, 1 torch thread, torch "
             f"{info['torch']}; load average {before} before, {bench_io.load_average()} after. One forward + "
             f"backward of B = {args.batch}, H = {args.heads}, N = {args.n}, E = {args.dim} through "
             "`FASTASR_KERNELS=triton` with each Triton launch a no-op: the launchers' Python, the torch ops "
             "around the kernels (on tiny CPU tensors) and autograd, not Triton's own launch. "
             f"Median of {args.repeats} calls after {args.warmups} warm-ups, µs.", "",
             "| attention | Triton launches | host µs (median) | min | max |", "|---|---:|---:|---:|---:|", *rows]
    stem = bench_io.result_stem(args.out_dir, "host_overhead", info)
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n" + profiles + ("\n" if profiles else ""))
    print(f"wrote {stem.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
