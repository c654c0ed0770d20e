"""The matrix on wandb: one run per invocation holding the cells as a table, the heatmap,
and each ``ok`` cell's unit error in the summary (``matrix/<train>/<eval>``)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from fastasr.loggers import finish_wandb
from fastasr.matrix.cells import CSV_COLUMNS, OK, PNG_FILE, Cells, ordered


def log_to_wandb(cfg: DictConfig, matrix_dir: Path, cells: Cells) -> Path | None:
    """Log the matrix (``cfg``: the composed cross_eval config) to wandb in
    ``cfg.matrix.wandb`` mode; returns the wandb run directory, None when disabled."""
    mode = cfg.matrix.get("wandb")
    if not mode or mode == "disabled":
        return None
    import wandb

    finish_wandb()
    train, evals = list(cfg.matrix.train), list(cfg.matrix.eval)
    run = wandb.init(
        project=cfg.matrix.get("wandb_project", "fastasr"),
        name=f"matrix-{cfg.matrix.name}",
        job_type="cross_eval",
        dir=str(matrix_dir),
        mode=mode,
        config={"matrix": OmegaConf.to_container(cfg.matrix, resolve=True)},
        settings=wandb.Settings(silent=True),
    )
    try:
        rows = [[c.to_row()[k] for k in CSV_COLUMNS] for c in ordered(cells, train, evals)]
        table = wandb.Table(columns=list(CSV_COLUMNS), data=rows)
        run.log({"matrix/table": table, "matrix/heatmap": wandb.Image(str(matrix_dir / PNG_FILE))})
        for c in cells.values():
            if c.status == OK and c.unit_error is not None:
                run.summary[f"matrix/{c.train}/{c.eval}"] = c.unit_error
        run_dir = Path(run.dir).parent
    finally:
        run.finish()
    return run_dir
