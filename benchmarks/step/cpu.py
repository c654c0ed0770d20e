"""One training step of the paper's model at long lengths: each attention against the floor.

    python -m benchmarks.step.cpu                                  # N = 800, 1600, 3200; 12,000 frames a batch
    python -m benchmarks.step.cpu --lengths 800 3200 --rounds 5 --layers 9
    python -m benchmarks.step.cpu --profile i-clustered-100 --lengths 800   # where the step's time goes
    python -m benchmarks.step.cpu --torch-dropout                  # + the floor with torch's one-thread dropout

The model is the clustered-attention paper's (6 heads × 32 = 192, feed-forward 768, fixed
sinusoidal positions, no subsampling, dropout 0.1; ``--layers`` 9 as for WSJ), built through the
public API (:class:`fastasr.model.CTCModel`). A step is what training does with one batch:
forward, CTC loss, backward, gradient clipping at 10 and a RAdam update. Each batch holds
``--frames`` frames: ``B = frames // N`` utterances of ``N`` frames of 40-d filterbanks, the last
one ``N // 2`` long (so the padding paths run), with random targets of ``N // 8`` units.

The *floor* is the same step with the inner attention replaced by the identity (each position's
output is its own value vector): projections, feed-forward, layer norms, CTC and optimiser
without attention. Everything runs in one process on ``--threads`` torch threads; each round
times every variant once, in turn (interleaved), after a warm-up step each, and the table shows
the median over ``--rounds`` rounds with the ratios to full attention and to the floor from those
medians. Writes ``benchmarks/results/step_time_<machine>.{md,json}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

from benchmarks import bench_io, timing

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from fastasr.kernels.layers.dropout import GeluDropout  # noqa: E402
from fastasr.model import CTCModel  # noqa: E402

FLOOR = "floor"
#: --torch-dropout: the floor once more with torch's own (one-thread) dropout in place of
#: fastasr.kernels.layers.dropout's, to price the dropout mask.
FLOOR_TORCH_DROPOUT = "floor, torch dropout"
DEFAULT_ATTENTIONS = ("full", "clustered-100", "i-clustered-100")


class IdentityAttention(nn.Module):
    """The floor's inner attention: each query position gets its own value (no attention cost)."""

    spec = FLOOR

    def forward(self, q, k, v, lengths=None):
        return v


def build_model(attention: str, layers: int, seed: int = 0) -> CTCModel:
    torch.manual_seed(seed)
    floor = attention in (FLOOR, FLOOR_TORCH_DROPOUT)
    model = CTCModel(vocab_size=48, feat_in=40, d_model=192, heads=6, ff_dim=768, layers=layers, dropout=0.1,
                     attention="full" if floor else attention, subsampling=1, positions="absolute")
    if floor:
        for layer in model.attention_layers():
            layer.inner = IdentityAttention()
    if attention == FLOOR_TORCH_DROPOUT:
        for module in list(model.modules()):
            for name, child in module.named_children():
                if isinstance(child, GeluDropout):  # the feed-forward's GELU and its dropout
                    setattr(module, name, nn.Sequential(nn.GELU(), nn.Dropout(child.p)))
                elif isinstance(child, nn.Dropout):
                    setattr(module, name, nn.Dropout(child.p))
    return model.train()


