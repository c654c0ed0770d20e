"""Full softmax attention through ``scaled_dot_product_attention``.

The baseline must be the fast one. On a GPU the FlashAttention kernel takes no mask,
so a padded batch is *packed*: its valid positions become a jagged nested tensor
(``torch.nested``, one sequence per utterance, no padding) and SDPA runs flash
(fp16/bf16) or the memory-efficient kernel (fp32) on it; outputs are scattered back
to the padded layout with zeros at padded positions. Packing needs the number of
valid positions on the host, one synchronisation per *lengths tensor*: the packing is
cached on it, so the layers of one forward pass share it. On a CPU the fused flash
kernel takes the key-padding mask directly and nothing is packed.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from fastasr.attention.base import InnerAttention, compute_dtype
from fastasr.attention.masking import key_mask, valid_positions, zero_padded_queries
from fastasr.attention.registry import register

__all__ = ["FullAttention", "packed_attention"]


class _Packing:
    """Where the valid positions of a padded ``(B, N)`` batch go in a packed one.

    Attributes:
        index: ``(T,)`` int64 rows of the flattened ``(B*N)`` positions that are valid.
        offsets: ``(B + 1,)`` int64 start of each sequence among the ``T`` packed rows.
        max_len, min_len: longest and shortest length (host ints).
    """

    _cache: tuple[weakref.ref, tuple, _Packing] | None = None

    def __init__(self, lengths: torch.Tensor, n: int, device: torch.device) -> None:
        B = lengths.shape[0]
        lengths = lengths.to(device)
        valid = valid_positions(lengths, B, n, device)
        self.index = valid.reshape(-1).nonzero().squeeze(1)  # the one host synchronisation
        self.offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        host = lengths.tolist()
        self.max_len, self.min_len = max(host), min(host)

    @classmethod
    def of(cls, lengths: torch.Tensor, n: int, device: torch.device) -> _Packing:
        """The packing of ``lengths`` for ``n`` positions, reused while it is the same tensor."""
        key = (lengths._version, n, device)
        hit = cls._cache
        if hit is not None and hit[0]() is lengths and hit[1] == key:
            return hit[2]
        packing = cls(lengths, n, device)
        cls._cache = (weakref.ref(lengths), key, packing)
        return packing


def packed_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """SDPA over the valid positions only (no mask): ``(B, H, N, E)`` -> ``(B, H, N, Ev)``.

    The batch is packed into jagged nested tensors, so SDPA can pick its fastest kernel
    (FlashAttention on a GPU); padded query rows of the result are 0. Differentiable.
    """
    B, H, N, _ = q.shape
    Ev = v.shape[-1]
    packing = _Packing.of(lengths, N, q.device)

    def pack(x: torch.Tensor) -> torch.Tensor:
        rows = x.transpose(1, 2).reshape(B * N, H, x.shape[-1]).index_select(0, packing.index)
        nested = torch.nested.nested_tensor_from_jagged(
            rows, packing.offsets, min_seqlen=packing.min_len, max_seqlen=packing.max_len
        )
        return nested.transpose(1, 2)  # (B, H, jagged N, E)

    out = F.scaled_dot_product_attention(pack(q), pack(k), pack(v)).transpose(1, 2).values()
    padded = out.new_zeros(B * N, H, Ev).index_copy(0, packing.index, out)
    return padded.view(B, N, H, Ev).transpose(1, 2)


@register
class FullAttention(InnerAttention):
    """``softmax(Q K^T / sqrt(E)) V`` over the valid keys. O(N^2). No parameters.

    ``FullAttention()(q, k, v, lengths)``: ``q, k`` ``(B, H, N, E)``, ``v``
    ``(B, H, N, Ev)``, ``lengths`` ``(B,)`` or None -> ``(B, H, N, Ev)``.
    """

    name = "full"
    length_cost = "quadratic"

    def _forward(self, q, k, v, lengths):
        if lengths is None:
            return F.scaled_dot_product_attention(q, k, v)
        if q.device.type == "cuda":
            return packed_attention(q, k, v, lengths)
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
