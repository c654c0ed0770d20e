"""A marker that a run's ``fit`` finished, so the matrix can reuse the model without retraining."""

from __future__ import annotations

import math

import lightning as L

from fastasr.rundir import RunDir


class FitCompletionMarker(L.Callback):
    """Writes ``<run dir>/fit_done.json`` when ``trainer.fit`` ends normally (max_epochs, max_steps
    or early stopping; not when interrupted or under ``fast_dev_run``) and removes a stale one
    when a fit starts, so "the file exists" means "this run's training is complete".

    The file holds ``max_epochs``, ``epochs`` (completed), ``global_step``, ``best_ckpt``,
    ``last_ckpt`` and the last validation metrics. The run directory is the trainer's
    ``default_root_dir`` (``fastasr.training.fit.train`` sets it); the file is
    :attr:`fastasr.rundir.RunDir.fit_done_file`.
    """

    def __init__(self) -> None:
        super().__init__()
        self._previous_val: dict[str, float | None] = {}

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            run_dir = RunDir(trainer.default_root_dir)
            previous = run_dir.read_fit_done()
            # a resumed, already finished run validates nothing: keep the scores it had
            self._previous_val = dict((previous or {}).get("val") or {})
            run_dir.clear_fit_done()

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero or trainer.interrupted or trainer.fast_dev_run:
            return
        ckpt = trainer.checkpoint_callback
        best = getattr(ckpt, "best_model_path", "") or None
        last = RunDir(trainer.default_root_dir).latest_checkpoint()
        val = dict(self._previous_val)
        for key, value in trainer.callback_metrics.items():
            if key.startswith("val/"):
                number = float(value)
                val[key] = number if math.isfinite(number) else None
        record = {
            "max_epochs": trainer.max_epochs,
            "max_steps": trainer.max_steps,
            "epochs": trainer.current_epoch,
            "global_step": trainer.global_step,
            "best_ckpt": best,
            "last_ckpt": str(last) if last else None,
            "val": val,
        }
        RunDir(trainer.default_root_dir).write_fit_done(record)
