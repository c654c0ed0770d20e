"""Where each training run's time goes, Lightning action by action: the step's parts (forward
and CTC, backward, the optimiser's step and its hooks), loading the next batch, validation and
checkpoints, side by side for several runs.

    python train.py ... +trainer.profiler=simple       # each run: Lightning's SimpleProfiler
    python -m benchmarks.step.actions outputs/runs/A outputs/runs/B [--tag TAG]
    python -m benchmarks.step.actions outputs/budget/NAME/budget.log   # a study's members

Lightning's ``SimpleProfiler`` (``trainer.profiler=simple``) times every hook and loop action of
a run on the host's clock and writes its report into the run's ``train.log`` when ``fit`` ends;
this script reads those reports (a study's members log theirs into the study's log, one after
another). On a GPU an action's host time includes its waits for the
device: a step's host reads (CTC's lengths, the non-finite check of an eager step) wait for the
work queued before them, so the step's GPU time shows in the action that waits, and launches
the host queues ahead cost only their issue. The table holds, for each run, each action's mean
milliseconds a call, its calls, and its share of the run's training epochs; the actions shown are
the largest of any run (``--top``), the epoch's own line first. Actions nest (the optimiser's
step holds the training step and the backward), so the shares do not add up. Each report's module and callback
class names are dropped (``[LightningModule]CapturingASRLitModule.backward`` is
``module.backward``), so that a captured and an eager run share rows.

Writes ``benchmarks/results/actions_<machine>[_tag].md``.
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks import bench_io

ROOT = Path(__file__).resolve().parents[2]

#: The line that opens a SimpleProfiler report of ``fit`` in a log.
REPORT_START = "FIT Profiler Report"
#: The action that spans each training epoch: the shares are of its total.
EPOCH_ACTION = "run_training_epoch"
_ROW = re.compile(r"^\|\s*(?P<name>[^|]+?)\s*\|\s*[-0-9.e+]+\s*\|\s*(?P<calls>\d+)\s*\|"
                  r"\s*(?P<total>[-0-9.e+]+)\s*\|")  # action | mean | calls | total |
#: A study's line before each member's run (``fastasr.studies.matrix.members``).
_MEMBER = re.compile(r"\] - training (?P<name>\S+) in \S")
_KINDS = {"LightningModule": "module", "Callback": "callback", "Strategy": "strategy",
          "LightningDataModule": "data", "_TrainingEpochLoop": "training loop", "_EvaluationLoop": "evaluation loop"}


@dataclass
class Action:
    """One row of a report: calls and total seconds."""

    calls: int
    total: float

    @property
    def mean(self) -> float:
        """Seconds a call."""
        return self.total / self.calls if self.calls else 0.0


def short_name(name: str) -> str:
    """A report's action without its class: ``[Callback]ThroughputLogger.on_train_batch_end`` is
    ``callback ThroughputLogger.on_train_batch_end``; ``[LightningModule]X.backward`` is
    ``module.backward``; a callback's arguments (``ModelCheckpoint{...}``) are dropped."""
    match = re.match(r"^\[(?P<kind>[^\]]+)\](?P<rest>.*)$", name)
    if match is None:
        return name
    kind, rest = _KINDS.get(match["kind"], match["kind"]), re.sub(r"\{.*\}", "", match["rest"])
    if kind in ("module", "strategy", "data", "training loop", "evaluation loop"):
        return f"{kind}.{rest.rsplit('.', 1)[-1]}"
    return f"{kind} {rest}"


def read_reports(log: str | Path) -> dict[str, dict[str, Action]]:
    """Every ``fit`` SimpleProfiler report in ``log``, by run: a run's ``train.log`` holds one, named
    by its folder; a study's log (``fastasr-budget``'s ``budget.log``, the matrix's) one a member,
    each named by the member's ``training NAME in ...`` line before it. A report is action → row,
    names by :func:`short_name` (rows that share a short name summed; the mean a call derived).

    Raises:
        ValueError: ``log`` holds no report (the run was not started with
            ``+trainer.profiler=simple``, or its ``fit`` did not end).
    """
    path = Path(log)
    lines = path.read_text(errors="replace").splitlines()
    reports: dict[str, dict[str, Action]] = {}
    name = path.parent.name if path.name == "train.log" else path.stem
    for i, line in enumerate(lines):
        member = _MEMBER.search(line)
        if member is not None:
            name = member["name"]
        elif REPORT_START in line:
            reports[name] = _report(lines[i + 1:], f"{log} (report of {name})")
    if not reports:
        raise ValueError(f"{log}: no '{REPORT_START}' (train with +trainer.profiler=simple, and let fit end)")
    return reports


