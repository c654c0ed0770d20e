"""Top-k attention (Gupta et al. 2021, "Memory-efficient Transformers via Top-k Attention").

Each query keeps only its ``k`` largest scores over the valid keys and takes the
softmax over those. Queries are processed in chunks, so the forward pass holds
at most ``B x chunk x N`` scores at a time; the backward pass uses the cached top-k
indices and probabilities (``O(N k)`` memory) and never rebuilds a dense
``N x N`` matrix. With ``k >= N`` this is full attention.
"""

from __future__ import annotations

import torch

from fastasr.attention.base import InnerAttention, compute_dtype
from fastasr.attention.masking import key_mask, zero_padded_queries
from fastasr.attention.registry import register
from fastasr.attention.spec import Param
from fastasr.kernels.clustering.gathers import (
    rows_gather_dot,
    rows_gather_weighted_sum,
    rows_scatter_outer,
)

__all__ = ["TopKAttention", "topk_attention", "select_topk"]


@torch.no_grad()
def select_topk(
    q: torch.Tensor, k: torch.Tensor, keys_ok: torch.Tensor, kk: int, chunk: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices and softmax probabilities of each query's ``kk`` best keys.

    Args:
        q, k: ``(B, H, N, E)``; keys_ok: ``(B, N)`` bool (at least one True per row).
        kk: keys kept per query (``<= N``); chunk: queries of one sequence scored per
            step, summed over its heads: every step scores ``max(1, chunk // H)``
            queries of every (batch, head) pair at once, so at most
            ``B max(chunk, H) x N`` scores exist at a time; the only loop is over query
            blocks (its size does not depend on the batch, so neither do the results).

    Returns:
        ``idx (B*H*N, kk)`` int64 rows of the flattened ``(B*H*N)`` keys, and
        ``p (B*H*N, kk)``: the softmax over the kept scores (0 at masked keys).
    """
    B, H, N, E = q.shape
    BH = B * H
    qf, kf = q.reshape(BH, N, E), k.reshape(BH, N, E)
    bias = torch.zeros(B, N, dtype=q.dtype, device=q.device).masked_fill(~keys_ok, float("-inf"))
    bias = bias.repeat_interleave(H, dim=0)[:, None, :]  # (BH,1,N)
    keys_t = kf.transpose(-1, -2)
    idx = torch.empty(BH, N, kk, dtype=torch.int64, device=q.device)
    p = torch.empty(BH, N, kk, dtype=q.dtype, device=q.device)
    rows = max(1, chunk // max(H, 1))  # queries of every (batch, head) pair per step
    for s in range(0, N, rows):
        e = min(N, s + rows)
        scores = torch.baddbmm(bias, qf[:, s:e], keys_t, alpha=scale)
        top = scores.topk(kk, dim=-1)
        idx[:, s:e] = top.indices
        p[:, s:e] = top.values.softmax(-1)
    offsets = (torch.arange(BH, device=q.device) * N)[:, None, None]
    return (idx + offsets).reshape(BH * N, kk), p.reshape(BH * N, kk)


class _TopKAttention(torch.autograd.Function):
    """Top-k attention whose backward reads the cached indices and probabilities."""

    @staticmethod
    def forward(ctx, q, k, v, keys_ok, kk, chunk, scale):
        B, H, N, E = q.shape
        Ev = v.shape[-1]
        idx, p = select_topk(q, k, keys_ok, kk, chunk, scale)
        v_rows = v.reshape(B * H * N, Ev)
        out = rows_gather_weighted_sum(p, v_rows, idx)
        ctx.save_for_backward(q, k, v, idx, p)
        ctx.scale = scale
        return out.view(B, H, N, Ev)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, idx, p = ctx.saved_tensors
        B, H, N, E = q.shape
        R = B * H * N
        g = grad_out.reshape(R, v.shape[-1])
        v_rows = v.reshape(R, v.shape[-1])
        gq = gk = gv = None
        if ctx.needs_input_grad[2]:
            gv = rows_scatter_outer(p, g, idx, R).view_as(v)
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            gp = rows_gather_dot(g, v_rows, idx)  # dL/dp (R,K)
            gs = p * (gp - (p * gp).sum(-1, keepdim=True)) * ctx.scale  # dL/d(q.k)
            if ctx.needs_input_grad[0]:
                gq = rows_gather_weighted_sum(gs, k.reshape(R, E), idx).view_as(q)
            if ctx.needs_input_grad[1]:
                gk = rows_scatter_outer(gs, q.reshape(R, E), idx, R).view_as(k)
        return gq, gk, gv, None, None, None, None


def topk_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys_ok: torch.Tensor, kk: int, chunk: int
) -> torch.Tensor:
    """Top-``kk`` attention of ``(B, H, N, E)`` inputs over keys where ``keys_ok (B, N)``.

    Differentiable in ``q``, ``k``, ``v`` through a custom backward; padded query
    rows are not zeroed here.
    """
    return _TopKAttention.apply(q, k, v, keys_ok, kk, chunk, InnerAttention.scale(q.shape[-1]))


@register
class TopKAttention(InnerAttention):
    """Softmax over each query's ``k`` largest scores.

    ``TopKAttention(32)(q, k, v, lengths)``: ``q, k`` ``(B, H, N, E)``, ``v``
    ``(B, H, N, Ev)``, ``lengths`` ``(B,)`` or None -> ``(B, H, N, Ev)``.

    Args:
        k: scores kept per query (the clustered paper's "oracle-top": 32; at most ``N``
            are used).
        chunk: queries per sequence scored per step, over its heads; forward memory
            ``O(B chunk N)``.

    Raises:
        ValueError: a parameter out of range, naming it and what is expected.
    """

    name = "topk"
    length_cost = "quadratic"  # every score is computed before k are kept
    number_param = "k"
    params = (
        Param("k", low=1, doc="scores kept per query"),
        Param("chunk", low=1, doc="queries per sequence scored per step (memory O(B chunk N))"),
    )

    def __init__(self, k: int = 32, *, chunk: int = 1024) -> None:
        super().__init__()
        self._set_hparams(k=k, chunk=chunk)

    def _forward(self, q, k, v, lengths):
        B, H, N, E = q.shape
        dt = compute_dtype(q.dtype)
        keys_ok = key_mask(lengths, B, N, q.device)
        out = topk_attention(q.to(dt), k.to(dt), v.to(dt), keys_ok, min(self.k, N), self.chunk)
        return zero_padded_queries(out, lengths).to(v.dtype)

    def _dense_weights(self, q, k, lengths):
        B, H, N, E = q.shape
        dt = compute_dtype(q.dtype)
        keys_ok = key_mask(lengths, B, N, q.device)
        idx, p = select_topk(q.to(dt), k.to(dt), keys_ok, min(self.k, N), self.chunk, self.scale(E))
        local = idx % N if N else idx
        dense = p.new_zeros(B * H * N, N).scatter_add(-1, local, p)
        return zero_padded_queries(dense.view(B, H, N, N), lengths)
