"""Mid-epoch resumption of the training batches (Lightning's stateful-dataloader protocol).

Lightning stores the ``state_dict()`` of every training dataloader that has ``state_dict`` and
``load_state_dict`` in each checkpoint, and on resume calls ``load_state_dict`` before it
creates the epoch's iterator. Without that, a run resumed from a checkpoint written in the
middle of an epoch would start the epoch over and train again on the batches before the
checkpoint (Lightning only warns that the "dataloader is not resumable").

The position is read from the trainer's progress counters when the checkpoint is written, not
counted by the loader: Lightning fetches one batch ahead and DataLoader workers prefetch
several, so what has left the loader is not what has been trained on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from torch.utils.data import DataLoader

log = logging.getLogger(__name__)

Position = tuple[int, int]  # (epoch, training batches of that epoch this rank has completed)


def training_position(trainer: Any) -> Position:
    """``(epoch, batches done)`` of a running ``Trainer.fit``: the epoch being trained (or the
    next one, between epochs) and how many of its batches this rank has finished (the
    optimiser step of a finished batch is in a checkpoint written at that moment)."""
    fit = trainer.fit_loop
    epochs = fit.epoch_progress.current
    if epochs.started > epochs.processed:  # inside an epoch
        return int(epochs.processed), int(fit.epoch_loop.batch_progress.current.processed)
    return int(epochs.processed), 0


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` over a :class:`~fastasr.data.sampler.FrameBudgetBatchSampler` whose
    position in the epoch travels in the checkpoint.

    Args:
        *args, **kwargs: ``DataLoader`` arguments; ``batch_sampler`` must have ``resume_at``.
        position: called when a checkpoint is written; returns ``(epoch, batches done)``
            (e.g. ``lambda: training_position(trainer)``). None: the start of the sampler's epoch.

    ``state_dict()``: ``{"epoch", "batches_done", "batches_per_epoch", "num_replicas"}``.
    ``load_state_dict()`` makes the next pass start after the batches done (the next epoch
    when the epoch was finished). Resumed on a different number of processes, the count of
    batches done is rescaled (each rank then skips its share of the global count).
    """

    def __init__(self, *args: Any, position: Callable[[], Position] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not hasattr(self.batch_sampler, "resume_at"):
            raise TypeError("ResumableDataLoader: batch_sampler must implement resume_at(epoch, batches_done)")
        self._position = position

    def state_dict(self) -> dict[str, int]:
        epoch, done = self._position() if self._position is not None else (self.batch_sampler.epoch, 0)
        return {
            "epoch": int(epoch),
            "batches_done": int(done),
            "batches_per_epoch": len(self),
            "num_replicas": int(getattr(self.batch_sampler, "num_replicas", 1)),
        }

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        epoch, done = int(state["epoch"]), int(state["batches_done"])
        saved_replicas = int(state.get("num_replicas", 1))
        replicas = int(getattr(self.batch_sampler, "num_replicas", 1))
        if saved_replicas != replicas:
            log.warning("resuming on %d processes a run checkpointed on %d: batch position rescaled, "
                        "so a few batches of epoch %d may be repeated or skipped", replicas, saved_replicas, epoch)
            done = done * saved_replicas // replicas
        if done >= len(self):
            epoch, done = epoch + 1, 0
        self.batch_sampler.resume_at(epoch, done)
        if done:
            log.info("resuming epoch %d after its first %d of %d batches", epoch, done, len(self))