def _report(lines: list[str], where: str) -> dict[str, Action]:
    actions: dict[str, Action] = {}
    for line in lines:
        row = _ROW.match(line.strip())
        if row is None:
            if actions and not line.strip().startswith(("|", "-")):
                break  # the table has ended
            continue
        if row["name"] in ("Action", "Total"):
            continue
        action = actions.setdefault(short_name(row["name"]), Action(0, 0.0))  # several classes' hooks: one row
        action.calls += int(row["calls"])
        action.total += float(row["total"])
    if EPOCH_ACTION not in actions:
        raise ValueError(f"{where}: no '{EPOCH_ACTION}' row")
    return actions


def table(runs: dict[str, dict[str, Action]], top: int) -> list[str]:
    """The markdown table: a row an action (the ``top`` largest totals of any run, the epoch's
    first), a column a run: mean ms a call (calls; share of the training epochs)."""
    largest: dict[str, float] = {}
    for actions in runs.values():
        epoch = actions[EPOCH_ACTION].total
        for key, a in actions.items():
            largest[key] = max(largest.get(key, 0.0), a.total / epoch if epoch else 0.0)
    rows = [EPOCH_ACTION] + sorted((k for k in largest if k != EPOCH_ACTION), key=lambda k: -largest[k])[:top]
    out = ["| action | " + " | ".join(runs) + " |", "|---|" + "---:|" * len(runs)]
    for key in rows:
        cells = []
        for actions in runs.values():
            a, epoch = actions.get(key), actions[EPOCH_ACTION].total
            cells.append("—" if a is None or not epoch else
                         f"{a.mean * 1000:,.2f} ({a.calls:,}; {100 * a.total / epoch:.1f} %)")
        out.append(f"| {key} | " + " | ".join(cells) + " |")
    return out


def this_machine() -> str:
    """The slug of the machine runs train on here: its GPU's where torch sees one, else its CPU's."""
    import torch

    return bench_io.machine_info("cuda" if torch.cuda.is_available() else "cpu")["slug"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run directories (their train.log), run logs or a study's log")
    parser.add_argument("--top", type=int, default=14, help="actions shown besides the epoch's (default 14)")
    parser.add_argument("--tag", default="", help="a suffix of the result's name: actions_<machine>_<tag>.md")
    parser.add_argument("--machine", default=None,
                        help="the machine the runs trained on (default: this one's GPU, else its CPU)")
    parser.add_argument("--runs-made-by", default="",
                        help="how the runs were trained (their command), a line under the table's title")
    parser.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    runs: dict[str, dict[str, Action]] = {}
    for given in args.runs:
        path = Path(given)
        runs.update(read_reports(path / "train.log" if path.is_dir() else path))
    machine = args.machine or this_machine()
    command = " ".join(["python -m benchmarks.step.actions", *args.runs, f"--top {args.top}",
                        *([f"--tag {args.tag}"] if args.tag else [])])
    lines = [f"# Where each run's training time goes, {machine}", "", f"`{command}`", "",
             f"{datetime.date.today()}, commit {bench_io.git_commit(ROOT)}. Lightning's SimpleProfiler "
             "(`+trainer.profiler=simple`) in each run's train.log: mean milliseconds a call of each action, "
             "on the host's clock (on a GPU, an action that waits for the device holds the GPU's time "
             "before it), its calls, and its share of the run's training epochs (validation included).",
             *(["", f"The runs: {args.runs_made_by}"] if args.runs_made_by else []),
             "", *table(runs, args.top), ""]
    out = bench_io.result_stem(args.out_dir, "actions", {"slug": machine})
    out = out.with_name(out.name + (f"_{args.tag}" if args.tag else "") + ".md")
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"written: {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
