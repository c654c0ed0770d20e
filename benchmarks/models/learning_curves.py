"""Validation learning curves of several runs: a Markdown table and a PNG.

    python -m benchmarks.models.learning_curves outputs/runs/A outputs/runs/B ... \
        [--at 100 200 400 800] [--minutes 5 10 15] [--png curves.png] [--label A=name ...]

Reads each run's CSV log (``logger=csv`` or ``logger=default``) and prints one row a run:
the unit error rate (val CER, or PER for phoneme models) at the last validation at or before
each update count of ``--at`` and after each number of training minutes of ``--minutes``
(the epochs' summed ``perf/epoch_seconds``: training time, validation passes not counted), the
update at which it first fell below 90 % (out of CTC's blank plateau), and the best value with
its WER, update and epoch. ``--png`` draws the unit error rate against updates, epochs (data
seen) and training minutes, one line a run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from fastasr.studies.report import read_metrics

PLATEAU_EXIT = 90.0  # %: a run has left the blank plateau once its unit error rate is below this


def unit_key(rows: Sequence[Mapping[str, float]]) -> str:
    """``val/per`` or ``val/cer``, whichever the run logged."""
    return "val/per" if any("val/per" in r for r in rows) else "val/cer"


def validations(rows: Sequence[Mapping[str, float]]) -> list[dict[str, float]]:
    """One ``{step, epoch, minutes, uer, wer}`` per validation, in order (steps as logged:
    updates done; minutes: training time of the epochs up to and including this one)."""
    key = unit_key(rows)
    seconds = {r["epoch"]: r["perf/epoch_seconds"] for r in rows if "perf/epoch_seconds" in r and "epoch" in r}
    points = []
    for r in rows:
        if key in r and "step" in r:
            epoch = r.get("epoch", float("nan"))
            minutes = sum(v for e, v in seconds.items() if e <= epoch) / 60 if seconds else float("nan")
            points.append({"step": r["step"], "epoch": epoch, "minutes": minutes, "uer": r[key],
                           "wer": r.get("val/wer", float("nan"))})
    return points


def at_update(points: Sequence[Mapping[str, float]], update: float, x: str = "step") -> float | None:
    """The unit error rate of the last validation at or before ``update`` (of ``x``: ``step``
    or ``minutes``); None if none yet or the run stopped before it."""
    before = [p for p in points if p[x] <= update]
    if not before or points[-1][x] < update:
        return None
    return before[-1]["uer"]


def summary_row(label: str, points: Sequence[Mapping[str, float]], ats: Sequence[int],
                minutes: Sequence[float] = ()) -> list[str]:
    """Table cells of one run (see the module docstring)."""
    cells = [label]
    for n, x in [(n, "step") for n in ats] + [(m, "minutes") for m in minutes]:
        v = at_update(points, n, x)
        cells.append("–" if v is None else f"{v:.1f}")
    exit_step = next((p["step"] for p in points if p["uer"] < PLATEAU_EXIT), None)
    cells.append("–" if exit_step is None else f"{exit_step:.0f}")
    if points:
        best = min(points, key=lambda p: p["uer"])
        cells.append(f"{best['uer']:.1f} / {best['wer']:.1f} @ {best['step']:.0f} (ep {best['epoch']:.0f})")
        cells.append(f"{points[-1]['step']:.0f}")
    else:
        cells += ["–", "0"]
    return cells


def markdown_table(runs: Mapping[str, Sequence[Mapping[str, float]]], ats: Sequence[int], unit: str,
                   minutes: Sequence[float] = ()) -> str:
    header = ["run", *[f"{unit} @ {n}" for n in ats], *[f"{unit} @ {m:g} min" for m in minutes], "< 90 % at",
              f"best {unit} / WER @ update", "updates"]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(["---"] + ["---:"] * (len(header) - 1)) + " |"]
    lines += ["| " + " | ".join(summary_row(label, pts, ats, minutes)) + " |" for label, pts in runs.items()]
    return "\n".join(lines)


def plot(runs: Mapping[str, Sequence[Mapping[str, float]]], unit: str, path: Path) -> None:
    """Unit error rate against updates (left) and epochs (right), one line a run, to ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4))
    FigureCanvasAgg(fig)
    for i, x in enumerate(("step", "epoch", "minutes")):
        ax = fig.add_subplot(1, 3, i + 1)
        for label, pts in runs.items():
            ax.plot([p[x] for p in pts], [p["uer"] for p in pts], label=label, marker="o", markersize=2,
                    linewidth=1.1)
        ax.set_xlabel({"step": "updates", "epoch": "epochs (data seen)", "minutes": "training minutes"}[x])
        ax.set_ylabel(f"val {unit} (%)")
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
        if i == 0:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (outputs/runs/<name>)")
    ap.add_argument("--at", nargs="+", type=int, default=[100, 200, 400, 600, 800, 1000, 1500])
    ap.add_argument("--minutes", nargs="*", type=float, default=[], help="also at these training minutes")
    ap.add_argument("--png", type=Path, help="write the curves here")
    ap.add_argument("--label", nargs="*", default=[], help="RUN_DIR_NAME=label")
    args = ap.parse_args(argv)
    labels = dict(item.split("=", 1) for item in args.label)
    runs, unit = {}, "CER"
    for run_dir in args.runs:
        rows = read_metrics(run_dir)
        if not rows:
            print(f"{run_dir}: no csv/version_*/metrics.csv", file=sys.stderr)
            continue
        unit = unit_key(rows).split("/")[1].upper()
        runs[labels.get(run_dir.name, run_dir.name)] = validations(rows)
    if not runs:
        return 1
    print(markdown_table(runs, args.at, unit, args.minutes))
    if args.png:
        plot(runs, unit, args.png)
        print(f"\n{args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
