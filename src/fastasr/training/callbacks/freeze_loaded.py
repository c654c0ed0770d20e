"""The loaded part of a fine-tuned model held fixed for its first updates.

A run started from a trained model (``init_from=CKPT``, :mod:`fastasr.training.initial_weights`)
with new output units has a random output layer: its first gradients are large and, passed down,
would move the loaded encoder away from what it learnt before the new layer has learnt anything.
:class:`FreezeLoaded` drops the gradients of the front end and the encoder for the first
``updates`` optimiser steps, so that only the output layer moves; from then on every parameter
trains. Gradients are dropped (set to ``None``) in ``on_before_optimizer_step``, after the
backward pass and its DDP all-reduce: the optimiser skips those parameters whole (no update, no
weight decay, no moment statistics), and no parameter changes its ``requires_grad``, which DDP
would not follow.
"""

from __future__ import annotations

import logging

import lightning as L

from fastasr.training.initial_weights import LOADED_PARTS

log = logging.getLogger(__name__)


class FreezeLoaded(L.Callback):
    """Hold the front end and the encoder fixed for the first ``updates`` optimiser steps.

    Args:
        updates: how many updates train the output layer alone; 0: none (a no-op).
    """

    def __init__(self, updates: int = 0):
        if int(updates) < 0:
            raise ValueError(f"callbacks.freeze_loaded.updates={updates}; expected >= 0")
        self.updates = int(updates)
        self._announced = False

    def frozen(self, step: int) -> bool:
        """Whether the update after ``step`` finished ones leaves the loaded part fixed."""
        return step < self.updates

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.frozen(trainer.global_step) and not self._announced:
            log.info("freeze_loaded: the front end and the encoder stay fixed for the first %d updates "
                     "(the output layer trains alone)", self.updates)
            self._announced = True

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if not self.frozen(trainer.global_step):
            return
        model = getattr(pl_module, "model", pl_module)
        for name, parameter in model.named_parameters():
            if name.startswith(LOADED_PARTS):
                parameter.grad = None
