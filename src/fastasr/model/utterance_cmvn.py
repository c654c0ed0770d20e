"""Per-utterance mean and variance normalisation of features (``model.utterance_cmvn``).

Global CMVN (statistics of the whole training set) leaves each recording's channel and
level in the features: a microphone's spectral tilt, a quieter speaker, a compressed
dynamic range. With few training speakers a model learns those as cues and fails on a new
speaker's recordings. Normalising each utterance by its own per-bin mean and standard
deviation, over its valid frames, removes them (Kaldi's per-utterance CMVN; on the FSDD
digits corpus, docs/results/fsdd/RESULTS.md, it lowered dev CER from 35 % to 28 % after 8 epochs).
"""

from __future__ import annotations

import torch
from torch import nn


class UtteranceCMVN(nn.Module):
    """``(x - mean_u) / std_u`` per utterance ``u`` and feature bin, statistics over the
    utterance's valid frames only; frames at index ≥ its length are set to 0.

    Args:
        min_std: floor of the standard deviation (a bin that is constant over an
            utterance, e.g. digital silence, is centred but not blown up).
    """

    def __init__(self, min_std: float = 1e-3) -> None:
        super().__init__()
        if min_std <= 0:
            raise ValueError(f"UtteranceCMVN: min_std {min_std}; expected > 0")
        self.min_std = float(min_std)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """``x (B, T, F)``, ``lengths (B,)`` valid frames (None: all T) → normalised ``(B, T, F)``."""
        B, T, _ = x.shape
        if lengths is None:
            lengths = torch.full((B,), T, device=x.device)
        valid = (torch.arange(T, device=x.device)[None, :] < lengths.to(x.device)[:, None])[..., None]
        count = valid.sum(1, keepdim=True).clamp_min(1).to(x.dtype)  # (B, 1, 1)
        mean = x.masked_fill(~valid, 0.0).sum(1, keepdim=True) / count
        centred = (x - mean).masked_fill(~valid, 0.0)
        std = (centred.pow(2).sum(1, keepdim=True) / count).sqrt().clamp_min(self.min_std)
        return centred / std

    def extra_repr(self) -> str:
        return f"min_std={self.min_std}"
