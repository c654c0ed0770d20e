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

An eager step's decision is read on the host before the update: one value a step, which on a
GPU waits for the backward. A captured step (``capture_steps``) decides on the device, inside
its update graph (:class:`fastasr.training.update_guard.DeviceUpdateGuard`): the callback hands
it the loss's verdict and reads the step's outcome back later without waiting, so its warning,
count and the stop after ``max_consecutive`` come a step or two after the batch.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch

from fastasr.distributed import gather_objects
from fastasr.training.update_guard import DeviceUpdateGuard

log = logging.getLogger(__name__)


class Readbacks:
    """Device values read back to the host a few steps late: each copied behind a CUDA event into
    page-locked memory (on a CPU, cloned); :meth:`done` yields all but the newest ``keep``,
    oldest first, waiting for an event the device has not reached yet (by then, rarely: the
    host has queued ``keep`` steps since). A fixed lag, not "whatever is ready", so that every
    DDP rank reads the same steps at the same batch (a stop after too many is collective)."""

    def __init__(self) -> None:
        self._pending: deque[tuple[Any, torch.Tensor, Any]] = deque()
        self._free: list[tuple[torch.Tensor, Any]] = []  # page-locked buffers and events to reuse

    def reserve(self, like: torch.Tensor, count: int) -> None:
        """Make ``count`` page-locked buffers for values like ``like`` ahead (on a GPU: pinned
        memory is allocated outside the steps, and each buffer is reused once read)."""
        if like.device.type == "cuda":
            self._free += [(torch.empty(like.shape, dtype=like.dtype, pin_memory=True), torch.cuda.Event())
                           for _ in range(count)]

    def push(self, value: torch.Tensor, tag: Any) -> None:
        if value.device.type != "cuda":
            self._pending.append((tag, value.detach().clone(), None))
            return
        host, event = self._free.pop() if self._free else (
            torch.empty(value.shape, dtype=value.dtype, pin_memory=True), torch.cuda.Event())
        host.copy_(value, non_blocking=True)
        event.record()
        self._pending.append((tag, host, event))

    def done(self, keep: int = 0) -> Iterator[tuple[Any, torch.Tensor]]:
        while len(self._pending) > keep:
            tag, host, event = self._pending.popleft()
            if event is not None and not event.query():
                event.synchronize()
            yield tag, host
            if event is not None:  # read by now: free for another value
                self._free.append((host, event))


#: Captured steps whose outcome is read back at a later batch's end: the outcome of step ``t``
#: at step ``t + READ_BACK_LAG``'s (:class:`Readbacks`).
READ_BACK_LAG = 2


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
        self._on_device: tuple[int, list[str], DeviceUpdateGuard] | None = None  # this captured step's
        self._outcomes = Readbacks()  # captured steps' outcomes, read back without waiting

    def state_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped = int(state_dict.get("skipped", 0))

    def on_train_start(self, trainer, pl_module) -> None:
        captured = getattr(pl_module, "captured", None)
        if captured is not None:  # captured steps decide on the device (module docstring)
            captured.guard = DeviceUpdateGuard(pl_module.device)
            self._outcomes.reserve(captured.guard.finite, READ_BACK_LAG + 2)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._ids = [str(i) for i in batch.get("ids", [])] if isinstance(batch, dict) else []
        self._loss_finite = None
        self._on_device = None

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
        captured = getattr(pl_module, "captured", None)
        if captured is not None and captured.current is not None and captured.guard is not None \
                and not _uses_grad_scaler(trainer):  # a scaler decides on the host, and may not step
            self._hand_to_device(captured.guard, trainer)
            return
        finite = self._finite(trainer, pl_module)
        skip = trainer.strategy.reduce_boolean_decision(not finite, all=False)  # any rank
        if not skip:
            self._in_a_row.clear()
            return
        for p in pl_module.parameters():
            p.grad = None
        what = "loss" if self._loss_finite is not None and not bool(self._loss_finite) else "gradient"
        self._skipped(trainer, pl_module, trainer.global_step, self._ids, what)

    def _hand_to_device(self, guard: DeviceUpdateGuard, trainer: L.Trainer) -> None:
        """A captured step: the loss's verdict (any rank's non-finite loss, under DDP) into the
        update graph's input; nothing read back."""
        if self._loss_finite is None:
            guard.loss_finite.fill_(1.0)
        else:
            guard.loss_finite.copy_(self._loss_finite)
        if trainer.world_size > 1:
            torch.distributed.all_reduce(guard.loss_finite, op=torch.distributed.ReduceOp.MIN)
        self._on_device = (trainer.global_step, self._ids, guard)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """After a captured step's update: its outcome queued for reading back; the outcomes the
        device has reached, counted."""
        if self._on_device is not None:
            step, ids, guard = self._on_device
            self._outcomes.push(guard.finite, (step, ids))
            self._on_device = None
        self._count_outcomes(trainer, pl_module, keep=READ_BACK_LAG)

    def on_train_end(self, trainer, pl_module) -> None:
        self._count_outcomes(trainer, pl_module, log_metric=False)

    def _count_outcomes(self, trainer, pl_module, keep: int = 0, log_metric: bool = True) -> None:
        for (step, ids), finite in self._outcomes.done(keep):
            if float(finite) == 1.0:
                self._in_a_row.clear()
            else:
                self._skipped(trainer, pl_module, step, ids, "loss or gradient", log_metric)

    def _skipped(self, trainer, pl_module, step: int, ids: list[str], what: str, log_metric: bool = True) -> None:
        """A skipped update: the warning, the count, and the stop after ``max_consecutive``."""
        self.skipped += 1
        self._in_a_row.append((step, ids))
        log.warning("step %d: non-finite %s on rank %d; update skipped (%d skipped so far, %d in a row); "
                    "utterances: %s", step, what, trainer.global_rank, self.skipped, len(self._in_a_row),
                    " ".join(ids) or "?")
        if log_metric:  # Lightning takes no step metric once training has ended
            pl_module.log("train/nonfinite_skipped", float(self.skipped), on_step=True, on_epoch=False,
                          batch_size=1)
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
