"""Launch arithmetic on the host: ceiling division and powers of two for grids and block sizes.

Triton 3.6 makes ``triton.cdiv`` and ``triton.next_power_of_2`` constexpr functions, callable
in a kernel and on the host alike; a host call goes through the constexpr wrapper (its
arguments unwrapped one by one) and takes about 2 µs, against 0.07 µs for the integer
expressions here (``timeit`` on a 2-core Xeon). The launchers size every launch with them: one
i-clustered forward + backward made 49 such calls, about 0.1 ms of the host's time a layer that
a training step issuing its kernels one by one waits for where the host is behind the GPU.
Kernels keep ``tl.cdiv``. :func:`multiprocessors` sizes the launches of a fixed number of
programs an SM.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["cdiv", "next_power_of_2", "multiprocessors"]


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers, ``b > 0``: ``triton.cdiv``'s value."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two at least ``n`` (0 for ``n <= 0``): ``triton.next_power_of_2``'s
    value."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


@functools.cache
def multiprocessors(device: torch.device) -> int:
    """The SMs of a CUDA ``device`` (asked once a device); 4 elsewhere (the CPU's interpreter)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
