"""How many bisection steps the Triton top-k takes a row, from the whole int32 range or bracketed.

    python benchmarks/topk_steps.py                  # N = 800, 1,024, 3,200, 4,096; k = 32
    python benchmarks/topk_steps.py --ns 800 --scales 0.3 1 4 --rows 4000

``triton_topk._topk_kernel`` finds each row's k-th largest score by bisection over int32 keys
that order as the floats do, and stops a row once exactly k keys lie at or above its lower
bound. This runs the same bisection in PyTorch on the CPU (the keys, the bounds, the stopping
rule of the kernel, step by step) on rows of Gaussian scores, from the whole int32 range and
from ``triton_topk.BRACKET``'s bracket (the least of ``BRACKET_GROUPS`` strided groups' largest
keys, confirmed by one count, up to the row's largest key), checks that both take the same keys,
and counts the steps: a step is one compare and count over the row, 131-132 instructions a
thread on sm_90 for rows of up to 1,024 on one warp (``compile_check --only topk --loops``).
No GPU, no timing. Writes ``benchmarks/results/topk_steps.md``.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import bench_io  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

PAD = -(2**31)  # the kernel's key for lanes past N


def keys_of(x: torch.Tensor) -> torch.Tensor:
    """The kernel's int32 keys of float32 scores (``_row_keys``): -0.0 as 0.0, ordered as the floats."""
    bits = torch.where(x == 0, torch.zeros_like(x), x).view(torch.int32)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def bisect(key: torch.Tensor, k: int, lo: torch.Tensor, hi: torch.Tensor, at_lo: torch.Tensor):
    """The kernel's bisection on ``(R, BLOCK_N)`` int64 keys: the steps each row took and its bound."""
    steps = torch.zeros(key.shape[0], dtype=torch.long)
    going = (at_lo != k) & (hi - lo > 1)
    while bool(going.any()):
        mid = lo + (hi - lo) // 2
        count = (key >= mid[:, None]).sum(1)
        enough = count >= k
        lo = torch.where(going & enough, mid, lo)
        at_lo = torch.where(going & enough, count, at_lo)
        hi = torch.where(going & ~enough, mid, hi)
        steps += going.long()
        going = (at_lo != k) & (hi - lo > 1)
    return steps, lo


def bracket(key: torch.Tensor, k: int, groups: int):
    """``BRACKET``'s start: ``(lo, hi, at_lo)``, the whole range's lower bound where the count
    does not confirm the groups' (``neg_inf``: -inf's key; its groups, and padding's, bound nothing)."""
    rows, block = key.shape
    neg_inf = int(keys_of(torch.tensor([float("-inf")]))[0])
    top = key.view(rows, block // groups, groups).max(1).values  # group j: lanes j, j + groups, ...
    least = torch.where(top > neg_inf, top, torch.full_like(top, 2**31 - 1)).min(1).values
    at_least = (key >= least[:, None]).sum(1)
    ok = at_least >= k
    lo = torch.where(ok, least, torch.full_like(least, PAD))
    return lo, key.max(1).values + 1, torch.where(ok, at_least, torch.full_like(at_least, block))


def row_keys(n: int, rows: int, scale: float, g: torch.Generator) -> torch.Tensor:
    block = 1 << (n - 1).bit_length()
    key = torch.full((rows, block), PAD, dtype=torch.int64)
    key[:, :n] = keys_of(torch.randn(rows, n, generator=g) * scale).long()
    return key


def main(argv: list[str] | None = None) -> int:
    from fastasr.kernels.grid import next_power_of_2

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ns", type=int, nargs="+", default=[800, 1024, 3200, 4096])
    p.add_argument("--scales", type=float, nargs="+", default=[1.0], help="the scores' standard deviations")
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--groups", type=int, default=32, help="triton_topk.BRACKET_GROUPS")
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    lines = ["# The Triton top-k's bisection steps a row: from the whole int32 range and bracketed", "",
             bench_io.command_line("topk_steps.py"), "",
             f"{datetime.date.today()}, commit {bench_io.git_commit(ROOT)}: the kernel's bisection run in PyTorch on "
             f"{args.rows} rows of Gaussian scores each, k = {args.k}, {args.groups} groups; mean steps a row "
             "(min-max). The bracketed rows also take one count to confirm their lower bound. Both take the "
             "same keys in every row.", "",
             "| N | scale | whole range | bracketed | bracket confirmed |", "|---:|---:|---:|---:|---:|"]
    for n in args.ns:
        for scale in args.scales:
            key = row_keys(n, args.rows, scale, g)
            block = key.shape[1]
            whole, whole_lo = bisect(key, args.k, torch.full((args.rows,), PAD), torch.full((args.rows,), 2**31),
                                     torch.full((args.rows,), block))
            lo, hi, at_lo = bracket(key, args.k, min(args.groups, next_power_of_2(n)))
            steps, bracket_lo = bisect(key, args.k, lo, hi, at_lo)
            if not torch.equal(key >= whole_lo[:, None], key >= bracket_lo[:, None]):
                raise SystemExit(f"N = {n}, scale {scale}: the bracketed bisection took other keys")
            lines.append(f"| {n:,} | {scale:g} | {whole.float().mean():.1f} ({whole.min()}-{whole.max()}) | "
                         f"{steps.float().mean():.1f} ({steps.min()}-{steps.max()}) | "
                         f"{(lo > PAD).float().mean():.0%} |")
            print(lines[-1], flush=True)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "topk_steps.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'topk_steps.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
