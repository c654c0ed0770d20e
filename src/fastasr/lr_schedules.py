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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hydra.utils import instantiate
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LinearLR

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
    warmup = {k: cfg.pop(k) for k in WARMUP_KEYS if k in cfg}
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
