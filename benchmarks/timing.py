"""The benchmarks' one timer: every script times through this module.

    from benchmarks import timing

    t = timing.measure(call, warmup=2, repeats=20, device="cuda")   # Timing of 20 calls
    t.median_ms, t.min_ms, t.max_ms, t.samples

    clock = timing.Clock(device)        # wall clock: a training step, an epoch, a whole run
    ...
    seconds = clock.seconds()

How a call is timed, by where it runs:

- on a CUDA device, by CUDA events recorded around the call, read once the end event has
  completed: the GPU's time for the work the call queued (the host's time to queue it counts
  only where the GPU waits for the host);
- elsewhere (or with ``clock="wall"``), by ``time.perf_counter`` around the call, the device's
  queue drained before the start and before the stop: the wall time the caller waits.

:func:`measure` runs ``warmup`` untimed calls first (compilation, the allocator, caches), then
``repeats`` timed ones, or, given ``target_s``, timed calls until their times add up to
``target_s`` (at least ``repeats``, at most ``max_repeats``). A result is the median of its
samples; the minimum and maximum say how much they spread.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """The times of a call's timed repeats, milliseconds each, in the order taken."""

    samples: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples)

    @property
    def min_ms(self) -> float:
        return min(self.samples)

    @property
    def max_ms(self) -> float:
        return max(self.samples)

    @property
    def count(self) -> int:
        return len(self.samples)


def is_cuda(device) -> bool:
    """True where ``device`` (a ``torch.device``, a string such as ``"cuda:0"``, or None: the CPU)
    is a CUDA device."""
    if device is None:
        return False
    return str(getattr(device, "type", device)).split(":")[0] == "cuda"


def synchronize(device) -> None:
    """Wait for the work queued on ``device`` (nothing to wait for off CUDA)."""
    if is_cuda(device):
        import torch

        torch.cuda.synchronize(device)


class Clock:
    """Wall-clock time since it was made (``time.perf_counter``). With a CUDA ``device`` the
    device's queue is drained before the start and before each reading, so a reading covers the
    work queued in between."""

    def __init__(self, device=None):
        self.device = device
        synchronize(device)
        self.start = time.perf_counter()

    def seconds(self) -> float:
        synchronize(self.device)
        return time.perf_counter() - self.start

    def ms(self) -> float:
        return 1e3 * self.seconds()


def time_once(fn: Callable[[], object], device=None, clock: str = "auto") -> float:
    """Milliseconds of one call of ``fn()``: CUDA events on a CUDA ``device`` (``clock="auto"``),
    else :class:`Clock`'s wall time (``clock="wall"``, or off CUDA)."""
    if clock not in ("auto", "wall"):
        raise ValueError(f"clock must be 'auto' or 'wall', got {clock!r}")
    if clock == "auto" and is_cuda(device):
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    watch = Clock(device)
    fn()
    return watch.ms()


def measure(fn: Callable[[], object], *, warmup: int = 1, repeats: int = 5, device=None,
            target_s: float | None = None, max_repeats: int | None = None, clock: str = "auto") -> Timing:
    """``fn()`` timed: ``warmup`` untimed calls, then ``repeats`` timed ones (:func:`time_once`);
    given ``target_s``, timed calls go on until their times add up to ``target_s`` seconds,
    ``max_repeats`` at most (default: ``repeats``, so no more than asked)."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    for _ in range(warmup):
        fn()
    synchronize(device)
    most = max(repeats, max_repeats if max_repeats is not None else repeats)
    samples: list[float] = []
    while len(samples) < most:
        if len(samples) >= repeats and (target_s is None or sum(samples) >= 1e3 * target_s):
            break
        samples.append(time_once(fn, device, clock))
    return Timing(tuple(samples))
