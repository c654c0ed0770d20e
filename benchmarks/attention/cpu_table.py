"""CPU benchmark against the paper's own kernels and SDPA: the table `make bench` writes.

    python -m benchmarks.attention.cpu_table            # N = 1k, 2k, 4k, 16k (about 6 min on 2 quiet cores)
    python -m benchmarks.attention.cpu_table --quick    # smoke test: tiny sizes, seconds

Every cell: 16384 tokens per call (B = 16384 / N; the last sequence padded to 3/4 of
N), H = 6, E = 32, float32, one torch thread (``OMP_NUM_THREADS`` too, which the paper's
OpenMP kernels read). Candidates:

* ours: ``full`` (torch's fused SDPA), ``clustered-100`` and ``i-clustered-100``
  (k = 32), 63 hash bits, 10 Lloyd iterations (:mod:`fastasr.attention`);
* theirs: pytorch-fast-transformers 0.4.0, ``ClusteredAttention`` and
  ``ImprovedClusteredAttention`` with the same parameters and no dropout, i.e. its C++
  CPU kernels, in its own (B, N, H, E) layout. A benchmark-only comparison, never a
  dependency: the columns are filled when ``fast_transformers`` is importable and
  say so when it is not (install it with ``pip install --no-build-isolation
  pytorch-fast-transformers==0.4.0`` into a venv that has torch, with no ``nvcc`` on
  PATH so that only its CPU extensions build, about 5 min on 2 cores).

Forward (no autograd: decoding) and forward + backward (training), median of
``--repeats`` calls after one warm-up. The candidates of a cell run interleaved, one
call each per round, so a change of machine load hits all of them alike and the
ratios stay meaningful even when the absolute times do not.

Error: the relative L2 distance ``||out - full||_F / ||full||_F`` over the valid
positions, on *structured* inputs: queries and keys drawn (NumPy PCG64) around 32
centres shared per head (unit-variance centres, noise 0.5), so attention is peaked as
it is in a trained model; N = 1024, B = 2, the second sequence padded; mean over 5 draws, each
with its own hash planes, the same for ours and theirs (see :func:`measure_errors`).

Writes ``benchmarks/results/cpu_<machine>.md`` and ``.csv``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks import timing

ROOT = Path(__file__).resolve().parents[2]
PAPER_CODE = "pytorch-fast-transformers 0.4.0"


@dataclass
class Row:
    n: int
    batch: int
    mode: str
    candidate: str
    median_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    repeats: int = 0
    status: str = "ok"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ns", type=int, nargs="+", default=None, help="sequence lengths")
    p.add_argument("--tokens", type=int, default=None, help="tokens per call (default 16384)")
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--clusters", type=int, default=100)
    p.add_argument("--topk", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch (and OpenMP) threads")
    p.add_argument("--modes", nargs="+", default=["forward", "forward+backward"],
                   choices=["forward", "forward+backward"])
    p.add_argument("--no-theirs", action="store_true", help="skip the paper's code even if importable")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the script")
    p.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args(argv)
    if args.quick:
        args.ns = args.ns or [64, 128]
        args.tokens = args.tokens or 256
        args.clusters, args.topk, args.repeats = min(args.clusters, 8), min(args.topk, 8), 1
    args.ns = args.ns or [1024, 2048, 4096, 16384]
    args.tokens = args.tokens or 16384
    return args


# ------------------------------------------------------------------ candidates
def paper_code():
    """``fast_transformers`` (attention classes and masks), or the reason it is unavailable."""
    try:
        from fast_transformers.attention import ClusteredAttention, ImprovedClusteredAttention
        from fast_transformers.masking import FullMask, LengthMask
    except Exception as exc:  # ImportError, or a broken build raising anything
        return None, f"{PAPER_CODE} not importable ({type(exc).__name__}: {exc})"
    return (ClusteredAttention, ImprovedClusteredAttention, FullMask, LengthMask), None


def candidates(args, theirs, seed: int = 0) -> dict:
    """label -> function(inputs) -> output, for every candidate that can run."""
    from fastasr.attention import build_attention

    C, K = args.clusters, args.topk
    ours = {
        "SDPA": build_attention("full"),
        f"ours clustered-{C}": build_attention(f"clustered-{C}", seed=seed),
        f"ours i-clustered-{C}": build_attention(f"i-clustered-{C}", topk=K, seed=seed),
    }
    out = {label: (lambda inp, a=attn: a(inp["q"], inp["k"], inp["v"], inp["lengths"]))
           for label, attn in ours.items()}
    if theirs is not None:
        clustered, improved, full_mask, length_mask = theirs
        common = dict(clusters=C, iterations=10, bits=63, attention_dropout=0.0)
        for label, attn in ((f"theirs clustered-{C}", clustered(**common)),
                            (f"theirs i-clustered-{C}", improved(topk=K, **common))):
            def run(inp, a=attn):
                B, N = inp["qt"].shape[:2]
                lengths = length_mask(inp["lengths"], max_len=N)
                out = a(inp["qt"], inp["kt"], inp["vt"], full_mask(N), lengths, lengths)
                return out.transpose(1, 2)  # back to (B, H, N, E)
            out[label] = run
    return out


def make_inputs(B, H, N, E, seed: int, structured: bool = False):
    """q, k, v (B, H, N, E) and their (B, N, H, E) copies for the paper's code; the last
    sequence padded to 3/4 of N with zeros.

    Drawn with NumPy's PCG64: torch's CPU ``normal_`` fills blocks of 16 values from
    shared uniforms, which correlates positions a multiple of 16 values apart, and
    evenly spaced samples of them (K-means' initial centroids) then are not random.
    """
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    if structured:
        centres = rng.standard_normal((H, 32, E))
        heads = np.arange(H)[None, :, None]

        def draw():
            z = rng.integers(0, 32, (B, H, N))
            return centres[heads, z] + 0.5 * rng.standard_normal((B, H, N, E))

        q, k = draw(), draw()
    else:
        q, k = rng.standard_normal((B, H, N, E)), rng.standard_normal((B, H, N, E))
    v = rng.standard_normal((B, H, N, E))
    lengths = torch.full((B,), N, dtype=torch.int64)
    lengths[-1] = N - N // 4
    padded = torch.arange(N)[None, None, :, None] >= lengths[:, None, None, None]
    inp = {name: torch.tensor(x, dtype=torch.float32).masked_fill(padded, 0.0)
           for name, x in zip("qkv", (q, k, v))}  # padded frames hold zeros, as in a batch
    inp["lengths"] = lengths
    for name in "qkv":
        inp[name + "t"] = inp[name].transpose(1, 2).contiguous()
    return inp


# ------------------------------------------------------------------ timing
def time_cell(fns: dict, inp: dict, mode: str, repeats: int) -> dict:
    """Interleaved timing: {label: [seconds per call]} after one untimed warm-up each."""
    import torch

    leaves = [inp[n] for n in ("q", "k", "v", "qt", "kt", "vt")]
    grad = torch.randn_like(inp["q"])

    def call(fn):
        if mode == "forward":
            with torch.no_grad():
                fn(inp)
            return
        for t in leaves:
            t.requires_grad_(True)
            t.grad = None
        fn(inp).backward(grad)

    times = {label: [] for label in fns}
    for fn in fns.values():
        call(fn)
    labels = list(fns)
    for r in range(repeats):
        for label in labels[r % len(labels):] + labels[: r % len(labels)]:  # rotate the order
            times[label].append(timing.time_once(lambda label=label: call(fns[label])) / 1e3)
    return times


def measure_errors(args, theirs, draws: int = 5) -> dict:
    """Mean relative L2 error to SDPA on structured inputs, per approximate candidate.

    Draw ``s`` builds ours with ``seed=s`` and hands the paper's code the same hash planes
    (its module draws them with ``torch.nn.init.normal_``, patched here; its planes are
    ``(bits, E + 1)`` with the offset negated), so the comparison is between the two
    algorithms on identical random projections, not between two draws.
    """
    import numpy as np
    import torch

    N, E, bits = min(1024, max(args.ns)), args.dim, 63
    errs: dict[str, list[float]] = {}
    for seed in range(draws):
        planes = torch.randn(E + 1, bits, generator=torch.Generator().manual_seed(seed))
        theirs_planes = torch.cat([planes[:E].t(), -planes[E:].t()], dim=1)
        fns = candidates(args, theirs, seed=seed)
        inp = make_inputs(2, args.heads, N, E, 1000 + seed, structured=True)
        valid = torch.arange(N)[None, :] < inp["lengths"][:, None]
        with torch.no_grad(), _paper_planes(theirs_planes if theirs else None):
            full = fns["SDPA"](inp).transpose(1, 2)[valid]
            for label, fn in fns.items():
                if label == "SDPA":
                    continue
                np.random.seed(seed)  # the paper's code picks its initial centroids with NumPy
                out = fn(inp).transpose(1, 2)[valid]
                errs.setdefault(label, []).append(float((out - full).norm() / full.norm()))
    return {label: statistics.mean(e) for label, e in errs.items()}


class _paper_planes:
    """Within the block, the paper's attention modules draw ``planes`` as their hash planes."""

    MODULES = ("clustered_attention", "improved_clustered_attention")

    def __init__(self, planes):
        self.planes, self.saved = planes, {}

    def __enter__(self):
        if self.planes is None:
            return self
        import importlib

        for name in self.MODULES:
            module = importlib.import_module(f"fast_transformers.attention.{name}")
            self.saved[module] = module.normal_
            module.normal_ = lambda t, p=self.planes: t.copy_(p)
        return self

    def __exit__(self, *exc):
        for module, fn in self.saved.items():
            module.normal_ = fn


def run(args, fns, log) -> list[Row]:

    rows = []
    for N in args.ns:
        B = max(1, args.tokens // N)
        inp = make_inputs(B, args.heads, N, args.dim, N)
        for mode in args.modes:
            times = time_cell(fns, inp, mode, args.repeats)
            for label, ts in times.items():
                row = Row(N, B, mode, label, 1e3 * statistics.median(ts), 1e3 * min(ts),
                          1e3 * max(ts), len(ts))
                rows.append(row)
                log(f"N={N:>6} B={B:>3} {mode:>16} {label:>26}: {row.median_ms:9.1f} ms")
    return rows


# ------------------------------------------------------------------ report
def _ms(rows, n, mode, label):
    return next((r.median_ms for r in rows if (r.n, r.mode, r.candidate) == (n, mode, label)), None)


def _fmt(x, digits=None):
    if x is None:
        return "—"
    if digits is None:  # milliseconds: 3 significant figures at least
        digits = 0 if x >= 100 else (1 if x >= 10 else 2)
    return f"{x:.{digits}f}"


def verdicts(rows, args, theirs_note: str | None) -> list[str]:
    """The targets of this benchmark, each with the numbers that decide it."""
    C = args.clusters
    out = []
    for variant in (f"clustered-{C}", f"i-clustered-{C}"):
        if theirs_note is not None:
            out.append(f"- {variant} vs {PAPER_CODE}: not measured ({theirs_note})")
            continue
        ratios = [(n, m, _ms(rows, n, m, f"ours {variant}") / _ms(rows, n, m, f"theirs {variant}"))
                  for n in args.ns for m in args.modes]
        worst = max(ratios, key=lambda t: t[2])
        ok = all(r < 1 for _, _, r in ratios)
        out.append(f"- {variant} faster than {PAPER_CODE} at every N and mode: **{'yes' if ok else 'no'}** "
                   f"(ours/theirs between {min(r for *_, r in ratios):.2f} and {worst[2]:.2f}, "
                   f"the largest at N = {worst[0]}, {worst[1]})")
    for mode, n0 in (("forward+backward", 2048), ("forward", 1024)):
        if mode not in args.modes:
            continue
        ns = [n for n in args.ns if n >= n0]
        if not ns:
            out.append(f"- i-clustered-{C} {mode} vs SDPA from N = {n0}: not measured (no N >= {n0})")
            continue
        pairs = [(n, _ms(rows, n, mode, f"ours i-clustered-{C}") / _ms(rows, n, mode, "SDPA")) for n in ns]
        ok = all(r < 1 for _, r in pairs)
        detail = ", ".join(f"{r:.2f} at {n}" for n, r in pairs)
        out.append(f"- i-clustered-{C} {mode} faster than SDPA from N = {n0}: **{'yes' if ok else 'no'}** "
                   f"(i-clustered / SDPA: {detail})")
    return out


def write_markdown(rows, errors, args, info, meta, theirs_note, path: Path) -> None:
    C = args.clusters
    theirs_ok = theirs_note is None
    lines = [
        f"# Attention on the CPU: ours vs {PAPER_CODE} vs SDPA",
        "",
        f"- machine: {info['cpu']}, {info['cores']} cores; {args.threads} torch/OpenMP thread(s); "
        f"torch {info['torch']}, Python {info['python']}",
        f"- command: `{' '.join(['python', '-m', 'benchmarks.attention.cpu_table', *sys.argv[1:]])}`",
        f"- {args.tokens} tokens per call (B = tokens / N, last sequence padded to 3/4 N), H = {args.heads}, "
        f"E = {args.dim}, float32; clustered C = {C}, i-clustered k = {args.topk}, 63 bits, 10 iterations",
        f"- median of {args.repeats} calls after a warm-up, candidates interleaved; total "
        f"{meta['elapsed_s']:.0f} s; 1-minute load average {meta['load_start']} at start, "
        f"{meta['load_end']} at end ({info['cores']} cores: above that, other jobs shared the CPU)",
        f"- {PAPER_CODE}: " + ("its C++ CPU kernels, benchmark only" if theirs_ok else theirs_note),
        "",
    ]
    for mode in args.modes:
        lines += [f"## {mode}: ms per call", "",
                  "| N | B | SDPA | ours clustered | theirs clustered | ours / theirs "
                  "| ours i-clustered | theirs i-clustered | ours / theirs | ours i-clustered / SDPA |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for n in args.ns:
            sd = _ms(rows, n, mode, "SDPA")
            cells = [str(n), str(max(1, args.tokens // n)), _fmt(sd)]
            for variant in (f"clustered-{C}", f"i-clustered-{C}"):
                o, t = _ms(rows, n, mode, f"ours {variant}"), _ms(rows, n, mode, f"theirs {variant}")
                cells += [_fmt(o), _fmt(t) if theirs_ok else "n/a", _fmt(o / t, 2) if t else "—"]
            io = _ms(rows, n, mode, f"ours i-clustered-{C}")
            cells.append(_fmt(io / sd, 2) if io and sd else "—")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Targets", ""] + verdicts(rows, args, theirs_note)
    lines += ["", f"## Error to full attention (structured inputs, N = {min(1024, max(args.ns))})", "",
              "| variant | ours | theirs |", "|---|---:|---:|"]
    for variant in (f"clustered-{C}", f"i-clustered-{C}"):
        lines.append(f"| {variant} | {_fmt(errors.get(f'ours {variant}'), 3)} | "
                     f"{_fmt(errors.get(f'theirs {variant}'), 3) if theirs_ok else 'n/a'} |")
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before torch and the paper's OpenMP load
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    from benchmarks import bench_io

    torch.set_num_threads(args.threads)
    started = timing.Clock()

    def log(msg):
        print(f"[{started.seconds():6.1f}s] {msg}", flush=True)

    theirs, theirs_note = (None, "skipped (--no-theirs)") if args.no_theirs else paper_code()
    if theirs_note:
        log(theirs_note)
    info = bench_io.machine_info("cpu")
    meta = {"load_start": bench_io.load_average()}
    errors = measure_errors(args, theirs)
    fns = candidates(args, theirs)
    log("errors to full attention: " + ", ".join(f"{k} {v:.3f}" for k, v in errors.items()))
    rows = run(args, fns, log)
    meta.update(elapsed_s=started.seconds(), load_end=bench_io.load_average())
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / f"cpu_{info['slug']}"
    bench_io.write_csv(rows, stem.with_suffix(".csv"), digits=5)
    write_markdown(rows, errors, args, info, meta, theirs_note, stem.with_suffix(".md"))
    log(f"wrote {stem}.md/.csv")
    print(stem.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
