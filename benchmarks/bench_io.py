"""Helpers shared by the benchmark scripts (run as `python benchmarks/<script>.py`)."""

from __future__ import annotations

import csv
from dataclasses import asdict
from pathlib import Path


def is_oom(exc: BaseException) -> bool:
    """True for an out-of-memory error (CUDA or host); torch is imported lazily so a script
    can set TRITON_INTERPRET etc. before torch loads."""
    import torch

    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in str(exc).lower()


def write_csv(rows: list, path: Path, digits: int) -> None:
    """Write dataclass ``rows`` to ``path``, floats with ``digits`` significant digits."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.{digits}g}" if isinstance(v, float) else v) for k, v in asdict(r).items()})
