"""Skip the update of a batch whose loss (or gradient) is NaN or infinite; stop after several.

A single bad batch (an overflow, a pathological utterance) should not poison the weights: its
gradients are dropped before the optimiser step (``p.grad = None``: torch optimisers leave a
parameter without a gradient untouched, weight decay and moments included), with a warning
and a count (``train/nonfinite_skipped``). ``max_consecutive`` such batches in a row mean the
run itself has diverged: it stops with an error naming their utterance ids.

Under DDP the decision is taken over all ranks (any rank's non-finite loss, or non-finite
averaged gradients, skips the step everywhere), so the replicas stay identical. Under
``16-mixed`` the gradient scaler already skips steps with overflowed gradients while it
calibrates, so only a non-finite *loss* counts there.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch

from fastasr.distributed import gather_objects

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """Too many consecutive batches with a NaN or infinite loss."""


def _uses_grad_scaler(trainer: L.Trainer) -> bool:
    return getattr(trainer.precision_plugin, "scaler", None) is not None


class NonFiniteLossGuard(L.Callback):
    """Drops the gradients of a batch with a non-finite loss or gradient, so it changes nothing.

    Args:
        max_consecutive: this many such batches in a row stop the run with
            :class:`NonFiniteLossError` naming their utterance ids (≥ 1).

    ``skipped`` (the total so far) is kept in the checkpoint.
    """

    def __init__(self, max_consecutive: int = 5) -> None:
        super().__init__()
        if int(max_consecutive) < 1:
            raise ValueError(f"NonFiniteLossGuard max_consecutive={max_consecutive}; expected ≥ 1")
        self.max_consecutive = int(max_consecutive)
        self.skipped = 0
        self._in_a_row: list[tuple[int, list[str]]] = []  # (step, utterance ids) of the current run of bad batches
        self._ids: list[str] = []
        self._loss_finite: torch.Tensor | None = None  # on the device: read once per step, below

    def state_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped = int(state_dict.get("skipped", 0))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._ids = [str(i) for i in batch.get("ids", [])] if isinstance(batch, dict) else []
        self._loss_finite = None

    def on_before_backward(self, trainer, pl_module, loss: torch.Tensor) -> None:
        self._loss_finite = torch.isfinite(loss.detach()).all()

    def _finite(self, trainer: L.Trainer, pl_module: L.LightningModule) -> bool:
        """Loss and gradients finite on this rank: one host sync per step."""
        finite = self._loss_finite if self._loss_finite is not None else torch.tensor(True)
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        if grads and not _uses_grad_scaler(trainer):
            norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
            finite = finite.to(norm.device) & torch.isfinite(norm)
        return bool(finite)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        finite = self._finite(trainer, pl_module)
        skip = trainer.strategy.reduce_boolean_decision(not finite, all=False)  # any rank
        if not skip:
            self._in_a_row.clear()
            return
        for p in pl_module.parameters():
            p.grad = None
        self.skipped += 1
        step = trainer.global_step
        self._in_a_row.append((step, self._ids))
        what = "loss" if self._loss_finite is not None and not bool(self._loss_finite) else "gradient"
        log.warning("step %d: non-finite %s on rank %d; update skipped (%d skipped so far, %d in a row); "
                    "utterances: %s", step, what, trainer.global_rank, self.skipped, len(self._in_a_row),
                    " ".join(self._ids) or "?")
        pl_module.log("train/nonfinite_skipped", float(self.skipped), on_step=True, on_epoch=False, batch_size=1)
        if len(self._in_a_row) >= self.max_consecutive:
            batches: dict[int, list[str]] = {}
            for part in gather_objects(self._in_a_row):
                for s, ids in part:
                    batches.setdefault(s, []).extend(ids)
            listing = "; ".join(f"step {s}: {' '.join(ids) or '?'}" for s, ids in sorted(batches.items()))
            raise NonFiniteLossError(
                f"{len(self._in_a_row)} consecutive batches with a NaN or infinite loss or gradient "
                f"(callbacks.nonfinite_loss.max_consecutive={self.max_consecutive}): the run has diverged. "
                f"Utterances — {listing}. Try a lower optim.lr, trainer.precision=32-true, or inspect these "
                "utterances; resume from the last checkpoint once fixed."
            )
