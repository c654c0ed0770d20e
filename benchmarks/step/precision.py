"""One training step of a recipe's model in float32 and under bfloat16 autocast, on the CPU.

    python -m benchmarks.step.precision                      # data=manifest: the recorded-speech recipe's model
    python -m benchmarks.step.precision --overrides data=synthetic --lengths 300
    python -m benchmarks.step.precision --lengths 300 1300 --frames 12000 --rounds 5
    python -m benchmarks.step.precision --profile bf16-mixed --lengths 1300 --frames 16000   # where a step's time goes

What ``trainer.precision`` costs per update: ``32-true`` against ``bf16-mixed`` (the value
``trainer.precision: auto`` takes where the CPU multiplies bfloat16 natively,
:func:`fastasr.training.derived_config.auto_precision`). The model is the one ``python train.py
<overrides>`` trains (its ``model`` config composed by Hydra; 40 characters of output, the
features' bins in), built twice from one seed. A step is ``step/cpu.py Stepper``'s, what training
does with one batch: forward (under ``torch.autocast("cpu", torch.bfloat16)`` for bf16, as
Lightning's ``bf16-mixed`` runs it), CTC, backward, gradient clipping at 10 and a RAdam update
with training's weight decay, with SpecAugment on. Each batch holds ``--frames`` 10-ms frames of
random filterbanks: ``B = frames // N`` utterances of ``N`` frames, the last ``N // 2`` long, with
``N // 12`` random targets each. Each round times both precisions once, in alternating order,
after a warm-up step each; the table has the medians over ``--rounds`` rounds and their ratio. Writes
``benchmarks/results/precision_step_<machine>.{md,json}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

from benchmarks import bench_io
from benchmarks.step.cpu import (  # one training step for all the step benchmarks
    Stepper,
    make_batch,
    profile_step,
)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.utils import instantiate  # noqa: E402

import fastasr.config  # noqa: E402,F401  (PROJECT_ROOT for conf/paths)
from fastasr.training.derived_config import native_bf16  # noqa: E402

PRECISIONS = ("32-true", "bf16-mixed")
VOCAB = 40


def model_config(overrides: list[str]):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    return cfg.model, int(cfg.features.num_mel_bins)


def build_stepper(model_cfg, feat_in: int, precision: str) -> Stepper:
    torch.manual_seed(0)
    model = instantiate(model_cfg)(vocab_size=VOCAB, feat_in=feat_in).train()
    return Stepper(model, bf16=precision == "bf16-mixed")


def measure(args) -> list[dict]:
    model_cfg, feat_in = model_config(args.overrides)
    rows = []
    for n in args.lengths:
        batch = make_batch(n, args.frames, feat_in=feat_in, vocab=VOCAB, frames_per_target=12)
        steppers = {p: build_stepper(model_cfg, feat_in, p) for p in PRECISIONS}
        for s in steppers.values():
            s.step(batch)
        times: dict[str, list[float]] = {p: [] for p in PRECISIONS}
        for r in range(args.rounds):
            for p in (PRECISIONS if r % 2 == 0 else PRECISIONS[::-1]):
                times[p].append(steppers[p].step(batch))
        med = {p: statistics.median(t) for p, t in times.items()}
        rows.append({"n": n, "batch": batch[0].shape[0], **{f"{p}_s": med[p] for p in PRECISIONS},
                     "times": times, "ratio": med["bf16-mixed"] / med["32-true"]})
        print(f"N={n} B={batch[0].shape[0]}: " + " ".join(f"{p}={med[p]:.3f}s" for p in PRECISIONS)
              + f" ratio {rows[-1]['ratio']:.2f}", flush=True)
    return rows


def profile(args) -> str:
    """The ops of one step in ``args.profile`` precision by self CPU time (torch.profiler), per N."""
    model_cfg, feat_in = model_config(args.overrides)
    return "\n".join(profile_step(build_stepper(model_cfg, feat_in, args.profile),
                                   make_batch(n, args.frames, feat_in=feat_in, vocab=VOCAB, frames_per_target=12),
                                   args.profile, args.top) for n in args.lengths)


def write_table(rows: list[dict], args, info: dict, load_before: str, load_after: str) -> Path:
    stem = bench_io.result_stem(args.out_dir, "precision_step", info)
    lines = [
        "# One training step of a recipe's model: float32 against bfloat16 autocast (CPU)",
        "",
        bench_io.command_line("step/precision.py"),
        "",
        f"{datetime.date.today()}, {info['cpu']}, {info['cores']} cores, {args.threads} torch threads, "
        f"torch {info['torch']}, native bfloat16: {native_bf16('cpu')}; load average {load_before} before, "
        f"{load_after} after. Model: `python train.py {' '.join(args.overrides)}`'s; a step is forward, CTC, "
        f"backward, clipping and RAdam on {args.frames} frames (B = {args.frames} // N, the last utterance "
        f"N / 2). Median of {args.rounds} interleaved rounds.",
        "",
        "| N frames (batch) | 32-true | bf16-mixed | bf16 / fp32 |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['n']} ({r['batch']}) | {r['32-true_s']:.3f} s | {r['bf16-mixed_s']:.3f} s | "
                     f"{r['ratio']:.2f} |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    stem.with_suffix(".json").write_text(json.dumps({"machine": info, "args": vars(args), "rows": rows}, indent=1))
    return stem.with_suffix(".md")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--overrides", nargs="*", default=["data=manifest"], help="train.py overrides choosing the model")
    p.add_argument("--lengths", type=int, nargs="+", default=[300, 1300], help="frames N per utterance (10 ms)")
    p.add_argument("--frames", type=int, default=12000, help="frames a batch (B = frames // N)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (the median counts)")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--profile", choices=PRECISIONS, default=None,
                   help="print one step's ops in this precision by self CPU time instead of timing")
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
