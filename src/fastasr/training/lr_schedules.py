"""Learning-rate schedules from the ``scheduler`` config group (``conf/scheduler``).

A scheduler config is a Hydra partial of a torch LR scheduler (``_target_``, its arguments),
the Lightning keys ``monitor``/``interval``/``frequency``, and optionally a linear warm-up:

    warmup_steps: 300            # updates; the rate rises linearly to ``optim.lr`` over them
    warmup_start_factor: 0.01    # the first update's rate, as a fraction of ``optim.lr``

The warm-up is torch's :class:`~torch.optim.lr_scheduler.LinearLR`, stepped after every
update; the main schedule (e.g. :class:`~torch.optim.lr_scheduler.ReduceLROnPlateau`,
stepped after each validation epoch) is a second scheduler on the same optimiser. Both
scale the rate multiplicatively, so they compose: a plateau halving during the warm-up
halves the rest of the ramp too, and after the warm-up LinearLR leaves the rate alone.
A config with warm-up keys but no ``_target_`` is a warm-up to a constant rate.

**Budget schedules** (``conf/scheduler/budget.yaml``: :class:`BudgetSchedule`) follow the
fraction of the run's budget already spent instead of epochs or validation losses: warm-up
over ``warmup_steps`` updates, then the peak rate, then a decay to ``final_factor`` × peak over
the last ``decay_fraction`` of the budget. The budget is whichever of ``trainer.max_time``,
``trainer.max_steps`` and ``trainer.max_epochs`` ends the run first
(:func:`budget_progress`); ``max_time`` is read from Lightning's Timer, whose elapsed time is
in every checkpoint, so a resumed run continues the schedule where it stopped. A run whose
budget is doubled decays over twice the time: the shape does not depend on the machine's speed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from hydra.utils import get_class, instantiate
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LinearLR, LRScheduler

# Lightning keys of a scheduler config; the rest goes to the scheduler's constructor.
LIGHTNING_KEYS = ("monitor", "interval", "frequency")
WARMUP_KEYS = ("warmup_steps", "warmup_start_factor")


def linear_warmup(optimizer: Optimizer, steps: int, start_factor: float = 0.01) -> LinearLR:
    """Rate ``lr × (start_factor + (1 - start_factor) × min(t, steps) / steps)`` at update ``t``
    (0-based), stepped once per update; ``lr`` is each parameter group's rate at construction."""
    if steps < 1:
        raise ValueError(f"scheduler.warmup_steps {steps}; expected ≥ 1 (or leave it out for no warm-up)")
    if not 0.0 < start_factor <= 1.0:
        raise ValueError(f"scheduler.warmup_start_factor {start_factor}; expected within (0, 1]")
    return LinearLR(optimizer, start_factor=start_factor, end_factor=1.0, total_iters=int(steps))


