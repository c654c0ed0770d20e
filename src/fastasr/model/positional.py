"""How the encoder knows where a frame is: added sinusoids, rotary queries and keys, or nothing.

``model.positions`` chooses one of :data:`POSITIONS`:

* ``absolute``: fixed sin/cos positions added to the input of the encoder (Vaswani et al. 2017),
  as in the clustered-attention paper's models. A model trained on 8-second utterances has
  never seen the positions of an hour-long recording.
* ``rotary``: queries and keys rotated by their position (RoFormer, Su et al. 2021), so a
  query-key score depends on their offset and not on where they are; applied inside every
  attention layer, before the inner attention, so every attention variant sees it.
* ``none``: no position signal at all; order comes only from the convolutions (the subsampling
  front end and ``model.conv_kernel``'s modules). Attention is then a function of content
  alone, which is what clustering approximates, and no position of a long recording is new.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fastasr.kernels.layers.dropout import Dropout

POSITIONS = ("absolute", "rotary", "none")


def _frequencies(dim: int, device: torch.device) -> torch.Tensor:
    """The ``dim / 2`` geometric frequencies 10000^(-2i/dim) of sinusoidal and rotary positions."""
    return torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))


class _AngleTable:
    """cos and sin of the (length, dim / 2) angles position × frequency, cached and grown on
    demand (any length), so a forward pass computes no trigonometry; while a model is exported to
    ONNX, computed from the length in the graph instead (no table of a fixed size is baked in)."""

    def __init__(self, dim: int):
        self.dim = dim
        self._cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.onnx.is_in_onnx_export():  # the exported graph computes the angles of any length
            angles = torch.arange(length, device=device, dtype=torch.float32)[:, None] * _frequencies(self.dim, device)
            return angles.cos(), angles.sin()
        cached = self._cos_sin
        if cached is None or cached[0].shape[0] < length or cached[0].device != device:
            size = max(length, 1024 if cached is None else 2 * cached[0].shape[0])
            angles = torch.arange(size, device=device, dtype=torch.float32)[:, None] * _frequencies(self.dim, device)
            self._cos_sin = cached = (angles.cos(), angles.sin())
        return cached[0][:length], cached[1][:length]


class SinusoidalPositionalEncoding(nn.Module):
    """Adds fixed sin/cos positions to ``x`` of shape (B, T, D); any T, computed on demand.

    The table is cached and grown when a longer input arrives, so there is no maximum length to
    configure.
    """

    def __init__(self, d_model: int, dropout: float = 0.0):
        super().__init__()
        if d_model % 2:
            raise ValueError(f"d_model must be even for sinusoidal positions, got {d_model}")
        self.d_model = d_model
        self.dropout = Dropout(dropout)
        self._angles = _AngleTable(d_model)

    def table(self, length: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The (length, d_model) position table: sin in the even columns, cos in the odd."""
        cos, sin = self._angles(length, device)
        return torch.stack((sin, cos), dim=-1).flatten(-2).to(dtype)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """``x`` plus the positions ``offset .. offset + T - 1`` (a streamed chunk starts past 0)."""
        return self.dropout(x + self.table(offset + x.shape[1], x.device, x.dtype)[offset:])


class RotaryPositions(nn.Module):
    """Rotates queries or keys ``(B, H, N, E)`` by their position (RoPE, Su et al. 2021).

    Each pair of channels ``(2i, 2i+1)`` of a head turns by ``n · 10000^(-2i/E)`` at position
    ``n``, so ``rotate(q)_n · rotate(k)_m`` depends on ``q``, ``k`` and ``n - m`` only. No
    parameters; any length. One instance serves every layer of an encoder (one table).
    """

    def __init__(self, head_dim: int):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary positions need an even head dimension, got {head_dim}")
        self._angles = _AngleTable(head_dim)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """``x`` turned by the positions ``offset .. offset + N - 1``."""
        cos, sin = (t[offset:].to(x.dtype) for t in self._angles(offset + x.shape[-2], x.device))
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def check_positions(positions: str) -> str:
    """``positions`` if it is one of :data:`POSITIONS`; otherwise a ``ValueError`` naming it."""
    if positions not in POSITIONS:
        raise ValueError(f"model.positions={positions!r}; expected one of {POSITIONS}")
    return positions
