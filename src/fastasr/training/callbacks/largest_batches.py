"""Try the largest training batches before training starts (icefall's "scan pessimistic batches").

An out-of-memory error on the worst batch should show at minute one, not at hour ten. The
batches with the most padded frames (and so the longest attention) run forward and backward
once; gradients are discarded, parameters and optimiser state are untouched.
"""

from __future__ import annotations

import logging
import time

import lightning as L
import torch

from fastasr.training.callbacks.throughput import peak_memory_mb

log = logging.getLogger(__name__)


class LargestBatchProbe(L.Callback):
    """Runs forward + backward on the ``batches`` largest training batches at fit start.

    Needs a datamodule with ``largest_train_batches(k)``. On failure (e.g. CUDA out of memory)
    it raises a ``RuntimeError`` naming the batch shape and the ``data.max_frames_per_batch`` to
    lower, instead of failing hours later.
    """

    def __init__(self, batches: int = 1):
        super().__init__()
        self.batches = batches

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        datamodule = trainer.datamodule
        if self.batches < 1 or trainer.fast_dev_run or not hasattr(datamodule, "largest_train_batches"):
            return
        was_training = pl_module.training
        pl_module.train()
        for batch in datamodule.largest_train_batches(self.batches):
            if not batch["ids"]:  # every utterance of it skipped for bad audio
                continue
            batch = pl_module.transfer_batch_to_device(batch, pl_module.device, 0)
            shape = tuple(batch["features"].shape)
            start = time.perf_counter()
            try:
                loss, _, _ = pl_module._loss(batch)
                loss.backward()
            except torch.OutOfMemoryError as err:
                raise RuntimeError(
                    f"the largest training batch {shape} (batch, frames, bins) does not fit in memory; "
                    f"lower data.max_frames_per_batch (now {getattr(datamodule, 'max_frames_per_batch', '?')})"
                ) from err
            finally:
                pl_module.zero_grad(set_to_none=True)
            log.info(
                "largest batch %s: forward+backward %.2f s, peak memory %.0f MiB",
                shape, time.perf_counter() - start, peak_memory_mb(pl_module.device),
            )
        pl_module.train(was_training)