def build_lr_schedulers(optimizer: Optimizer, config: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Lightning ``lr_scheduler`` configs (``{"scheduler": ..., "interval": ...}``) for
    ``optimizer`` from a ``conf/scheduler`` mapping; ``[]`` for a constant rate (empty config).

    The main scheduler comes first, with its Lightning keys; the warm-up (when ``warmup_steps``
    is set and > 0) follows, interval ``step``.
    """
    cfg = dict(config or {})
    lightning_keys = {k: cfg.pop(k) for k in LIGHTNING_KEYS if k in cfg}
    # a BudgetSchedule warms up itself; other schedulers get torch's LinearLR beside them
    own_warmup = "_target_" in cfg and issubclass(get_class(cfg["_target_"]), BudgetSchedule)
    warmup = {} if own_warmup else {k: cfg.pop(k) for k in WARMUP_KEYS if k in cfg}
    schedulers: list[dict[str, Any]] = []
    if "_target_" in cfg:
        schedulers.append({"scheduler": instantiate(cfg)(optimizer=optimizer), **lightning_keys})
    elif cfg:
        raise ValueError(f"scheduler config has keys {sorted(cfg)} but no _target_; "
                         "expected a torch LR scheduler (conf/scheduler/plateau.yaml) or only warm-up keys")
    steps = warmup.get("warmup_steps") or 0
    if steps:
        start = warmup.get("warmup_start_factor", 0.01)
        schedulers.append({"scheduler": linear_warmup(optimizer, int(steps), float(start)), "interval": "step"})
    return schedulers


DECAYS = ("linear", "cosine")


class BudgetSchedule(LRScheduler):
    """Warm-up, hold, decay by the fraction of the training budget spent; stepped per update.

    The rate of update ``t`` (0-based) with budget fraction ``p`` spent is ``lr × w(t) × d(p)``:

    * ``w(t) = start + (1 - start) × min(t, warmup_steps) / warmup_steps`` (1 without warm-up);
    * ``d(p) = 1`` while ``p ≤ 1 - decay_fraction``, then falls (``linear`` or ``cosine``) to
      ``final_factor`` at ``p = 1``.

    ``progress`` is a callable returning ``p`` in [0, 1]; the LightningModule sets it to
    :func:`budget_progress` of its trainer. Until it is set ``p`` is 0 (peak rate after warm-up).
    """

    def __init__(self, optimizer: Optimizer, warmup_steps: int = 200, warmup_start_factor: float = 0.01,
                 decay_fraction: float = 1.0, final_factor: float = 0.01, decay: str = "linear",
                 progress: Callable[[], float] | None = None, last_epoch: int = -1):
        if warmup_steps < 0:
            raise ValueError(f"scheduler.warmup_steps {warmup_steps}; expected ≥ 0")
        if not 0.0 < warmup_start_factor <= 1.0:
            raise ValueError(f"scheduler.warmup_start_factor {warmup_start_factor}; expected within (0, 1]")
        if not 0.0 <= decay_fraction <= 1.0:
            raise ValueError(f"scheduler.decay_fraction {decay_fraction}; expected within [0, 1]")
        if not 0.0 <= final_factor <= 1.0:
            raise ValueError(f"scheduler.final_factor {final_factor}; expected within [0, 1]")
        if decay not in DECAYS:
            raise ValueError(f"scheduler.decay {decay!r}; expected one of {DECAYS}")
        self.warmup_steps, self.warmup_start_factor = int(warmup_steps), float(warmup_start_factor)
        self.decay_fraction, self.final_factor, self.decay = float(decay_fraction), float(final_factor), decay
        self.progress = progress
        super().__init__(optimizer, last_epoch)

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in super().state_dict().items() if k != "progress"}

    def factor(self, step: int, progress: float) -> float:
        """``w(step) × d(progress)`` (see the class docstring)."""
        warm = 1.0
        if self.warmup_steps and step < self.warmup_steps:
            warm = self.warmup_start_factor + (1.0 - self.warmup_start_factor) * step / self.warmup_steps
        p = min(max(float(progress), 0.0), 1.0)
        start = 1.0 - self.decay_fraction
        if p <= start or self.decay_fraction == 0.0:
            return warm
        x = (p - start) / self.decay_fraction  # 0 → 1 over the decay
        shape = 1.0 - x if self.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * x))
        return warm * (self.final_factor + (1.0 - self.final_factor) * shape)

    def get_lr(self) -> list[float]:
        p = self.progress() if self.progress is not None else 0.0
        return [base * self.factor(self.last_epoch, p) for base in self.base_lrs]


def budget_progress(trainer) -> float:
    """The fraction (0–1) of a Lightning trainer's budget spent: the largest of elapsed training
    time / ``max_time``, ``global_step`` / ``max_steps`` and epochs done / ``max_epochs`` (a
    budget that is not set counts 0). Training time is Lightning's Timer (restored on resume)."""
    from lightning.pytorch.callbacks import Timer

    fractions = [0.0]
    for cb in trainer.callbacks:
        remaining = cb.time_remaining("train") if isinstance(cb, Timer) else None
        if remaining is not None:
            elapsed = cb.time_elapsed("train")
            fractions.append(elapsed / max(elapsed + remaining, 1e-9))
    if trainer.max_steps and trainer.max_steps > 0:
        fractions.append(trainer.global_step / trainer.max_steps)
    if trainer.max_epochs and trainer.max_epochs > 0:
        batches = trainer.num_training_batches
        within = trainer.fit_loop.epoch_loop.batch_progress.current.ready / batches \
            if isinstance(batches, int) and batches > 0 else 0.0
        fractions.append((trainer.current_epoch + min(within, 1.0)) / trainer.max_epochs)
    return min(max(fractions), 1.0)
