"""Acoustic model: sinusoidal positions, transformer encoder with pluggable attention, CTC head."""

from fastasr.model.ctc_model import CTCModel
from fastasr.model.encoder import AttentionLayer, EncoderLayer, TransformerEncoder
from fastasr.model.positional import SinusoidalPositionalEncoding
from fastasr.model.subsampling import ConvSubsampling

__all__ = [
    "AttentionLayer",
    "CTCModel",
    "ConvSubsampling",
    "EncoderLayer",
    "SinusoidalPositionalEncoding",
    "TransformerEncoder",
]
