"""Parameter-free inner attentions with one signature, chosen by a spec string.

    from fastasr.attention import build_attention
    attn = build_attention("i-clustered-100", topk=64, bits=32)
    out = attn(q, k, v, lengths)        # (B, H, N, E) each; lengths (B,) or None
    attn.dense_weights(q, k, lengths)   # (B, H, N, N), the matrix it applies

Specs: ``full``, ``lsh-<rounds>``, ``clustered-<clusters>``,
``i-clustered-<clusters>``, ``topk-<k>``, ``oracle-top`` (= ``topk-32``),
``auto`` / ``auto-<crossover>`` (full below the crossover length, i-clustered above).
"""

from fastasr.attention.auto import AutoAttention
from fastasr.attention.base import InnerAttention
from fastasr.attention.clustered import ClusteredAttention
from fastasr.attention.full import FullAttention
from fastasr.attention.improved_clustered import ImprovedClusteredAttention
from fastasr.attention.lsh import LSHAttention
from fastasr.attention.registry import ALIASES, available, build_attention, length_cost
from fastasr.attention.topk import TopKAttention

__all__ = [
    "build_attention",
    "available",
    "length_cost",
    "ALIASES",
    "InnerAttention",
    "FullAttention",
    "LSHAttention",
    "ClusteredAttention",
    "ImprovedClusteredAttention",
    "TopKAttention",
    "AutoAttention",
]
