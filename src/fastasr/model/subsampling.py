"""Optional convolutional frame subsampling (off by default: the paper feeds every frame)."""

from __future__ import annotations

import torch
from torch import nn


class ConvSubsampling(nn.Module):
    """Stack of stride-2 Conv2d layers over (time, frequency) that reduces frames by ``factor``.

    ``factor`` must be 1 (identity: a linear projection only), 2, 4 or 8.
    Input (B, T, F) with lengths (B,); output (B, T', d_model) with lengths (B,).
    """

    def __init__(self, feat_in: int, d_model: int, factor: int = 1, channels: int = 64):
        super().__init__()
        if factor not in (1, 2, 4, 8):
            raise ValueError(f"model.subsampling must be one of 1, 2, 4, 8; got {factor}")
        self.factor = factor
        n_conv = factor.bit_length() - 1
        layers: list[nn.Module] = []
        in_ch, freq = 1, feat_in
        for _ in range(n_conv):
            layers += [nn.Conv2d(in_ch, channels, kernel_size=3, stride=2, padding=1), nn.ReLU()]
            in_ch, freq = channels, (freq + 1) // 2
        self.conv = nn.Sequential(*layers)
        self.proj = nn.Linear(in_ch * freq, d_model)

    def out_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """Frames after subsampling for input lengths (each conv: ceil(T / 2))."""
        for _ in range(self.factor.bit_length() - 1):
            lengths = torch.div(lengths + 1, 2, rounding_mode="floor")
        return lengths

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.factor == 1:
            return self.proj(x), lengths
        y = self.conv(x.unsqueeze(1))  # (B, C, T', F')
        b, c, t, f = y.shape
        y = self.proj(y.transpose(1, 2).reshape(b, t, c * f))
        return y, self.out_lengths(lengths)
