"""Peak training memory of finished runs, each measured alone in a fresh process.

    python -m benchmarks.step.peak_memory outputs/budget/table2/runs/full-L6 outputs/budget/table2/runs/lsh-4-L6 ...
        [--steps 3] [--out benchmarks/results/peak_memory_<machine>.md]

For each run directory, its saved ``config.yaml`` is trained again for ``--steps`` updates in a
fresh process, in a scratch run directory (the run itself is not touched; no test, no final
decoding, no loggers): the callbacks first run forward + backward on the largest training batches
(``LargestBatchProbe``), which is where a run's memory peaks, then a few ordinary updates. The
peak is ``fastasr.training.callbacks.peak_memory_mb`` at the end: the process's resident high-water mark
on a CPU (``ru_maxrss``), the allocator's peak on a GPU. The model, data loading and the
libraries are in it, as they are in a training run's.

One process per run, so that no run's peak carries into another's: a study that trains its
members in one process logs, on code older than ``fastasr.training.callbacks.reset_peak_memory``, each
member's peak as the largest so far. Runs are measured one after the other; run it on a quiet
machine. Writes a Markdown table (run, attention, layers, peak MB) with the machine and date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import bench_io

ROOT = Path(__file__).resolve().parents[2]
RESULT_PREFIX = "PEAK "


def measure(run_dir: Path, steps: int) -> dict:
    """Train ``run_dir``'s config for ``steps`` updates in this process; the peak memory (MB)."""
    from omegaconf import OmegaConf

    from fastasr.training.callbacks import peak_memory_mb
    from fastasr.training.fit import train

    cfg = OmegaConf.load(run_dir / "config.yaml")
    with tempfile.TemporaryDirectory(prefix="peak-memory-") as scratch:
        overrides = {"trainer.max_steps": steps, "trainer.max_epochs": -1, "trainer.max_time": None,
                     "trainer.val_check_interval": None, "trainer.limit_val_batches": 0, "test": False,
                     "ckpt_path": None, "final_average": None, "final_tuning": None, "logger": {},
                     "paths.run_dir": scratch}
        for key, value in overrides.items():
            OmegaConf.update(cfg, key, value, force_add=True)
        train(cfg, run_dir=scratch)
    return {"run": str(run_dir), "attention": str(cfg.model.attention), "layers": int(cfg.model.layers),
            "peak_mb": peak_memory_mb(None)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories holding config.yaml")
    p.add_argument("--steps", type=int, default=3, help="ordinary updates after the largest batches")
    p.add_argument("--out", type=Path, help="Markdown table (default: benchmarks/results/peak_memory_<machine>.md)")
    p.add_argument("--machine", help="name in the result file (default: CPU model and cores)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:  # one run, in this fresh process
        sys.path.insert(0, str(ROOT / "src"))
        print(RESULT_PREFIX + json.dumps(measure(args.runs[0], args.steps)), flush=True)
        return 0
    missing = [str(r) for r in args.runs if not (r / "config.yaml").is_file()]
    if missing:
        p.error(f"no config.yaml in {', '.join(missing)}: expected run directories of train.py")
    rows = []
    for run in args.runs:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.step.peak_memory", str(run), "--child", "--steps", str(args.steps)],
                              capture_output=True, text=True, cwd=ROOT)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
        if proc.returncode != 0 or not lines:
            print(f"{run}: failed (exit {proc.returncode})\n{proc.stderr[-3000:]}", file=sys.stderr)
            rows.append({"run": str(run), "error": f"exit {proc.returncode}"})
            continue
        rows.append(json.loads(lines[-1][len(RESULT_PREFIX):]))
        print(f"{run}: {rows[-1]['peak_mb']:,.0f} MB", flush=True)
    machine = args.machine or bench_io.machine_info("cpu")["slug"]
    out = args.out or ROOT / "benchmarks" / "results" / f"peak_memory_{machine}.md"
    lines = [f"# Peak training memory, one fresh process per run ({machine})", "",
             f"- command: `python -m benchmarks.step.peak_memory {' '.join(str(r) for r in args.runs)} --steps {args.steps}`",
             f"- date {datetime.date.today().isoformat()}, commit {bench_io.git_commit(ROOT)}; 1-min load average {bench_io.load_average()} at the end",
             "- peak: resident high-water mark of the process (CPU) after the largest training batches' "
             f"forward + backward and {args.steps} updates; model, data loading and libraries included", "",
             "| run | attention | layers | peak memory (MB) |", "| --- | --- | ---: | ---: |"]
    for r in rows:
        peak = f"{r['peak_mb']:,.0f}" if "peak_mb" in r else r["error"]
        lines.append(f"| {Path(r['run']).name} | {r.get('attention', '')} | {r.get('layers', '')} | {peak} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
    return 0 if all("peak_mb" in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
