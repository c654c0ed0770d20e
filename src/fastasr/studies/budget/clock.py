"""Where a budget-study run stands on its clock at every validation: the x-axis of the
dev-error-against-training-time curve."""

from __future__ import annotations

import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Timer

TRAIN_SECONDS = "budget/train_seconds"
EPOCHS = "budget/epochs"
UPDATES = "budget/updates"


class TrainingClock(L.Callback):
    """Logs, at the end of every validation (not the sanity check):

    * ``budget/train_seconds``: training time spent so far, by Lightning's ``Timer`` (the clock
      ``trainer.max_time`` stops; it counts validation and checkpointing inside ``fit`` and is
      restored on resume), else this callback's own clock, kept in checkpoints the same way;
    * ``budget/epochs``: passes over the training set so far, fractional
      (``current_epoch`` + batches done in it / batches an epoch);
    * ``budget/updates``: optimiser updates so far (``trainer.global_step``).

    The budget runner (:mod:`fastasr.studies.budget`) adds it to every member's callbacks.
    """

    def __init__(self) -> None:
        super().__init__()
        self._offset = 0.0
        self._start: float | None = None

    @staticmethod
    def _timer(trainer: L.Trainer) -> Timer | None:
        return next((cb for cb in trainer.callbacks if isinstance(cb, Timer)), None)

    def train_seconds(self, trainer: L.Trainer) -> float:
        """Training time spent so far (see the class docstring)."""
        timer = self._timer(trainer)
        if timer is not None:
            return float(timer.time_elapsed("train"))
        return self._offset + (time.monotonic() - self._start if self._start is not None else 0.0)

    @staticmethod
    def epochs(trainer: L.Trainer) -> float:
        """Fractional passes over the training set so far."""
        batches = trainer.num_training_batches
        done = trainer.fit_loop.epoch_loop.batch_progress.current.ready
        within = done / batches if isinstance(batches, int) and batches > 0 else 0.0
        return trainer.current_epoch + min(within, 1.0)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.monotonic()

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        values = {TRAIN_SECONDS: self.train_seconds(trainer), EPOCHS: self.epochs(trainer),
                  UPDATES: float(trainer.global_step)}
        pl_module.log_dict(values, on_step=False, on_epoch=True, sync_dist=False)

    def state_dict(self) -> dict[str, Any]:
        own = self._offset + (time.monotonic() - self._start if self._start is not None else 0.0)
        return {"own_seconds": own}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._offset = float(state_dict.get("own_seconds", 0.0))
