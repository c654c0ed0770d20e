"""Try the largest training batches before training starts (icefall's "scan pessimistic batches").

An out-of-memory error on the worst batch should show at minute one, not at hour ten. The
batches with the most padded frames (and so the longest attention) run forward and backward
once; gradients are discarded, parameters and optimiser state are untouched.

On a GPU (``fill_device: auto``) it first sizes the batches to the device: the training budget
becomes the largest that a batch of the longest training utterances (as many as the budget
prices, :meth:`fastasr.data.datamodule.ASRDataModule.pessimistic_batch`) runs forward and
backward in without running out of memory, less ``margin``, searched by doubling from
``data.max_frames_per_batch`` and then bisecting (:func:`largest_fitting`), never above what
the corpus gives ``data.min_batches_per_epoch`` batches with
(:meth:`~fastasr.data.datamodule.ASRDataModule.budget_ceiling`) and never above ``max_growth``
(:data:`MAX_GROWTH`, 2) times ``data.max_frames_per_batch``, the budget the recipe's learning
rate and epochs were chosen at (8,000 frames for ``make train``, a CPU's). A larger batch learns
about as much an update, not an epoch: on the built-in corpus, 10 epochs at 8,000 / 16,000 /
32,000 frames reach dev PER 6.8 / 10.9 / 29.1 (1,990 / 980 / 500 updates; the 32,000-frame run
leaves CTC's blank plateau at its 7th epoch; docs/results/builtin/RESULTS.md, "Larger
batches"). Twice the budget keeps ``make train``'s 30 epochs at about 2,940 updates, more than
the 2,700 its CPU run learns its error rates in. The run's first lines give the budget found
and why. On a CPU the budget is the config's.

A run that captures its steps as CUDA graphs (``capture_steps``) needs two steps' memory: the
graphs keep their memory pool reserved (about the largest captured step's peak), and a shape not
yet captured runs eagerly beside it, its first step and the capture's warm-up, from the
allocator's other memory. There the search and the check of the largest batches run each batch
twice, the second pass beside a block of the first's peak (:func:`forward_backward`), so the
budget is what two steps fit.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import lightning as L
import torch

from fastasr.training.callbacks.throughput import peak_memory_mb

log = logging.getLogger(__name__)

#: The largest budget ``fill_device`` sets, as a multiple of ``data.max_frames_per_batch``
#: (module docstring).
MAX_GROWTH = 2.0


def largest_fitting(attempt: Callable[[int], object], start: int, ceiling: int, tolerance: float = 0.05,
                    floor: int = 1) -> int | None:
    """The largest budget in ``[floor, ceiling]`` that ``attempt(budget)`` runs at without raising
    ``torch.OutOfMemoryError``, to within ``tolerance`` of it: doubling from ``start`` while it
    fits (halving while it does not), then bisecting between the last budget that fitted and the
    first that did not. None when not even ``floor`` fits. Each attempt is one forward and
    backward; a search takes about ``log2(found / start) + log2(1 / tolerance)`` of them."""
    ceiling, floor = int(ceiling), max(1, int(floor))
    start = max(floor, min(int(start), ceiling))
    tried: dict[int, bool] = {}

    def fits(budget: int) -> bool:
        if budget not in tried:
            try:
                attempt(budget)
                tried[budget] = True
            except torch.OutOfMemoryError:
                tried[budget] = False
        return tried[budget]

    if fits(start):
        lo, hi = start, None
        while hi is None and lo < ceiling:
            nxt = min(lo * 2, ceiling)
            if fits(nxt):
                lo = nxt
            else:
                hi = nxt
    else:
        lo, hi = None, start
        while lo is None and hi > floor:
            nxt = max(hi // 2, floor)
            if fits(nxt):
                lo = nxt
            else:
                hi = nxt
        if lo is None:
            return None
    while hi is not None and hi - lo > max(1, tolerance * lo):
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _allocated(device: torch.device) -> int:
    """Bytes in tensors on ``device`` now (the CUDA allocator's count; 0 elsewhere)."""
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device: torch.device) -> int:
    """Bytes in tensors on ``device`` at their most since :func:`_reset_peak` (0 off CUDA)."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def forward_backward(trainer: L.Trainer, pl_module: L.LightningModule, batch: dict, hold_graphs: bool = False) -> None:
    """One forward (under the run's precision) and backward of ``batch``, its gradients dropped.

    ``hold_graphs``: then once more, while a block of the first pass's peak memory stays
    allocated. A run whose steps are captured as CUDA graphs keeps their memory pool reserved,
    about the largest captured step's peak, and a shape not yet captured runs eagerly beside it
    (its first step, and the capture's warm-up), from the allocator's other memory: such a run
    needs two steps' memory, which the second pass asks for. ``torch.OutOfMemoryError`` from
    either pass propagates."""
    device = pl_module.device

    def once() -> None:
        try:
            with trainer.precision_plugin.train_step_context():
                loss, _, _ = pl_module._loss(batch)
            loss.backward()
        finally:
            pl_module.zero_grad(set_to_none=True)

    if not hold_graphs:
        once()
        return
    base = _allocated(device)
    _reset_peak(device)
    once()
    pool = torch.empty(max(_peak(device) - base, 0), dtype=torch.uint8, device=device)  # the graphs' pool
    try:
        once()
    finally:
        del pool


def graphs_held(trainer: L.Trainer, pl_module: L.LightningModule) -> bool:
    """Whether this run captures its steps as CUDA graphs (``capture_steps``;
    :meth:`fastasr.training.captured_step.CapturedSteps.eager_reason`), whose pool then stays
    reserved beside any eager step: on a CUDA device, with capture on and nothing that keeps the
    steps eager."""
    captured = getattr(pl_module, "captured", None)
    if captured is None or captured.setting is False or pl_module.device.type != "cuda":
        return False
    optimizers = list(getattr(trainer, "optimizers", None) or [None])
    return captured.eager_reason(pl_module.device, optimizers[0], trainer.world_size, trainer.strategy.model,
                                 trainer.accumulate_grad_batches) is None


class LargestBatchProbe(L.Callback):
    """Runs forward + backward on the ``batches`` largest training batches at fit start, after
    sizing the training budget to the device when ``fill_device`` says so (module docstring).

    Needs a datamodule with ``largest_train_batches(k)`` (and, to fill the device,
    ``pessimistic_batch``, ``budget_ceiling``, ``set_train_budget``). On failure (e.g. CUDA out of
    memory) it raises a ``RuntimeError`` naming the batch shape and the ``data.max_frames_per_batch``
    to lower, instead of failing hours later.

    Args:
        batches: the largest training batches tried.
        fill_device: ``auto`` (on a GPU), true or false: search the largest budget the device holds.
        margin: the share taken off the largest budget that fitted (memory the search's batch does
            not show: optimiser state, the allocator's fragmentation over a run, other shapes).
        tolerance: the search stops within this share of the largest budget that fits.
        ceiling: the largest budget set (priced frames); None: the datamodule's ``budget_ceiling``.
        max_growth: the largest budget set as a multiple of ``data.max_frames_per_batch``, the
            budget the recipe's learning rate and schedule were chosen at (module docstring);
            None: only ``ceiling`` bounds it.
    """

    def __init__(self, batches: int = 1, fill_device: bool | str = "auto", margin: float = 0.15,
                 tolerance: float = 0.05, ceiling: int | None = None, max_growth: float | None = MAX_GROWTH):
        super().__init__()
        if fill_device not in (True, False, "auto"):
            raise ValueError(f"LargestBatchProbe fill_device={fill_device!r}; expected auto, true or false")
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"LargestBatchProbe margin={margin}; expected within [0, 1)")
        if max_growth is not None and not float(max_growth) >= 1.0:
            raise ValueError(f"LargestBatchProbe max_growth={max_growth}; expected ≥ 1 (or null: no bound)")
        self.max_growth = None if max_growth is None else float(max_growth)
        self.batches = batches
        self.fill_device, self.margin, self.tolerance, self.ceiling = fill_device, float(margin), float(tolerance), ceiling
        self.found: int | None = None  # the budget the search set (None: no search)

    def _attempt(self, trainer: L.Trainer, pl_module: L.LightningModule,
                 hold_graphs: bool = False) -> Callable[[int], None]:
        datamodule = trainer.datamodule

        def attempt(budget: int) -> None:
            batch = pl_module.transfer_batch_to_device(datamodule.pessimistic_batch(budget), pl_module.device, 0)
            try:
                forward_backward(trainer, pl_module, batch, hold_graphs)
            finally:
                del batch
                _release(pl_module.device)

        return attempt

    def fill(self, trainer: L.Trainer, pl_module: L.LightningModule,
             attempt: Callable[[int], object] | None = None) -> int | None:
        """Search and set the training budget the device holds (module docstring); returns it
        (None: the search found none, and the config's budget stays). ``attempt``: what tries a
        budget (default: a forward and backward of the pessimistic batch on the module)."""
        datamodule = trainer.datamodule
        start = int(datamodule.max_frames_per_batch)
        ceiling, bound = int(self.ceiling or datamodule.budget_ceiling()), "the corpus's ceiling"
        if self.max_growth is not None and start * self.max_growth < ceiling:
            ceiling = int(start * self.max_growth)
            bound = f"max_growth {self.max_growth:g} × data.max_frames_per_batch"
        held = attempt is None and graphs_held(trainer, pl_module)
        was_training = pl_module.training
        pl_module.train()
        try:  # up to the ceiling plus the margin: a budget at the ceiling keeps the margin free too
            found = largest_fitting(attempt or self._attempt(trainer, pl_module, held), start,
                                    math.ceil(ceiling / (1.0 - self.margin)), self.tolerance)
        finally:
            pl_module.train(was_training)
        if found is None:
            log.warning("fill_device: no batch of the longest training utterances fits the device; "
                        "data.max_frames_per_batch=%d stays", start)
            return None
        budget = max(1, min(ceiling, int(found * (1.0 - self.margin))))
        twice = " twice, the first's memory held (captured steps keep a step's memory in their graphs)" if held else ""
        if budget == ceiling:
            why = f"{bound}, which ran forward and backward{twice} with a {100 * self.margin:.0f}% margin"
        else:
            why = (f"the largest budget in which {found} frames of the longest training utterances ran forward and "
                   f"backward{twice} without running out of memory, less a {100 * self.margin:.0f}% margin")
        log.info("batch budget %d frames on %s: %s (data.max_frames_per_batch=%d is the config's, for a CPU; "
                 "callbacks.largest_batch_probe.fill_device=false keeps it)", budget, pl_module.device, why, start)
        datamodule.set_train_budget(budget)
        self.found = budget
        return budget

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        datamodule = trainer.datamodule
        if self.batches < 1 or trainer.fast_dev_run or not hasattr(datamodule, "largest_train_batches"):
            return
        fill = self.fill_device is True or (self.fill_device == "auto" and pl_module.device.type == "cuda")
        if fill and hasattr(datamodule, "pessimistic_batch"):
            self.fill(trainer, pl_module)
        held = graphs_held(trainer, pl_module)
        was_training = pl_module.training
        pl_module.train()
        for batch in datamodule.largest_train_batches(self.batches):
            if not batch["ids"]:  # every utterance of it skipped for bad audio
                continue
            batch = pl_module.transfer_batch_to_device(batch, pl_module.device, 0)
            shape = tuple(batch["features"].shape)
            start = time.perf_counter()
            try:
                forward_backward(trainer, pl_module, batch, held)
            except torch.OutOfMemoryError as err:
                beside = " beside a captured step's graphs (capture_steps=false runs every step eagerly)" if held else ""
                raise RuntimeError(
                    f"the largest training batch {shape} (batch, frames, bins) does not fit in memory{beside}; "
                    f"lower data.max_frames_per_batch (now {getattr(datamodule, 'max_frames_per_batch', '?')})"
                ) from err
            log.info(
                "largest batch %s: forward+backward %.2f s, peak memory %.0f MiB",
                shape, time.perf_counter() - start, peak_memory_mb(pl_module.device),
            )
        pl_module.train(was_training)
