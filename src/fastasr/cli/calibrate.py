"""Measure where improved clustered attention overtakes full attention on this machine.

    fastasr-calibrate                  # writes conf/attention/auto.yaml
    make calibrate-auto                # the same
    python -m fastasr.cli.calibrate    # the same
    fastasr-calibrate --dry-run        # print only

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
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from fastasr.attention.calibrate import GRID, crossover, measure
from fastasr.config import CONFIG_DIR

DEFAULT_YAML = CONFIG_DIR / "attention" / "auto.yaml"


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
    p = argparse.ArgumentParser(prog="fastasr-calibrate", description=__doc__,
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
    config = OmegaConf.to_container(OmegaConf.load(args.yaml))
    clustered = {key: config[key] for key in ("clusters", "bits", "iterations", "topk", "seed")}
    started = time.perf_counter()
    results = {}
    for train in (True, False):
        results[train] = crossover(measure(args.ns, args.tokens, args.heads, args.dim, clustered,
                                           args.repeats, train))
    note = (f"{platform.machine()} with {os.cpu_count()} cores, {torch.get_num_threads()} torch thread(s), H={args.heads} E={args.dim}, "
            f"{args.tokens} tokens per call, {datetime.date.today()}, `fastasr-calibrate`")
    print(f"crossover (training) {results[True]}, crossover_no_grad (decoding) {results[False]} "
          f"({time.perf_counter() - started:.0f} s)")
    if not args.dry_run:
        write_crossovers(args.yaml, results[True], results[False], note)
        print(f"wrote {args.yaml}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
