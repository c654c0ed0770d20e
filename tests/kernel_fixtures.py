"""Inputs shared by the kernel tests (imported as a module: ``from kernel_fixtures import ...``)."""

from __future__ import annotations

import torch


def clustered_codes(B: int, H: int, N: int, centres: int, flip: float, g: torch.Generator) -> torch.Tensor:
    """``(B, H, N)`` codes near ``centres`` random 62-bit centres a sequence, each bit flipped
    with probability ``flip``: codes K-means settles on within a few iterations."""
    base = torch.randint(0, 2**62, (B, H, centres), generator=g)
    near = base.gather(2, torch.randint(0, centres, (B, H, N), generator=g))
    flips = (torch.rand(B, H, N, 62, generator=g) < flip).long()
    return near ^ (flips << torch.arange(62)).sum(-1)
