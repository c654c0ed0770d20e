"""Speed and memory of training: wall time per batch, samples and frames per second, peak memory."""

from __future__ import annotations

import resource
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import torch

#: The batch key of a GPU batch's lengths kept on the host (``fastasr.training.lit.HostLengths``).
HOST_LENGTHS_KEY = "host_lengths"


def peak_memory_mb(device: torch.device | None = None) -> float:
    """Peak memory so far in MiB: ``torch.cuda.max_memory_allocated`` on a CUDA device,
    else the process's maximum resident set size (``ru_maxrss``)."""
    if device is not None and device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def reset_peak_memory() -> bool:
    """Start :func:`peak_memory_mb` afresh from the memory in use now, so that a run's peak is
    its own when several runs share one process (the budget study and the matrix train their
    members in one): on Linux the process's resident high-water mark, by writing ``5`` to
    ``/proc/self/clear_refs`` (which resets ``ru_maxrss`` too), and the allocator peak of every
    CUDA device already in use. Returns False where the resident peak cannot be reset (another
    OS, a read-only /proc): it is then the process's since it started."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(index)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class ThroughputLogger(L.Callback):
    """Logs, every training step (subject to ``trainer.log_every_n_steps``):

    * ``perf/batch_seconds``: the time from a batch's start to the end of its optimiser step
      (forward, backward, clipping, step);
    * ``perf/data_seconds``: the time between the previous batch's end and this batch's start
      (data loading and transfer);
    * ``perf/samples_per_second``, ``perf/frames_per_second``: utterances and input feature
      frames of the batch (its lengths as the loader made them, on the host) divided by
      ``perf/batch_seconds``;
    * ``perf/peak_memory_mb``: see :func:`peak_memory_mb` (GPU allocator peak, or the
      process's max RSS on CPU);

    and ``perf/epoch_seconds`` once per training epoch. The step values go to the run's loggers
    as host numbers, not through ``self.log``.

    On a CPU the times are the host's clock. On a GPU they are the device's timeline, read
    without waiting for it: a CUDA event is recorded at each batch's start and end, and each
    step logs the times of the latest batch whose events the device has passed (an earlier
    batch's while the host runs ahead), so the callback adds no host synchronisation to the
    step. ``synchronize=True`` instead waits for the device at both ends of every batch and
    logs each batch's own host-clock times (two synchronisations a step: the host can no longer
    queue the next step while the device runs this one).

    Args:
        synchronize: on a GPU, wait for the device around each batch (above).
        event: makes the timing events (``torch.cuda.Event(enable_timing=True)``; the tests
            give a stand-in with ``record``, ``query`` and ``elapsed_time``).
    """

    def __init__(self, synchronize: bool = False, event: Callable[[], Any] | None = None):
        super().__init__()
        self.synchronize = synchronize
        self._event = event or (lambda: torch.cuda.Event(enable_timing=True))
        self._batch_start: float | None = None
        self._batch_end: float | None = None
        self._epoch_start: float | None = None
        self._start_event: Any = None
        self._pending: deque[tuple[Any, Any, Any, int | None, float | None]] = deque()
        self._last_end_event: Any = None

    def _events(self, pl_module: L.LightningModule) -> bool:
        """Whether this run's batches are timed by device events (a GPU, no synchronisation)."""
        return not self.synchronize and pl_module.device.type == "cuda"

    def _sync(self, pl_module: L.LightningModule) -> None:
        if self.synchronize and pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch_start = time.perf_counter()
        self._batch_end = None
        self._pending.clear()
        self._last_end_event = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._events(pl_module):
            self._start_event = self._event()
            self._start_event.record()
        self._sync(pl_module)
        self._batch_start = time.perf_counter()

    @staticmethod
    def _size(batch: Any) -> tuple[int | None, float | None]:
        """The batch's utterances and input frames, read on the host (None: not known there)."""
        if not isinstance(batch, Mapping):
            return None, None
        lengths = batch.get("feature_lengths")
        host = batch.get(HOST_LENGTHS_KEY)
        if host is not None:
            lengths = host.features
        if isinstance(lengths, torch.Tensor):
            frames = float(lengths.sum()) if lengths.device.type == "cpu" else None
            return len(lengths), frames
        return (len(batch["ids"]), None) if "ids" in batch else (None, None)

    def _finished(self) -> tuple[float, float | None, int | None, float | None] | None:
        """The latest batch whose end event the device has passed: its seconds, the seconds
        since the batch before it ended (None for an epoch's first), utterances and frames;
        None while the device is still on the oldest pending batch."""
        done = None
        while self._pending and self._pending[0][1].query():
            start, end, previous_end, samples, frames = self._pending.popleft()
            gap = previous_end.elapsed_time(start) / 1000 if previous_end is not None else None
            done = (start.elapsed_time(end) / 1000, gap, samples, frames)
        return done

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._batch_start is None:
            return
        samples, frames = self._size(batch)
        if self._events(pl_module) and self._start_event is not None:
            end = self._event()
            end.record()
            self._pending.append((self._start_event, end, self._last_end_event, samples, frames))
            self._last_end_event, self._start_event = end, None
            done = self._finished()
            if done is None:
                return
            seconds, gap, samples, frames = done
        else:
            self._sync(pl_module)
            now = time.perf_counter()
            seconds = now - self._batch_start
            gap = self._batch_start - self._batch_end if self._batch_end is not None else None
            self._batch_end = now
        seconds = max(seconds, 1e-9)
        values = {"perf/batch_seconds": seconds, "perf/peak_memory_mb": peak_memory_mb(pl_module.device)}
        if gap is not None:
            values["perf/data_seconds"] = gap
        if frames is not None:
            values["perf/frames_per_second"] = frames / seconds
        if samples is not None:
            values["perf/samples_per_second"] = samples / seconds
        self._log(trainer, values)

    @staticmethod
    def _log(trainer: L.Trainer, values: dict[str, float]) -> None:
        """Host values straight to the run's loggers at Lightning's logging steps (as Lightning's
        ``LearningRateMonitor`` logs), at the step Lightning logs this batch's metrics: through
        ``self.log`` each would become a device tensor, on a GPU a copy that waits for the device."""
        if not trainer.loggers or not trainer._logger_connector.should_update_logs:
            return
        step = trainer.fit_loop.epoch_loop._batches_that_stepped
        for logger in trainer.loggers:
            logger.log_metrics({**values, "epoch": trainer.current_epoch}, step=step)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._epoch_start is not None:
            pl_module.log("perf/epoch_seconds", time.perf_counter() - self._epoch_start, on_step=False, on_epoch=True)
