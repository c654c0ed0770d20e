"""The matrix on wandb: one run per invocation holding the cells as a table, the heatmap,
and each ``ok`` cell's unit error in the summary (``matrix/<train>/<eval>``).

:func:`log_study` is the generic part (one wandb run: a table, images, summary numbers), which
the budget study (:mod:`fastasr.studies.budget`) logs through too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from fastasr.studies.matrix.cells import CSV_COLUMNS, OK, PNG_FILE, Cells, ordered
from fastasr.training.loggers import finish_wandb


def log_study(
    mode: str | None, *, project: str, name: str, job_type: str, run_root: Path, config: Mapping[str, Any],
    table_key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]],
    images: Mapping[str, Path] | None = None, summary: Mapping[str, float] | None = None,
) -> Path | None:
    """Log one study as its own wandb run in ``mode`` (offline | online; ``disabled`` or empty:
    nothing): ``rows`` as the table ``table_key``, each existing image file of ``images`` under
    its key, ``summary`` in the run summary. The run's files go under ``run_root/wandb``.
    Returns the wandb run directory, None when disabled."""
    if not mode or mode == "disabled":
        return None
    import wandb

    finish_wandb()
    run = wandb.init(project=project, name=name, job_type=job_type, dir=str(run_root), mode=mode,
                     config=dict(config), settings=wandb.Settings(silent=True))
    try:
        logged: dict[str, Any] = {table_key: wandb.Table(columns=list(columns), data=[list(r) for r in rows])}
        for key, path in (images or {}).items():
            if Path(path).is_file():
                logged[key] = wandb.Image(str(path))
        run.log(logged)
        for key, value in (summary or {}).items():
            run.summary[key] = value
        run_dir = Path(run.dir).parent
    finally:
        run.finish()
    return run_dir


def log_to_wandb(cfg: DictConfig, matrix_dir: Path, cells: Cells) -> Path | None:
    """Log the matrix (``cfg``: the composed cross_eval config) to wandb in
    ``cfg.matrix.wandb`` mode; returns the wandb run directory, None when disabled."""
    train, evals = list(cfg.matrix.train), list(cfg.matrix.eval)
    rows = [[c.to_row()[k] for k in CSV_COLUMNS] for c in ordered(cells, train, evals)]
    summary = {f"matrix/{c.train}/{c.eval}": c.unit_error for c in cells.values()
               if c.status == OK and c.unit_error is not None}
    return log_study(
        cfg.matrix.get("wandb"), project=cfg.matrix.get("wandb_project", "fastasr"),
        name=f"matrix-{cfg.matrix.name}", job_type="cross_eval", run_root=matrix_dir,
        config={"matrix": OmegaConf.to_container(cfg.matrix, resolve=True)},
        table_key="matrix/table", columns=CSV_COLUMNS, rows=rows,
        images={"matrix/heatmap": matrix_dir / PNG_FILE}, summary=summary,
    )
