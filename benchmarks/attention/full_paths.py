"""Full attention on a padded batch: every exact path timed, and the one fastasr takes.

    python -m benchmarks.attention.full_paths                      # CUDA: N = 256 … 65,536, bf16 and fp32
    python -m benchmarks.attention.full_paths --ns 800 3200 --dtypes bfloat16

``fastasr.attention.full`` runs a padded batch through one of four exact paths (its module
docstring): ``mask`` (SDPA with a key-padding mask), ``varlen`` (FlashAttention's variable-length
kernel on the padded layout, half precision only), ``packed`` (jagged nested tensors) and
``dense`` (the unpadded kernel, padded keys pushed out by 8 appended feature columns). This
script times each, forward + backward, on ``--tokens`` tokens a call (B = tokens / N, every
sequence N long but the last, at 3/4 N, as in ``attention/gpu_table.py``), 6 heads × 32, q, k and v in
the model's layout (views of ``(B, N, H, E)`` projections, as the encoder's attention gets
them; contiguous ``(B, H, N, E)`` inputs would charge varlen a copy to its ``(B·N, H, E)`` rows
that the model never pays), beside the
unpadded flash call on the same shape (no lengths: the floor no padded path can beat), and
says which path :func:`fastasr.attention.full.padded_path` chooses and which was fastest. Before
timing, every path is checked against the fp32 key-mask result (values and gradients,
``gpu_checks._check_packed``). Timing: CUDA events, 3 warm-up calls, inputs rotated among three
sets, the median of repeats filling ``--target-s`` per cell.

Writes ``benchmarks/results/full_paths_<gpu>.{md,csv}``; with ``--budget-s`` (or
``$BENCH_DEADLINE``, which ``make gpu-check`` sets) no new row starts once the time is up, and the
table says where it stopped.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks import bench_io, timing
from benchmarks.attention.gpu_checks import CheckFailed, _check_packed

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from fastasr.attention import full  # noqa: E402

NS = [256, 800, 1024, 3200, 4096, 8192, 16384, 32768, 65536]
COLUMNS = ["unpadded flash", *full.PADDED_PATHS]


@dataclass
class Row:
    gpu: str
    dtype: str
    n: int
    batch: int
    variant: str
    median_ms: float | None
    repeats: int
    status: str = "ok"


def _time(fn, inputs, target_s: float, max_repeats: int) -> tuple[float, int]:
    """Median milliseconds of ``fn`` over the input sets in turn, and the calls timed: three
    warm-ups, then at least three calls, more until ``target_s`` (``max_repeats`` at most)."""
    turn = itertools.count()
    t = timing.measure(lambda: fn(*inputs[next(turn) % len(inputs)]), warmup=3, repeats=3, device="cuda",
                       target_s=target_s, max_repeats=max_repeats)
    return t.median_ms, t.count


def _call(path: str | None):
    """forward + backward of one path (None: unpadded SDPA, flash where the dtype allows)."""

    def run(q, k, v, g, lengths):
        out = (torch.nn.functional.scaled_dot_product_attention(q, k, v) if path is None
               else full._PATH_FUNCTIONS[path](q, k, v, lengths))
        out.backward(g)

    return run


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ns", type=int, nargs="+", default=NS)
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--target-s", type=float, default=0.15)
    p.add_argument("--max-repeats", type=int, default=20)
    p.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--budget-s", type=float, default=None,
                   help=f"start no new row after this many seconds (also ${bench_io.DEADLINE_ENV}, a Unix time)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("attention/full_paths.py times CUDA kernels: no GPU visible")
    device = torch.device("cuda")
    info = bench_io.machine_info(device)
    g = torch.Generator(device=device).manual_seed(0)

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g, device=device).to(dtype)

    H, E = args.heads, args.dim

    def model_layout(b: int, n: int, dtype) -> torch.Tensor:
        """``(b, H, n, E)`` as the model's projections give q, k and v: a view of a ``(b, n, H, E)``
        leaf (varlen's ``(b·n, H, E)`` rows are then a view too, not a copy)."""
        return randn(b, n, H, E, dtype=dtype).requires_grad_().transpose(1, 2)

    print(_check_packed(8, H, 1024, E, torch.full((8,), 1024, device=device).sub_(torch.arange(8, device=device) * 50),
                        randn), flush=True)
    rows: list[Row] = []
    chosen: dict[tuple[str, int], str] = {}
    budget, notes = bench_io.Budget(args.budget_s), []
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for n in args.ns:
            if budget.spent(notes, f"{dtype_name} at N = {n}"):
                break
            b = max(1, args.tokens // n)
            lengths = torch.full((b,), n, dtype=torch.int64, device=device)
            lengths[-1] = 3 * n // 4
            inputs = [[model_layout(b, n, dtype) for _ in range(3)] + [randn(b, H, n, E, dtype=dtype), lengths]
                      for _ in range(3)]
            chosen[(dtype_name, n)] = full.padded_path(inputs[0][0], inputs[0][2])
            for col, path in zip(COLUMNS, [None, *full.PADDED_PATHS]):
                if path == "varlen" and not full.varlen_available(inputs[0][0], inputs[0][2]):
                    rows.append(Row(info["gpu"], dtype_name, n, b, col, None, 0, "n/a (flash: half precision only)"))
                    continue
                try:
                    ms, reps = _time(_call(path), inputs, args.target_s, args.max_repeats)
                    rows.append(Row(info["gpu"], dtype_name, n, b, col, ms, reps))
                except Exception as exc:  # noqa: BLE001  (an OOM or an unsupported shape is a table cell)
                    if not bench_io.is_oom(exc) and not isinstance(exc, RuntimeError):
                        raise
                    rows.append(Row(info["gpu"], dtype_name, n, b, col, None, 0, type(exc).__name__))
                    torch.cuda.empty_cache()
            cells = {r.variant: r for r in rows if r.dtype == dtype_name and r.n == n}
            print(f"{dtype_name} N={n} B={b}: " + ", ".join(
                f"{c} {cells[c].median_ms:.2f} ms" if cells[c].median_ms else f"{c} {cells[c].status}" for c in COLUMNS)
                + f"; fastasr takes {chosen[(dtype_name, n)]}", flush=True)
            del inputs
            torch.cuda.empty_cache()
    write(rows, chosen, args, info, notes)


def write(rows: list[Row], chosen: dict, args, info: dict, notes: list[str] = ()) -> None:
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / f"full_paths_{info['slug']}"
    if rows:  # none where the time budget was spent before the first
        bench_io.write_csv(rows, stem.with_suffix(".csv"), 4)
    lines = [
        f"# Full attention on a padded batch, every exact path: {info['gpu']}",
        "",
        f"`python -m benchmarks.attention.full_paths {' '.join(sys.argv[1:])}`".replace(" `", "`"),
        "",
        f"{datetime.date.today()}, torch {info['torch']}, commit {bench_io.git_commit(ROOT)}. "
        f"Forward + backward, {args.tokens} tokens a call (B = tokens / N, the last sequence 3/4 N), "
        f"{args.heads} heads × {args.dim}; median ms (CUDA events). 'unpadded flash': the same shape without lengths "
        "(the floor of every padded path). 'fastasr': the path `fastasr.attention.full.padded_path` takes; "
        "'fastest': the fastest padded path measured.",
        "",
        "| dtype | N (B) | " + " | ".join(COLUMNS) + " | fastasr | fastest |",
        "|---|---|" + "---:|" * len(COLUMNS) + "---|---|",
    ]
    for (dtype_name, n), path in chosen.items():
        cells = {r.variant: r for r in rows if r.dtype == dtype_name and r.n == n}
        timed = {c: cells[c].median_ms for c in full.PADDED_PATHS if cells[c].median_ms}
        fastest = min(timed, key=timed.get) if timed else "-"
        lines.append(f"| {dtype_name} | {n} ({cells[COLUMNS[0]].batch}) | " + " | ".join(
            f"{cells[c].median_ms:.2f}" if cells[c].median_ms else cells[c].status for c in COLUMNS)
            + f" | {path} | {fastest} |")
    lines += notes
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {stem.with_suffix('.md')}")


if __name__ == "__main__":
    try:
        main()
    except CheckFailed as err:
        sys.exit(f"CHECK FAILED: {err}")
