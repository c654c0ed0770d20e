"""Speed and memory of training: wall time per batch, samples and frames per second, peak memory."""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch


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

    * ``perf/batch_seconds``: wall time from batch start to the end of its optimiser step
      (forward, backward, clipping, step);
    * ``perf/data_seconds``: wall time between the previous batch's end and this batch's
      start (data loading and transfer);
    * ``perf/samples_per_second``, ``perf/frames_per_second``: utterances and input
      feature frames of the batch divided by ``perf/batch_seconds``;
    * ``perf/peak_memory_mb``: see :func:`peak_memory_mb` (GPU allocator peak, or the
      process's max RSS on CPU);

    and ``perf/epoch_seconds`` once per training epoch.

    Args:
        synchronize: wait for CUDA kernels before reading the clock (exact per-batch times
            at the cost of a sync per step; off by default on GPU runs where that matters).
    """

    def __init__(self, synchronize: bool = True):
        super().__init__()
        self.synchronize = synchronize
        self._batch_start: float | None = None
        self._batch_end: float | None = None
        self._epoch_start: float | None = None

    def _sync(self, pl_module: L.LightningModule) -> None:
        if self.synchronize and pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch_start = time.perf_counter()
        self._batch_end = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._sync(pl_module)
        self._batch_start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._batch_start is None:
            return
        self._sync(pl_module)
        now = time.perf_counter()
        seconds = max(now - self._batch_start, 1e-9)
        values = {"perf/batch_seconds": seconds, "perf/peak_memory_mb": peak_memory_mb(pl_module.device)}
        if self._batch_end is not None:
            values["perf/data_seconds"] = self._batch_start - self._batch_end
        samples = None
        if isinstance(batch, Mapping):
            if "feature_lengths" in batch:
                lengths = batch["feature_lengths"]
                samples = len(lengths)
                values["perf/frames_per_second"] = float(lengths.sum()) / seconds
            elif "ids" in batch:
                samples = len(batch["ids"])
        if samples is not None:
            values["perf/samples_per_second"] = samples / seconds
        pl_module.log_dict(values, on_step=True, on_epoch=False, batch_size=samples or 1)
        self._batch_end = now

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._epoch_start is not None:
            pl_module.log("perf/epoch_seconds", time.perf_counter() - self._epoch_start, on_step=False, on_epoch=True)
