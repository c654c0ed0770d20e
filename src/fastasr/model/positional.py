"""Fixed sinusoidal positional encoding (Vaswani et al. 2017), as in the clustered-attention ASR models."""

from __future__ import annotations

import math

import torch
from torch import nn


class SinusoidalPositionalEncoding(nn.Module):
    """Adds fixed sin/cos positions to ``x`` of shape (B, T, D); any T, computed on demand.

    The table is cached per (T, device, dtype) and grown when a longer input arrives,
    so there is no maximum length to configure.
    """

    def __init__(self, d_model: int, dropout: float = 0.0):
        super().__init__()
        if d_model % 2:
            raise ValueError(f"d_model must be even for sinusoidal positions, got {d_model}")
        self.d_model = d_model
        self.dropout = nn.Dropout(dropout)
        self._table: torch.Tensor | None = None

    def table(self, length: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The (length, d_model) position table."""
        cached = self._table
        if cached is None or cached.shape[0] < length or cached.device != device:
            size = max(length, 1024 if cached is None else 2 * cached.shape[0])
            pos = torch.arange(size, device=device, dtype=torch.float32)[:, None]
            freq = torch.exp(
                torch.arange(0, self.d_model, 2, device=device, dtype=torch.float32)
                * (-math.log(10000.0) / self.d_model)
            )
            tab = torch.zeros(size, self.d_model, device=device)
            tab[:, 0::2] = torch.sin(pos * freq)
            tab[:, 1::2] = torch.cos(pos * freq)
            self._table = cached = tab
        return cached[:length].to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(x + self.table(x.shape[1], x.device, x.dtype))
