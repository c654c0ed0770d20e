"""Helpers shared by the benchmark scripts (run as `python benchmarks/<script>.py`)."""

from __future__ import annotations

import csv
import os
import platform
import re
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


def cpu_info() -> dict:
    """CPU model, usable cores, a file-name slug, torch/Python versions (torch imported lazily)."""
    import torch

    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": cpu,
        "cores": cores,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "slug": re.sub(r"[^a-z0-9]+", "-", f"{cpu}-{cores}c".lower()).strip("-"),
    }


def load_average() -> str:
    """1-minute load average, to show whether other jobs shared the machine."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "n/a"
