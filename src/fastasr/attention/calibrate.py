"""Measure where improved clustered attention overtakes full attention on this machine.

:func:`measure` times full attention and ``i-clustered`` on a grid of lengths (forward +
backward, or forward without autograd), interleaved, median of several calls;
:func:`crossover` is the smallest grid N from which i-clustered is faster at N and every
larger one. ``python -m fastasr.cli.calibrate`` (``make calibrate-auto``) runs both and
writes the crossovers into ``conf/attention/auto.yaml``.
"""

from __future__ import annotations

import statistics
import time

import torch

from fastasr.attention.registry import build_attention

__all__ = ["GRID", "crossover", "measure"]

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
