"""Every Triton kernel configuration compiled for a GPU without one, as one table: registers,
shared memory, CTAs an SM, and the instructions of its hot loop.

    python -m benchmarks.gpu.kernel_resources              # sm_90 (H100/H200)
    python -m benchmarks.gpu.kernel_resources --arch 80    # A100

Writes ``benchmarks/results/kernel_resources_sm<arch>.md`` with the compiler, the commit and the
machine that compiled. These are what ``fastasr-kernels compile-check --loops`` prints
(Triton's bundled ``ptxas`` and ``cuobjdump``; no GPU needed), each configuration as the
launchers specialise it. They are static counts, not timings: "CTAs an SM" is how many of a
kernel's CTAs fit an SM at once by its registers, shared memory and warps (CUDA's occupancy
rules, :func:`fastasr.kernels.compile_check.ctas_per_sm`), which with the grid says how many
waves a launch takes; the loop's instructions are a thread's in one iteration (and in a loop
inside it, which runs its trip count). benchmarks/gpu/notes.md reads them beside the GPU's
timings. Exit status 1, and no table, where a configuration fails ``compile_check``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks import bench_io
from fastasr.kernels import compile_check

ROOT = Path(__file__).resolve().parents[2]


def table(reports: Sequence[compile_check.KernelReport], arch: int, info: dict, commit: str,
          triton_version: str, command: str) -> str:
    """The Markdown page of ``reports`` (all compiled, none spilling)."""
    lines = [
        f"# Triton kernels compiled for sm_{arch}",
        "",
        command,
        "",
        f"{datetime.date.today()}, commit {commit}, Triton {triton_version} with its bundled ptxas, "
        f"compiled on {info['cpu']} ({info['cores']} cores; no GPU). Each configuration as the "
        "launchers specialise it. Static counts, not timings: registers a thread; shared memory "
        "a CTA; CTAs an SM by CUDA's occupancy rules (registers, shared memory, warps); a thread's "
        "instructions in one iteration of the hot loop (the innermost loop with tensor-core "
        "products, else the longest innermost one), in one trip of a loop inside it, and in one "
        "iteration of each innermost loop in the order of the code (the top-k's bisection step, "
        "then its store chunk).",
        "",
        "| kernel configuration | registers | shared memory (B) | warps | CTAs an SM | hot loop (instructions) "
        "| a loop inside it | every innermost loop |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in reports:
        loop, inner = r.hot_loop if r.hot_loop else (None, ())
        lines.append(
            f"| {r.name} | {r.registers} | {r.shared_bytes:,} | {r.warps} | "
            f"{'' if r.ctas_per_sm is None else r.ctas_per_sm} | {'' if loop is None else f'{loop:,}'} | "
            f"{', '.join(f'{n:,}' for n in inner)} | {', '.join(f'{n:,}' for n in r.innermost)} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90 = H100/H200)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="configurations compiled at once")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    import triton

    reports = compile_check.compile_all(args.arch, jobs=args.jobs, loops=True)
    bad = [r.name for r in reports if r.fails]
    if bad:
        print(f"compile_check fails {len(bad)} configuration(s), no table written: {', '.join(bad)}\n"
              f"(fastasr-kernels compile-check --arch {args.arch} --verbose says why)", file=sys.stderr)
        return 1
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"kernel_resources_sm{args.arch}.md"
    path.write_text(table(reports, args.arch, bench_io.machine_info("cpu"), bench_io.git_commit(ROOT),
                          triton.__version__, bench_io.command_line("gpu/kernel_resources.py")))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
