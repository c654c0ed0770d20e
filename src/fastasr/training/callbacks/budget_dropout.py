"""Dropout by the epochs the run's budget affords: the regularisation follows epochs, not hours.

Within a wall-clock budget the same recipe underfits a large corpus (a dozen epochs: train loss ≈
dev loss, and dropout only slows learning) and overfits a small one (fifty epochs: the train loss
falls to a twentieth of the dev loss, which rises while the dev error stalls). Which of the two a
run is depends on the corpus *and* the machine, so no fixed ``model.dropout`` suits both.
:class:`BudgetDropout` decides once, at the end of the first epoch (its validation and
checkpoints included): the budget then affords ``E = 1 / budget_progress`` epochs
(:func:`fastasr.training.lr_schedules.budget_progress`: ``trainer.max_time``, ``max_steps`` or
``max_epochs``, whichever ends the run first; a run resumed from a checkpoint without a decision
takes it at its first epoch end, from the epochs done so far). The rate is 0 below ``epochs[0]``, ``p`` from
``epochs[1]``, and rises linearly between, so an estimate near a bound moves the rate a little,
never from nothing to all. Every dropout module of the model below that rate is raised to it
(a model built with more dropout keeps its own). Dropout has no parameters, so the checkpoints
and the recogniser do not change; the decision is in the checkpoint, so a resumed run keeps it;
it is logged, written to the loggers as ``train/dropout`` every epoch, and kept in the run's
results (:func:`dropout_decision`). Under DDP every rank takes rank 0's estimate.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import lightning as L
from torch import nn

from fastasr.training.lr_schedules import budget_progress

log = logging.getLogger(__name__)


class BudgetDropout(L.Callback):
    """Dropout from the second epoch on, by the epochs the training budget affords.

    Args:
        p: the dropout rate of a run whose budget affords ``epochs[1]`` epochs or more (in [0, 1)).
        epochs: ``[none_below, full_from]``: no dropout below ``none_below`` epochs, ``p`` from
            ``full_from``, linear between (0 < none_below ≤ full_from).

    ``decision`` (None until the first epoch ends): ``epochs`` (the budget's epochs as estimated;
    None: no budget set), ``dropout`` (the rate; None: the model's own kept), ``update`` (when it
    was taken).
    """

    def __init__(self, p: float = 0.1, epochs: Sequence[float] = (20.0, 40.0)) -> None:
        super().__init__()
        if not 0.0 <= float(p) < 1.0:
            raise ValueError(f"BudgetDropout p={p!r}; expected a dropout rate in [0, 1)")
        bounds = [float(e) for e in epochs]
        if len(bounds) != 2 or not 0 < bounds[0] <= bounds[1]:
            raise ValueError(f"BudgetDropout epochs={list(epochs)!r}; expected [none_below, full_from] with "
                             "0 < none_below ≤ full_from")
        self.p = float(p)
        self.epochs = bounds
        self.decision: dict[str, Any] | None = None

    def rate(self, epochs: float | None) -> float:
        """The dropout rate for a budget of ``epochs`` epochs (None: no budget, 0)."""
        none_below, full_from = self.epochs
        if epochs is None or epochs < none_below:
            return 0.0
        if epochs >= full_from:
            return self.p
        return self.p * (epochs - none_below) / (full_from - none_below)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"decision": dict(self.decision) if self.decision else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # an older checkpoint without a decision (restored for the test) does not erase this run's
        decision = state_dict.get("decision")
        if decision is not None or self.decision is None:
            self.decision = dict(decision) if decision else None

    # ------------------------------------------------------------------ hooks
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.decision and self.decision.get("dropout") is not None:  # a resumed run
            raise_dropout(pl_module, self.decision["dropout"])

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.decision is None:
            # DDP: every rank takes rank 0's measure, so all of them train with the same rate
            progress = trainer.strategy.broadcast(budget_progress(trainer), src=0)
            self.decide(progress, trainer.global_step, pl_module, epochs_done=trainer.current_epoch + 1,
                        announce=trainer.is_global_zero)
        pl_module.log("train/dropout", max_dropout(pl_module), on_step=False, on_epoch=True, batch_size=1)

    # ------------------------------------------------------------------ the decision
    def decide(self, progress: float, update: int, module: nn.Module, epochs_done: int = 1,
               announce: bool = True) -> dict[str, Any]:
        """Take the decision after ``epochs_done`` epochs (1; more where a run from a checkpoint
        without a decision resumes) and ``update`` updates, which spent ``progress`` (0–1) of the
        budget, and apply it to ``module``'s dropout. A budget that is not set (``progress`` 0)
        keeps the model's rate."""
        epochs = epochs_done / progress if progress > 0 else None
        rate = self.rate(epochs)
        self.decision = {"epochs": None if epochs is None else round(epochs, 1),
                         "dropout": round(rate, 4) if rate > 0 else None, "update": int(update)}
        if rate > 0:
            raise_dropout(module, rate)
        if announce:
            budget = "no training budget set" if epochs is None else f"the budget affords about {epochs:.0f} epochs"
            log.info("callbacks.budget_dropout: %s (dropout 0 below %g, %g from %g): dropout %.3f from update %d on",
                     budget, self.epochs[0], self.p, self.epochs[1], max_dropout(module), update)
        return self.decision


def dropout_modules(module: nn.Module) -> list[nn.Dropout]:
    """Every dropout module of ``module`` (``nn.Dropout`` and its subclasses, such as
    :class:`fastasr.kernels.layers.dropout.Dropout`)."""
    return [m for m in module.modules() if isinstance(m, nn.Dropout)]


def raise_dropout(module: nn.Module, p: float) -> None:
    """Set every dropout module of ``module`` whose rate is below ``p`` to ``p``."""
    for m in dropout_modules(module):
        m.p = max(float(m.p), float(p))


def max_dropout(module: nn.Module) -> float:
    """The highest dropout rate in ``module`` (0 without dropout modules)."""
    return max((float(m.p) for m in dropout_modules(module)), default=0.0)


def dropout_decision(trainer: L.Trainer) -> dict[str, Any] | None:
    """The :class:`BudgetDropout` decision of ``trainer``'s run (None: no such callback, or no
    epoch ended)."""
    for cb in trainer.callbacks:
        if isinstance(cb, BudgetDropout):
            return dict(cb.decision) if cb.decision else None
    return None
