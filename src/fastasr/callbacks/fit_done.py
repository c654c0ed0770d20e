"""Reading ``fit_done.json``, the completion marker of a run (no torch/Lightning import)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIT_DONE_FILE = "fit_done.json"


def read_fit_done(run_dir: str | Path) -> dict[str, Any] | None:
    """The ``fit_done.json`` of ``run_dir``, or None when the run has not finished."""
    path = Path(run_dir) / FIT_DONE_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
