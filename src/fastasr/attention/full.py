"""Full softmax attention through ``scaled_dot_product_attention``.

The baseline must be the fast one, so this calls PyTorch's fused kernels
(FlashAttention / memory-efficient / the CPU flash kernel) with a key-padding
mask; only keys are masked, so no softmax row is ever empty.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fastasr.attention.base import InnerAttention, compute_dtype
from fastasr.attention.masking import key_mask, zero_padded_queries
from fastasr.attention.registry import register

__all__ = ["FullAttention"]


@register
class FullAttention(InnerAttention):
    """``softmax(Q K^T / sqrt(E)) V`` over the valid keys. O(N^2)."""

    name = "full"

    def _forward(self, q, k, v, lengths):
        if lengths is None:
            return F.scaled_dot_product_attention(q, k, v)
        B, _, N, _ = q.shape
        mask = key_mask(lengths, B, N, q.device)[:, None, None, :]  # (B,1,1,N) True = attend
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return zero_padded_queries(out, lengths)

    def _dense_weights(self, q, k, lengths):
        B, _, N, E = q.shape
        dt = compute_dtype(q.dtype)
        scores = torch.matmul(q.to(dt), k.to(dt).transpose(-1, -2)) * self.scale(E)
        mask = key_mask(lengths, B, N, q.device)[:, None, None, :]
        weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        return zero_padded_queries(weights, lengths)
