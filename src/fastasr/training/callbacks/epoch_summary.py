"""One line a validation in the run's log: what the progress bar shows, for a log file.

A run launched with ``nohup``, under SLURM or by a scheduler writes its output to a file, where
a progress bar is no use (``trainer.enable_progress_bar: auto`` draws none there). This callback
logs, after every validation, one line through :mod:`logging`, so it reaches the console and
the run's ``train.log`` alike::

    epoch 3 (step 800, 0:04:12): train/loss 0.591, val/loss 0.552, val/per 14.60, val/wer 60.60; 1.62 updates/s
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any

import lightning as L
import torch

log = logging.getLogger(__name__)


class EpochSummary(L.Callback):
    """After each validation (not Lightning's sanity check), on global rank 0: the epoch (and its
    batches so far where the validation comes before the epoch's end: a mid-epoch validation,
    or the partial epoch a time limit cut short), the optimiser step, the wall time since this
    process began fitting, the mean training loss of the updates since the last line, every
    ``val/*`` metric logged (the unit error rate, WER, loss), and the updates a second since the
    last line.

    The training losses are summed on the device as they come and read once a line, so the
    callback adds no host synchronisation to a training step."""

    def __init__(self) -> None:
        super().__init__()
        self._loss_sum: torch.Tensor | None = None
        self._losses = 0
        self._fit_start = time.monotonic()
        self._since = (self._fit_start, 0)  # (time, global step) of the last line

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fit_start = time.monotonic()
        self._since = (self._fit_start, trainer.global_step)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if not isinstance(loss, torch.Tensor):  # a batch with nothing to learn from returned None
            return
        loss = loss.detach().float()
        self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
        self._losses += 1

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        log.info(self.line(trainer))
        self._loss_sum, self._losses = None, 0
        self._since = (time.monotonic(), trainer.global_step)

    @staticmethod
    def progress(trainer: L.Trainer) -> str:
        """``"120 of 199 batches, "`` where the validation comes before its epoch's last batch
        (a mid-epoch validation, or training stopped by ``trainer.max_time``), else ``""``."""
        total = trainer.num_training_batches
        done = trainer.fit_loop.epoch_loop.batch_progress.current.completed
        if not isinstance(total, int) or done >= total:  # an iterable of unknown length: inf
            return ""
        return f"{done} of {total} batches, "

    def line(self, trainer: L.Trainer) -> str:
        """The summary of the updates since the last line and of the validation just run."""
        now = time.monotonic()
        elapsed = datetime.timedelta(seconds=round(now - self._fit_start))
        parts = []
        if self._losses:
            parts.append(f"train/loss {float(self._loss_sum) / self._losses:.3f}")
        metrics = trainer.callback_metrics
        for name in sorted(k for k in metrics if k.startswith("val/")):
            value = float(metrics[name])
            parts.append(f"{name} {value:.3f}" if name.endswith("loss") else f"{name} {value:.2f}")
        then, step = self._since
        rate = (trainer.global_step - step) / max(now - then, 1e-9)
        return (f"epoch {trainer.current_epoch} ({self.progress(trainer)}step {trainer.global_step}, {elapsed}): "
                f"{', '.join(parts) or 'no metrics'}; {rate:.2f} updates/s")
