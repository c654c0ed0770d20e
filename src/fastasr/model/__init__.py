"""Acoustic model: front end (CMVN, SpecAugment, subsampling), sinusoidal positions,
transformer encoder with pluggable attention, CTC head."""

from fastasr.model.ctc_model import CapturedAttention, CTCModel
from fastasr.model.encoder import AttentionLayer, EncoderLayer, TransformerEncoder
from fastasr.model.frontend import ConvSubsampling, GlobalCMVN, SpecAugment
from fastasr.model.positional import SinusoidalPositionalEncoding

__all__ = [
    "AttentionLayer",
    "CTCModel",
    "CapturedAttention",
    "ConvSubsampling",
    "EncoderLayer",
    "GlobalCMVN",
    "SinusoidalPositionalEncoding",
    "SpecAugment",
    "TransformerEncoder",
]
