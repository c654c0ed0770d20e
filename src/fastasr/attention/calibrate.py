"""Measure where improved clustered attention overtakes full attention on this machine.

    python -m fastasr.attention.calibrate                 # writes conf/attention/auto.yaml
    make calibrate-auto                                   # the same
    python -m fastasr.attention.calibrate --dry-run       # print only

For each N of a grid, full attention and ``i-clustered`` (with the parameters in the
target YAML) run on ``--tokens`` tokens per call (B = tokens / N, H and E as given),
interleaved, median of ``--repeats``; once as forward + backward (training) and once
as forward without autograd (decoding). A crossover is the smallest grid N from which
i-clustered is faster at that N and at every larger one (the largest N + 1 if it never
is). The two values replace ``crossover`` and ``crossover_no_grad`` in the YAML; every
other line, comments included, is kept, and a comment records the machine and date.
Threads: torch's setting (``--threads`` to force), as in training. Run it on a quiet
machine: on a shared one, threads preempted by other jobs make every multi-threaded
timing erratic (``--threads 1`` is the robust choice there).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from fastasr.attention.registry import build_attention
from fastasr.config import CONFIG_DIR

__all__ = ["measure", "crossover", "write_crossovers", "main"]

DEFAULT_YAML = CONFIG_DIR / "attention" / "auto.yaml"
GRID = (256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)


def _call(attn, inputs, train: bool) -> None:
    q, k, v, lengths = inputs
    if train:
        for t in (q, k, v):
            t.grad = None
        attn(q, k, v, lengths).sum().backward()
    else:
        with torch.no_grad():
            attn(q, k, v, lengths)


def measure(ns, tokens: int, heads: int, dim: int, clustered: dict, repeats: int, train: bool,
            log=print) -> dict[int, tuple[float, float]]:
    """``{N: (full seconds, i-clustered seconds)}``, medians of interleaved calls."""
    full = build_attention("full")
    approx = build_attention({"name": "i-clustered", **clustered})
    out = {}
    for n in ns:
        B = max(1, tokens // n)
        g = torch.Generator().manual_seed(n)
        q, k, v = (torch.randn(B, heads, n, dim, generator=g).requires_grad_(train) for _ in range(3))
        inputs = (q, k, v, torch.full((B,), n, dtype=torch.int64))
        times = {full: [], approx: []}
        for attn in times:
            _call(attn, inputs, train)  # warm-up
        for r in range(repeats):
            for attn in ((full, approx) if r % 2 == 0 else (approx, full)):
                t0 = time.perf_counter()
                _call(attn, inputs, train)
                times[attn].append(time.perf_counter() - t0)
        out[n] = (statistics.median(times[full]), statistics.median(times[approx]))
        log(f"{'train' if train else 'decode'} N={n:>5} B={B:>3}: full {1e3 * out[n][0]:8.1f} ms, "
            f"i-clustered {1e3 * out[n][1]:8.1f} ms")
    return out


def crossover(times: dict[int, tuple[float, float]]) -> int:
    """Smallest N from which i-clustered is faster at N and every larger measured N."""
    ns = sorted(times)
    for i, n in enumerate(ns):
        if all(times[m][1] < times[m][0] for m in ns[i:]):
            return n
    return ns[-1] + 1


def write_crossovers(path: Path, train: int, decode: int, note: str) -> None:
    """Replace the ``crossover`` and ``crossover_no_grad`` values of ``path`` (comments kept)."""
    text = path.read_text()
    for key, value in (("crossover", train), ("crossover_no_grad", decode)):
        text, n = re.subn(rf"^({key}:\s*)\d+", rf"\g<1>{value}", text, flags=re.M)
        if n != 1:
            raise ValueError(f"{path}: expected one '{key}: <int>' line, found {n}")
    lines = [line for line in text.splitlines() if not line.startswith("# calibrated:")]
    lines.insert(1, f"# calibrated: {note}")
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fastasr.attention.calibrate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--yaml", type=Path, default=DEFAULT_YAML, help="the auto attention config to update")
    p.add_argument("--ns", type=int, nargs="+", default=list(GRID))
    p.add_argument("--tokens", type=int, default=8192, help="tokens per call (B = tokens / N)")
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--dry-run", action="store_true", help="measure and print, write nothing")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from omegaconf import OmegaConf

    config = OmegaConf.to_container(OmegaConf.load(args.yaml))
    clustered = {key: config[key] for key in ("clusters", "bits", "iterations", "topk", "seed")}
    started = time.perf_counter()
    results = {}
    for train in (True, False):
        results[train] = crossover(measure(args.ns, args.tokens, args.heads, args.dim, clustered,
                                           args.repeats, train))
    note = (f"{platform.machine()} with {os.cpu_count()} cores, {torch.get_num_threads()} torch thread(s), H={args.heads} E={args.dim}, "
            f"{args.tokens} tokens per call, {datetime.date.today()}, `python -m fastasr.attention.calibrate`")
    print(f"crossover (training) {results[True]}, crossover_no_grad (decoding) {results[False]} "
          f"({time.perf_counter() - started:.0f} s)")
    if not args.dry_run:
        write_crossovers(args.yaml, results[True], results[False], note)
        print(f"wrote {args.yaml}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
