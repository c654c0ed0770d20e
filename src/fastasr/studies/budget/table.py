"""The study's table: one row per member in ``budget.csv``, every validation in
``budget_curves.csv``, and the Pareto front of best dev error against forward time."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from fastasr.studies.budget.curves import CurvePoint, first_reaching

CSV_FILE = "budget.csv"
CURVES_FILE = "budget_curves.csv"
MD_FILE = "budget.md"
TIME_PNG = "budget_time.png"
FORWARD_PNG = "budget_forward.png"

OK, FAILED, MISSING = "ok", "failed", "missing"


@dataclass
class BudgetRow:
    """One member of the study (a row of budget.csv). Times in seconds, errors in percent.

    ``metric``: ``per`` (or ``cer``); ``best_dev`` / ``final_dev``: its lowest and its last
    dev value; ``best_at_seconds``: training time of the best; ``train_seconds``, ``epochs``
    (fractional), ``updates``: where training ended; ``seconds_per_epoch`` =
    ``train_seconds / epochs`` (validation included); ``seconds_per_later_epoch``: the same after
    the first epoch (:func:`~fastasr.studies.budget.curves.later_epoch_seconds`: without its
    start-up; None where less than half an epoch followed it); ``forward_seconds``: the fastest forward
    pass over ``forward_split`` (``forward_utterances`` utterances, ``forward_frames`` frames);
    ``forward_seconds_epoch``: scaled to the training set (:mod:`fastasr.studies.budget.forward`);
    ``checkpoint`` / ``train_step``: what was timed (the timing is reused while they are unchanged);
    ``peak_memory_mb``: the largest peak memory the run logged (``perf/peak_memory_mb``: the
    process's peak RSS on a CPU, the allocator's peak on a GPU); ``test``: the test error of the
    best checkpoint when the members are tested (``test=true``); ``to_target_seconds``: training
    time at which the dev error first reached the study's common target
    (:func:`mark_time_to_target`).
    """

    member: str
    attention: str
    layers: int
    status: str = MISSING
    metric: str = "per"
    best_dev: float | None = None
    final_dev: float | None = None
    best_at_seconds: float | None = None
    train_seconds: float | None = None
    epochs: float | None = None
    updates: int | None = None
    seconds_per_epoch: float | None = None
    seconds_per_later_epoch: float | None = None
    forward_seconds_epoch: float | None = None
    forward_seconds: float | None = None
    forward_split: str | None = None
    forward_utterances: int | None = None
    forward_frames: int | None = None
    forward_repeats: int | None = None
    parameters: int | None = None
    pareto: bool = False
    checkpoint: str | None = None
    train_step: int | None = None
    peak_memory_mb: float | None = None
    test: float | None = None
    to_target_seconds: float | None = None
    reason: str = ""

    def to_row(self) -> dict[str, str]:
        out = {}
        for key, value in asdict(self).items():
            if value is None:
                out[key] = ""
            elif isinstance(value, bool):
                out[key] = "true" if value else ""
            elif isinstance(value, float):
                out[key] = f"{value:.6g}"
            else:
                out[key] = str(value)
        return out

    @classmethod
    def from_row(cls, row: Mapping[str, str]) -> BudgetRow:
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            raw = row.get(f.name, "")
            kind = str(f.type)
            if f.name == "pareto":
                kwargs[f.name] = raw == "true"
            elif raw in ("", None):
                if "None" in kind:
                    kwargs[f.name] = None
                elif f.name == "layers":
                    kwargs[f.name] = 0
                elif f.name in ("member", "attention"):
                    kwargs[f.name] = ""
            elif kind.startswith("int"):
                kwargs[f.name] = int(float(raw))
            elif kind.startswith("float"):
                kwargs[f.name] = float(raw)
            else:
                kwargs[f.name] = raw
        return cls(**kwargs)


CSV_COLUMNS = tuple(f.name for f in fields(BudgetRow))
CURVE_COLUMNS = ("member", "attention", "layers", "train_seconds", "epochs", "updates", "metric", "dev")


def read_rows(path: str | Path) -> dict[str, BudgetRow]:
    """The rows of a budget.csv by member (empty when there is no file)."""
    path = Path(path)
    if not path.is_file():
        return {}
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if "member" not in (reader.fieldnames or ()):
            raise ValueError(f"{path}: not a budget.csv (no column member)")
        rows = [BudgetRow.from_row(r) for r in reader]
    return {r.member: r for r in rows}


def _write_csv(path: Path, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns))
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)  # atomic: a kill never leaves half a file


def write_rows(path: str | Path, rows: Iterable[BudgetRow]) -> None:
    """Write budget.csv atomically."""
    _write_csv(Path(path), CSV_COLUMNS, (r.to_row() for r in rows))


def write_curves(path: str | Path, rows: Sequence[BudgetRow], curves: Mapping[str, Sequence[CurvePoint]]) -> None:
    """Write budget_curves.csv: one line per validation of every member, in training order."""
    lines = []
    for row in rows:
        for p in curves.get(row.member, ()):
            lines.append({"member": row.member, "attention": row.attention, "layers": row.layers,
                          "train_seconds": f"{p.train_seconds:.6g}", "epochs": f"{p.epochs:.6g}",
                          "updates": p.updates, "metric": row.metric, "dev": f"{p.dev:.6g}"})
    _write_csv(Path(path), CURVE_COLUMNS, lines)


def _point(row: BudgetRow) -> tuple[float, float] | None:
    if row.status != OK or row.forward_seconds_epoch is None or row.best_dev is None:
        return None
    x, y = row.forward_seconds_epoch, row.best_dev
    return (x, y) if math.isfinite(x) and math.isfinite(y) else None


def mark_pareto(rows: Sequence[BudgetRow]) -> list[BudgetRow]:
    """Set ``pareto`` on every row no other row dominates (another is at least as fast per epoch
    forward *and* at least as accurate, better in one); returns the front, fastest first."""
    points = {r.member: _point(r) for r in rows}
    front = []
    for r in rows:
        p = points[r.member]
        r.pareto = p is not None and not any(
            q is not None and q[0] <= p[0] and q[1] <= p[1] and q != p
            for m, q in points.items() if m != r.member)
        if r.pareto:
            front.append(r)
    return sorted(front, key=lambda r: (r.forward_seconds_epoch, r.best_dev))


def mark_time_to_target(rows: Sequence[BudgetRow], curves: Mapping[str, Sequence[CurvePoint]]) -> float | None:
    """The common dev target — the highest of the finished members' best dev errors, the lowest
    error every one of them reached — and, on each finished row, ``to_target_seconds``: the
    training time of its first validation at or below it (the paper's Table 2 convergence
    time, with a target every member attains). None (and nothing set) with no finished member."""
    finished = [r for r in rows if r.status == OK and r.best_dev is not None]
    if not finished:
        return None
    target = max(r.best_dev for r in finished)
    for r in finished:
        reached = first_reaching(list(curves.get(r.member, ())), target)
        r.to_target_seconds = reached.train_seconds if reached else None
    return target
