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

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None,
                prefix_ends: torch.Tensor | None = None) -> torch.Tensor:
        """``x (B, T, F)``, ``lengths (B,)`` valid frames (None: all T) → normalised ``(B, T, F)``.

        ``prefix_ends (T,)``: frame ``t`` is normalised by the statistics of the utterance's frames
        before ``prefix_ends[t]`` only (what a stream has heard by the end of ``t``'s chunk:
        :meth:`fastasr.model.chunking.ChunkContext.prefix_ends`), from running sums
        (:class:`PrefixStatistics`); None: of the whole utterance."""
        B, T, _ = x.shape
        if lengths is None:
            lengths = torch.full((B,), T, device=x.device)
        valid = (torch.arange(T, device=x.device)[None, :] < lengths.to(x.device)[:, None])[..., None]
        if prefix_ends is not None:
            return self._by_prefix(x, lengths.to(x.device), valid, prefix_ends)
        count = valid.sum(1, keepdim=True).clamp_min(1).to(x.dtype)  # (B, 1, 1)
        mean = x.masked_fill(~valid, 0.0).sum(1, keepdim=True) / count
        centred = (x - mean).masked_fill(~valid, 0.0)
        std = (centred.pow(2).sum(1, keepdim=True) / count).sqrt().clamp_min(self.min_std)
        return centred / std

    def _by_prefix(self, x: torch.Tensor, lengths: torch.Tensor, valid: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        wide = x.double().masked_fill(~valid, 0.0)
        sums, squares = wide.cumsum(1), wide.pow(2).cumsum(1)
        last = (torch.minimum(ends.to(x.device)[None, :], lengths[:, None]) - 1).clamp_min(0)  # (B, T)
        pick = last[..., None].expand(-1, -1, x.shape[2])
        stats = PrefixStatistics(sums.gather(1, pick), squares.gather(1, pick), (last + 1)[..., None].double())
        return stats.normalise(x, self.min_std).masked_fill(~valid, 0.0)

    def extra_repr(self) -> str:
        return f"min_std={self.min_std}"


class PrefixStatistics:
    """Running sums of an utterance's frames (float64): ``sums``, ``squares`` and ``count``,
    broadcastable against frames ``(B, T, F)``. :meth:`normalise` centres and scales by them
    (variance ``squares / count - mean²``), as a stream does with the frames it has heard."""

    def __init__(self, sums: torch.Tensor, squares: torch.Tensor, count: torch.Tensor | float) -> None:
        self.sums, self.squares, self.count = sums, squares, count

    @classmethod
    def empty(cls, dim: int, device: torch.device | str = "cpu") -> PrefixStatistics:
        zeros = torch.zeros(1, 1, dim, dtype=torch.float64, device=device)
        return cls(zeros, zeros.clone(), 0.0)

    def add(self, x: torch.Tensor) -> None:
        """Add the frames ``x (1, T, F)``."""
        wide = x.double()
        self.sums = self.sums + wide.sum(1, keepdim=True)
        self.squares = self.squares + wide.pow(2).sum(1, keepdim=True)
        self.count = self.count + x.shape[1]

    def normalise(self, x: torch.Tensor, min_std: float) -> torch.Tensor:
        count = torch.as_tensor(self.count, dtype=torch.float64).clamp_min(1)
        mean = self.sums / count
        std = (self.squares / count - mean.pow(2)).clamp_min(0).sqrt().clamp_min(min_std)
        return ((x.double() - mean) / std).to(x.dtype)
