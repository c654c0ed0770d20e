"""The model's own front end: global CMVN, SpecAugment and convolutional frame subsampling.

These are ``nn.Module``s inside :class:`fastasr.model.CTCModel` (as NeMo's models own their
preprocessor and spec-augment): the CMVN statistics are buffers, so they travel inside every
checkpoint, and SpecAugment follows ``model.train()`` / ``model.eval()``. The filterbank
itself and the statistics pass over a training set are data-side (``fastasr.data.features``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torchaudio.functional as AF
from torch import nn

from fastasr.kernels.layers.linear import Linear


class GlobalCMVN(nn.Module):
    """``(x - mean) / std`` per feature dimension; ``mean``/``std`` are buffers,
    so they are saved in (and restored from) the model's state dict."""

    def __init__(self, dim: int | None = None, mean: torch.Tensor | Sequence[float] | None = None,
                 std: torch.Tensor | Sequence[float] | None = None) -> None:
        super().__init__()
        if mean is None and dim is None:
            raise ValueError("GlobalCMVN: give dim or mean/std")
        mean = torch.as_tensor(mean, dtype=torch.float32) if mean is not None else torch.zeros(dim)
        std = torch.as_tensor(std, dtype=torch.float32) if std is not None else torch.ones(mean.shape[0])
        if mean.shape != std.shape or mean.dim() != 1:
            raise ValueError(f"GlobalCMVN: mean {tuple(mean.shape)} and std {tuple(std.shape)}; expected equal (F,)")
        if dim is not None and mean.shape[0] != dim:
            raise ValueError(f"GlobalCMVN: statistics of dim {mean.shape[0]}; expected {dim}")
        self.register_buffer("mean", mean.clone())
        self.register_buffer("std", std.clone())

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """``x (B, T, F)`` → normalised ``(B, T, F)``; frames at index ≥ ``lengths`` are set to 0."""
        y = (x - self.mean) / self.std
        if lengths is not None:
            valid = torch.arange(x.shape[1], device=x.device)[None, :] < lengths.to(x.device)[:, None]
            y = y.masked_fill(~valid[..., None], 0.0)
        return y

    def extra_repr(self) -> str:
        return f"dim={self.mean.shape[0]}"


class SpecAugment(nn.Module):
    """Frequency and time masking (Park et al. 2019) on ``(B, T, F)``; identity in eval mode.

    Frequency masks: ``freq_masks`` bands of up to ``freq_width`` bins, drawn
    independently per utterance (``torchaudio.functional.mask_along_axis_iid``).
    Time masks: ``time_masks`` spans of up to ``min(time_width, max_time_ratio ×
    length)`` frames per utterance, placed inside the utterance's valid frames
    (the same sampling rule as torchaudio's, but with each utterance's own
    length, so masks never fall on padding and short utterances are not wiped
    out). Masked values are ``mask_value`` (0 = the mean after CMVN).
    """

    def __init__(self, freq_masks: int = 2, freq_width: int = 27, time_masks: int = 2, time_width: int = 40,
                 max_time_ratio: float = 0.2, mask_value: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= max_time_ratio <= 1.0:
            raise ValueError(f"SpecAugment: max_time_ratio {max_time_ratio}; expected within [0, 1]")
        self.freq_masks, self.freq_width = int(freq_masks), int(freq_width)
        self.time_masks, self.time_width = int(time_masks), int(time_width)
        self.max_time_ratio, self.mask_value = float(max_time_ratio), float(mask_value)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """``x (B, T, F)``, ``lengths (B,)`` valid frames → masked copy ``(B, T, F)`` (in training)."""
        if not self.training:
            return x
        B, T, _ = x.shape
        if self.freq_masks > 0 and self.freq_width > 0:
            spec = x.transpose(1, 2)  # (B, F, T): mask_along_axis_iid wants (..., freq, time)
            for _ in range(self.freq_masks):
                spec = AF.mask_along_axis_iid(spec, self.freq_width, self.mask_value, axis=1)
            x = spec.transpose(1, 2)
        if self.time_masks > 0 and self.time_width > 0:
            lengths = (torch.full((B,), T, device=x.device) if lengths is None else lengths.to(x.device)).float()
            max_w = torch.minimum(torch.full_like(lengths, float(self.time_width)),
                                  torch.floor(lengths * self.max_time_ratio))
            frames = torch.arange(T, device=x.device, dtype=torch.float32)[None, :]
            mask = torch.zeros(B, T, dtype=torch.bool, device=x.device)
            for _ in range(self.time_masks):
                width = torch.floor(torch.rand(B, device=x.device) * (max_w + 1)).clamp_max(max_w)
                start = torch.floor(torch.rand(B, device=x.device) * (lengths - width + 1))
                start = torch.minimum(start, (lengths - width).clamp_min(0))
                mask |= (frames >= start[:, None]) & (frames < (start + width)[:, None])
            x = x.masked_fill(mask[..., None], self.mask_value)
        return x

    def extra_repr(self) -> str:
        return (f"freq_masks={self.freq_masks}, freq_width={self.freq_width}, time_masks={self.time_masks}, "
                f"time_width={self.time_width}, max_time_ratio={self.max_time_ratio}")


class ConvSubsampling(nn.Module):
    """Stride-2 Conv2d layers over (time, frequency) that reduce frames by ``factor``
    (optional: the paper feeds every frame).

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
        self.proj = Linear(in_ch * freq, d_model)

    def out_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """Frames after subsampling for input lengths (each conv: ceil(T / 2))."""
        for _ in range(self.factor.bit_length() - 1):
            lengths = torch.div(lengths + 1, 2, rounding_mode="floor")
        return lengths

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.factor == 1:
            return self.proj(x), lengths
        y = x.unsqueeze(1)  # (B, 1, T, F)
        stage = lengths.to(x.device)
        for i in range(0, len(self.conv), 2):  # (conv, ReLU) pairs
            y = self.conv[i + 1](self.conv[i](y))
            # zero the frames past each utterance's end (ReLU(bias) there would reach the last valid
            # frame through the next conv): an utterance gives the same output padded or alone
            stage = torch.div(stage + 1, 2, rounding_mode="floor")
            valid = torch.arange(y.shape[2], device=y.device)[None, :] < stage[:, None]
            y = y * valid[:, None, :, None].to(y.dtype)
        # y: (B, C, T', F')
        b, c, t, f = y.shape
        y = self.proj(y.transpose(1, 2).reshape(b, t, c * f))
        return y, self.out_lengths(lengths)