def make_batch(n: int, frames: int, seed: int = 0, feat_in: int = 40, vocab: int = 48,
               frames_per_target: int = 8) -> tuple[torch.Tensor, ...]:
    """``B = frames // n`` utterances of ``n`` frames of ``feat_in`` random features (the last one
    ``n // 2``) and ``n // frames_per_target`` random targets in ``[1, vocab)`` each."""
    g = torch.Generator().manual_seed(seed)
    b = max(1, frames // n)
    feats = torch.randn(b, n, feat_in, generator=g)
    lengths = torch.full((b,), n, dtype=torch.long)
    if b > 1:
        lengths[-1] = n // 2
    targets = torch.randint(1, vocab, (b, n // frames_per_target), generator=g)
    target_lengths = torch.full((b,), n // frames_per_target, dtype=torch.long)
    return feats, lengths, targets, target_lengths


class Stepper:
    """A model and its optimiser; :meth:`step` is one training step on ``batch``: forward (under
    CPU bfloat16 autocast when ``bf16``, as Lightning's ``bf16-mixed`` runs it), CTC, backward,
    gradient clipping at 10 and a RAdam update with training's weight decay."""

    def __init__(self, model: nn.Module, bf16: bool = False):
        self.model = model
        self.optim = torch.optim.RAdam(self.model.parameters(), lr=1e-4, weight_decay=0.01)
        self.bf16 = bf16

    def step(self, batch) -> float:
        feats, lengths, targets, target_lengths = batch
        t0 = timing.Clock()
        self.optim.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            log_probs, out_lengths = self.model(feats, lengths)
        loss = nn.functional.ctc_loss(log_probs.transpose(0, 1), targets, out_lengths, target_lengths,
                                      blank=0, reduction="mean", zero_infinity=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), 10.0)
        self.optim.step()
        return t0.seconds()


def _variants(args) -> list[str]:
    return list(args.attentions) + [FLOOR] + ([FLOOR_TORCH_DROPOUT] if args.torch_dropout else [])


def measure(args) -> list[dict]:
    rows = []
    variants = _variants(args)
    for n in args.lengths:
        batch = make_batch(n, args.frames)
        steppers = {a: Stepper(build_model(a, args.layers)) for a in variants}
        for s in steppers.values():  # warm-up: allocator, kernel caches, the positions table
            s.step(batch)
        times: dict[str, list[float]] = {a: [] for a in variants}
        for r in range(args.rounds):
            order = variants if r % 2 == 0 else variants[::-1]  # interleaved, alternating order
            for a in order:
                times[a].append(steppers[a].step(batch))
        med = {a: statistics.median(t) for a, t in times.items()}
        for a in variants:
            rows.append({"n": n, "batch": batch[0].shape[0], "attention": a, "median_s": med[a],
                         "min_s": min(times[a]), "max_s": max(times[a]),
                         "to_full": med[a] / med["full"] if "full" in med else None,
                         "to_floor": med[a] / med[FLOOR]})
        print(" ".join(f"{a}={med[a]:.2f}s" for a in variants), f"(N={n})", flush=True)
    return rows


def profile_step(stepper: Stepper, batch, label: str, top: int) -> str:
    """One step of ``stepper`` on ``batch`` after a warm-up step, its ops by self CPU time
    (torch.profiler), as a markdown heading and table; shared with step/precision.py."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    stepper.step(batch)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        total = stepper.step(batch)
    return (f"### {label}, N = {batch[0].shape[1]} (batch {batch[0].shape[0]}), one step {total:.2f} s\n\n"
            "```\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top) + "\n```\n")


def profile(args) -> str:
    """The ops of one step of ``args.profile`` by self CPU time (torch.profiler), per N."""
    return "\n".join(profile_step(Stepper(build_model(args.profile, args.layers)), make_batch(n, args.frames),
                                   args.profile, args.top) for n in args.lengths)


def write_table(rows: list[dict], args, info: dict, load_before: str, load_after: str) -> Path:
    stem = bench_io.result_stem(args.out_dir, "step_time", info)
    variants = _variants(args)
    lines = [
        "# One training step of the paper's model: each attention against the floor",
        "",
        bench_io.command_line("step/cpu.py"),
        "",
        f"{datetime.date.today()}, {info['cpu']}, {info['cores']} cores, {args.threads} torch threads, "
        f"torch {info['torch']}; load average {load_before} before, {load_after} after. Model: {args.layers} "
        "layers of 6 heads × 32, ff 768, no subsampling, dropout 0.1; a step is forward, CTC, backward, "
        f"clipping and RAdam on {args.frames} frames (B = {args.frames} // N, the last utterance N / 2). "
        f"Median of {args.rounds} interleaved rounds (min–max in the JSON); ratios are of those medians. "
        "The floor: the same step with the inner attention replaced by the identity."
        + (" 'floor, torch dropout': the floor with torch's one-thread dropout in place of fastasr's "
           "threaded one (`fastasr.kernels.layers.dropout`), which every other column uses." if args.torch_dropout else ""),
        "",
        "| N (batch) | " + " | ".join(variants) + " |",
        "|---|" + "---:|" * len(variants),
    ]
    for n in args.lengths:
        by = {r["attention"]: r for r in rows if r["n"] == n}
        cells = []
        for a in variants:
            r = by[a]
            ratio = [] if a == FLOOR else [f"{r['to_floor']:.2f}× floor"]
            if a not in ("full", FLOOR, FLOOR_TORCH_DROPOUT) and r["to_full"] is not None:
                ratio.insert(0, f"{r['to_full']:.2f}× full")
            cells.append(f"{r['median_s']:.2f} s" + (f" ({', '.join(ratio)})" if ratio else ""))
        lines.append(f"| {n} ({by[FLOOR]['batch']}) | " + " | ".join(cells) + " |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    stem.with_suffix(".json").write_text(json.dumps({"machine": info, "args": vars(args), "rows": rows}, indent=1))
    return stem.with_suffix(".md")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[800, 1600, 3200], help="frames N per utterance")
    p.add_argument("--frames", type=int, default=12000, help="frames a batch (B = frames // N)")
    p.add_argument("--layers", type=int, default=9, help="encoder depth (paper, WSJ: 9)")
    p.add_argument("--attentions", nargs="+", default=list(DEFAULT_ATTENTIONS), help="spec strings; the floor is added")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (the median counts)")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--torch-dropout", action="store_true",
                   help="add the floor with torch's own dropout (prices fastasr's threaded dropout)")
    p.add_argument("--profile", default=None, help="a spec (or 'floor'): print its step's ops by self CPU time instead")
    p.add_argument("--top", type=int, default=30, help="--profile: rows shown")
    p.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.profile:
        print(profile(args))
        return
    bench_io.measure_and_write(measure, write_table, args)


if __name__ == "__main__":
    main()
