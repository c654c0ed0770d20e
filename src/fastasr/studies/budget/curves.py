"""A member's dev-error-against-training-time curve, read back from its CSV logs
(``csv/version_*/metrics.csv``: one version per start of the run, so a resumed run has several).

Each validation row holds the validation metrics and :class:`~fastasr.studies.budget.clock.TrainingClock`'s
``budget/train_seconds``, ``budget/epochs`` and ``budget/updates``. When a run was resumed,
the validations an earlier version logged at or after the update the next version resumed
from are dropped: they belong to a history that was rolled back.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from fastasr.rundir import RunDir
from fastasr.studies.budget.clock import EPOCHS, TRAIN_SECONDS, UPDATES


@dataclass(frozen=True)
class CurvePoint:
    """One validation: training time (s), epochs and updates so far, and the dev error (%)."""

    train_seconds: float
    epochs: float
    updates: int
    dev: float


def _number(value: str | None) -> float | None:
    if value in (None, ""):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _version_points(path: Path, metric: str) -> tuple[list[CurvePoint], int | None]:
    """The points of one metrics.csv, and the smallest step it logged (None: no row)."""
    points, first_step = [], None
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            step = _number(row.get("step"))
            if step is not None:  # every row of a resumed version lies at or after the update it resumed from
                first_step = int(step) if first_step is None else min(first_step, int(step))
            dev, seconds = _number(row.get(f"val/{metric}")), _number(row.get(TRAIN_SECONDS))
            if dev is None or seconds is None:
                continue
            points.append(CurvePoint(seconds, _number(row.get(EPOCHS)) or 0.0,
                                     int(_number(row.get(UPDATES)) or 0), dev))
    return points, first_step


def read_curve(run_dir: str | Path, metric: str = "per") -> list[CurvePoint]:
    """Every validation of a run (``metric``: ``per`` or ``cer``), in training order. Points
    without the clock's columns (a run trained without TrainingClock) are not included."""
    versions = [_version_points(p, metric) for p in RunDir(run_dir).metrics_files()]
    curve: list[CurvePoint] = []
    for i, (points, _) in enumerate(versions):
        later_starts = [start for _, start in versions[i + 1:] if start is not None]
        cut = min(later_starts) if later_starts else None
        curve += [p for p in points if cut is None or p.updates <= cut]
    return sorted(curve, key=lambda p: (p.updates, p.train_seconds))


#: The least part of an epoch that must follow the first for :func:`later_epoch_seconds`.
LATER_EPOCHS_AT_LEAST = 0.5


def later_epoch_seconds(curve: list[CurvePoint]) -> float | None:
    """Training seconds an epoch after the first: from the validation that ends the first epoch
    (the first at 1 epoch or more) to the last, over the epochs between; None where less than
    :data:`LATER_EPOCHS_AT_LEAST` of an epoch followed it. Time per epoch without the first
    epoch's start-up (data loaders' first batches, a GPU's kernels compiled and tuned)."""
    first = next((p for p in curve if p.epochs >= 1), None)
    if first is None or curve[-1].epochs - first.epochs < LATER_EPOCHS_AT_LEAST:
        return None
    return (curve[-1].train_seconds - first.train_seconds) / (curve[-1].epochs - first.epochs)


def best_point(curve: list[CurvePoint]) -> CurvePoint | None:
    """The validation with the lowest dev error (the earliest of equals), None for an empty curve."""
    return min(curve, key=lambda p: (p.dev, p.train_seconds)) if curve else None


def logged_values(run_dir: str | Path, column: str) -> list[float]:
    """Every finite value a run logged in ``column`` of its CSV logs (all versions, in file
    order): ``perf/peak_memory_mb`` for its peak memory, ``test/per`` for its test error."""
    values = []
    for path in RunDir(run_dir).metrics_files():
        with path.open(newline="") as f:
            values += [v for row in csv.DictReader(f) if (v := _number(row.get(column))) is not None]
    return values


def first_reaching(curve: list[CurvePoint], target: float) -> CurvePoint | None:
    """The first validation whose dev error is at or below ``target`` (None: never)."""
    return next((p for p in curve if p.dev <= target), None)
