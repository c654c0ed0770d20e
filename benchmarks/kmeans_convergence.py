"""How many of K-means' Lloyd iterations a trained model's queries need before nothing moves.

    python benchmarks/kmeans_convergence.py CKPT --manifest data/S/test.jsonl \
        [--utterances 12] [--clusters 100] [--iterations 10]

Runs the first ``--utterances`` utterances of the manifest through the model (one padded batch,
eval mode, CPU), takes the queries every layer hands its inner attention
(``CTCModel.capture_attention``, whatever variant the model trained with), hashes them as
clustered attention does (63 bits, seeded planes) and counts, per (utterance, head), the first
Lloyd iteration that moves no centroid (``reference.fixed_point_iteration``). From there every
later iteration repeats it, so the C++ and Triton K-means stop: the table says how many of the
``--iterations + 1`` passes (the iterations and the final assignment) a sequence costs.
Sequences shorter than ``--clusters`` (one centroid a position) are counted apart.

Writes ``benchmarks/results/kmeans_convergence.md`` (appends a section per checkpoint and C).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import sys
from collections.abc import Sequence
from pathlib import Path

import bench_io  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
import torch
from attention_entropy import batch_of  # noqa: E402

from fastasr.attention import build_attention
from fastasr.kernels import ops, reference
from fastasr.recognition.loading import load_recogniser

ROOT = Path(__file__).resolve().parents[1]


def first_still_iterations(model, features, lengths, clusters: int,
                           iterations: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per layer, ``(B, H)`` :func:`reference.fixed_point_iteration` of its queries' codes, and
    the lengths the layers saw (after subsampling)."""
    hasher = build_attention(f"clustered-{clusters}", seed=0)
    out = []
    with torch.no_grad():
        for layer in range(len(model.attention_layers())):
            with model.capture_attention(layer) as captured:
                model(features, lengths)
            q = captured.q.float()
            codes = ops.hash_codes(q, hasher.hash_planes(q.shape[-1], q.device), captured.lengths)
            out.append(reference.fixed_point_iteration(codes, captured.lengths, clusters, iterations))
    return out, captured.lengths


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--manifest", type=Path, required=True, help="utterances whose queries are clustered")
    ap.add_argument("--utterances", type=int, default=12, help="how many of its first utterances (one batch)")
    ap.add_argument("--clusters", type=int, default=100)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "kmeans_convergence.md")
    args = ap.parse_args(argv)
    recogniser = load_recogniser(args.checkpoint)
    features, lengths = batch_of(args.manifest, recogniser, args.utterances)
    per_layer, seen = first_still_iterations(recogniser.model.eval(), features, lengths,
                                             args.clusters, args.iterations)
    long = seen >= args.clusters  # sequences with at least C positions: C centroids in use
    passes = args.iterations + 1
    hist: collections.Counter = collections.Counter()
    short: collections.Counter = collections.Counter()
    for first in per_layer:
        hist.update(first[long].reshape(-1).tolist())
        short.update(first[~long].reshape(-1).tolist())
    sweeps = [(it if it > 0 else passes) for it, n in hist.items() for _ in range(n)]  # Triton's sweeps
    lines = [
        "", f"## {args.checkpoint}, C = {args.clusters}, {args.iterations} iterations",
        "", f"{bench_io.command_line('kmeans_convergence.py')}: {datetime.date.today()}, commit "
        f"{bench_io.git_commit(ROOT)}; the first {args.utterances} utterances of {args.manifest} "
        f"({int(seen.min())}–{int(seen.max())} positions), {len(per_layer)} layers × {per_layer[0].shape[1]} heads.",
        "", "| first iteration that moves no centroid | (utterance, head, layer) | share |", "|---|---:|---:|",
    ]
    total = sum(hist.values())
    for it, n in sorted(hist.items(), key=lambda kv: (kv[0] < 0, kv[0])):
        label = str(it) if it > 0 else f"none of the {args.iterations}"
        lines.append(f"| {label} | {n} | {100 * n / max(1, total):.1f} % |")
    if sweeps:
        lines += ["", f"Sequences of at least C = {args.clusters} positions: the one-launch Triton K-means "
                  f"runs {100 * sum(sweeps) / len(sweeps) / passes:.0f} % of its {passes} sweeps on average "
                  f"(the C++ kernel as many iterations, then its final assignment)."]
    if short:
        lines += ["Shorter ones (one centroid a position), first still iteration: "
                  + ", ".join(f"{it}: {n}" for it, n in sorted(short.items())) + "."]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.out.exists():
        args.out.write_text("# K-means iterations a trained model's queries need\n\n"
                            "`python benchmarks/kmeans_convergence.py`: see its docstring.\n")
    with args.out.open("a") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
