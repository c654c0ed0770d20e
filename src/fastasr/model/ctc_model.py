"""The CTC acoustic model: CMVN [→ per-utterance CMVN] → SpecAugment → [subsampling] → positions → encoder → CTC head."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from fastasr.data.features import GlobalCMVN, SpecAugment
from fastasr.model.encoder import AttentionSpec, TransformerEncoder
from fastasr.model.positional import SinusoidalPositionalEncoding
from fastasr.model.subsampling import ConvSubsampling
from fastasr.model.utterance_cmvn import UtteranceCMVN


class CTCModel(nn.Module):
    """Transformer-encoder CTC recogniser with a pluggable attention.

    Args:
        vocab_size: output units including the CTC blank (index 0).
        feat_in: feature dimension (filterbank bins).
        d_model, heads, ff_dim, layers, dropout, norm_first: encoder shape
            (paper: 6 heads × 32 dims = 192, ff 768, 9 or 12 layers).
        attention: inner attention spec (string or mapping) for every layer.
        shared_qk: share the query/key projection (needed for LSH).
        subsampling: frame-rate reduction factor of the convolutional front end (1 = none).
        spec_augment: keyword arguments of :class:`fastasr.data.features.SpecAugment`, or None.
        utterance_cmvn: after the global CMVN, normalise each utterance by its own mean and
            standard deviation (:class:`fastasr.model.utterance_cmvn.UtteranceCMVN`).

    The global CMVN statistics are buffers of this module (``cmvn``), so they travel
    inside every checkpoint; :meth:`set_cmvn` fills them from the training set's statistics.
    """

    def __init__(
        self,
        vocab_size: int,
        feat_in: int,
        d_model: int = 192,
        heads: int = 6,
        ff_dim: int = 768,
        layers: int = 9,
        dropout: float = 0.1,
        attention: AttentionSpec = "full",
        shared_qk: bool = False,
        subsampling: int = 1,
        norm_first: bool = True,
        spec_augment: Mapping[str, Any] | None = None,
        utterance_cmvn: bool = False,
    ):
        super().__init__()
        self.vocab_size = vocab_size
        self.cmvn = GlobalCMVN(feat_in)
        self.utterance_cmvn = UtteranceCMVN() if utterance_cmvn else None
        self.spec_augment = SpecAugment(**spec_augment) if spec_augment else None
        self.frontend = ConvSubsampling(feat_in, d_model, subsampling)
        self.positions = SinusoidalPositionalEncoding(d_model, dropout)
        self.encoder = TransformerEncoder(
            d_model, heads, ff_dim, layers, attention, shared_qk, dropout, norm_first
        )
        self.head = nn.Linear(d_model, vocab_size)

    @torch.no_grad()
    def set_cmvn(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Copy global mean/std (F,) of the training features into the model."""
        self.cmvn.mean.copy_(torch.as_tensor(mean))
        self.cmvn.std.copy_(torch.as_tensor(std))

    @property
    def subsampling_factor(self) -> int:
        return self.frontend.factor

    def set_attention(self, attention: AttentionSpec) -> None:
        """Decode (or keep training) with another attention; parameters are unchanged."""
        self.encoder.set_attention(attention)

    @property
    def attention_spec(self) -> str:
        return self.encoder.layers[0].attn.inner.spec

    def forward(
        self, features: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """features: (B, T, F) raw filterbanks, lengths: (B,) → (log_probs (B, T', V), lengths (B,))."""
        x = self.cmvn(features, lengths)
        if self.utterance_cmvn is not None:
            x = self.utterance_cmvn(x, lengths)
        if self.spec_augment is not None and self.training:
            x = self.spec_augment(x, lengths)
        x, lengths = self.frontend(x, lengths)
        x = self.positions(x)
        x = self.encoder(x, lengths)
        return self.head(x).log_softmax(dim=-1), lengths
