"""Transformer encoder whose attention is a swappable, parameter-free inner attention.

As in fast-transformers, the projections live in :class:`AttentionLayer`; the inner
attention (``fastasr.attention``) holds no parameters, so a trained model can decode
with any variant (``TransformerEncoder.set_attention``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from fastasr.attention import build_attention
from fastasr.kernels.dropout import Dropout
from fastasr.model.positional import RotaryPositions

AttentionSpec = str | Mapping[str, Any]


class AttentionLayer(nn.Module):
    """Multi-head attention: projections + an inner attention built from a spec.

    Args:
        d_model: model width; ``heads * head_dim`` must equal it.
        heads: number of heads.
        attention: spec string or mapping for :func:`fastasr.attention.build_attention`.
        shared_qk: one projection for queries and keys (the paper's "shared-full"; LSH needs it).
        dropout: dropout on the output projection.
        rotary: a :class:`RotaryPositions` that turns queries and keys by their position before
            the inner attention (every attention variant then sees relative positions), or None.
    """

    def __init__(
        self,
        d_model: int,
        heads: int,
        attention: AttentionSpec = "full",
        shared_qk: bool = False,
        dropout: float = 0.0,
        rotary: RotaryPositions | None = None,
    ):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")
        self.heads = heads
        self.shared_qk = shared_qk
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = None if shared_qk else nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = Dropout(dropout)
        self.rotary = rotary
        self.inner = self._build(attention)

    def _build(self, attention: AttentionSpec) -> nn.Module:
        inner = build_attention(attention)
        if getattr(inner, "requires_shared_qk", False) and not self.shared_qk:
            raise ValueError(
                f"attention '{inner.spec}' needs shared queries and keys; "
                "set model.shared_qk=true (and train with it)"
            )
        return inner

    def set_attention(self, attention: AttentionSpec) -> None:
        """Replace the inner attention (no parameters change)."""
        self.inner = self._build(attention)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        return x.view(b, n, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        """x: (B, N, D), lengths: (B,) or None -> (B, N, D)."""
        q = self._split(self.q_proj(x))
        k = q if self.k_proj is None else self._split(self.k_proj(x))
        v = self._split(self.v_proj(x))
        if self.rotary is not None:
            q, k = (self.rotary(q),) * 2 if k is q else (self.rotary(q), self.rotary(k))
        out = self.inner(q, k, v, lengths)  # (B, H, N, E); observed by CTCModel.capture_attention
        b, h, n, e = out.shape
        return self.dropout(self.out_proj(out.transpose(1, 2).reshape(b, n, h * e)))


class ConvolutionModule(nn.Module):
    """Conformer's convolution module (Gulati et al. 2020), padding-safe: pointwise conv to
    2·d, GLU, depthwise conv over time (``kernel`` frames, odd), LayerNorm, SiLU, pointwise
    conv, dropout. Padded frames (index ≥ length) are zeroed before the depthwise conv, so they
    never reach valid frames. LayerNorm rather than BatchNorm: statistics that do not depend on
    the batch's padding or size. Input and output (B, T, d)."""

    def __init__(self, d_model: int, kernel: int = 15, dropout: float = 0.1):
        super().__init__()
        if kernel < 1 or kernel % 2 == 0:
            raise ValueError(f"model.conv_kernel {kernel}; expected an odd number of frames ≥ 1 (or null: no convolution)")
        self.pointwise_in = nn.Linear(d_model, 2 * d_model)
        self.depthwise = nn.Conv1d(d_model, d_model, kernel, padding=kernel // 2, groups=d_model)
        self.norm = nn.LayerNorm(d_model)
        self.pointwise_out = nn.Linear(d_model, d_model)
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        y = nn.functional.glu(self.pointwise_in(x), dim=-1)
        if lengths is not None:
            valid = torch.arange(x.shape[1], device=x.device)[None, :] < lengths.to(x.device)[:, None]
            y = y * valid[..., None].to(y.dtype)
        y = self.depthwise(y.transpose(1, 2)).transpose(1, 2)
        y = nn.functional.silu(self.norm(y))
        return self.dropout(self.pointwise_out(y))


class EncoderLayer(nn.Module):
    """Self-attention + feed-forward block with residuals (pre-norm by default), with an
    optional convolution module between them (``conv_kernel``: a Conformer-style layer
    without the macaron feed-forward; pre-norm only). ``rotary``: rotary positions in the
    attention (:class:`AttentionLayer`), or None."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        ff_dim: int,
        attention: AttentionSpec = "full",
        shared_qk: bool = False,
        dropout: float = 0.1,
        norm_first: bool = True,
        conv_kernel: int | None = None,
        rotary: RotaryPositions | None = None,
    ):
        super().__init__()
        if conv_kernel is not None and not norm_first:
            raise ValueError("model.conv_kernel needs model.norm_first=true (the convolution module is pre-norm)")
        self.attn = AttentionLayer(d_model, heads, attention, shared_qk, dropout, rotary)
        self.conv = ConvolutionModule(d_model, conv_kernel, dropout) if conv_kernel is not None else None
        self.norm_conv = nn.LayerNorm(d_model) if conv_kernel is not None else None
        self.ff = nn.Sequential(
            nn.Linear(d_model, ff_dim),
            nn.GELU(),
            Dropout(dropout),
            nn.Linear(ff_dim, d_model),
            Dropout(dropout),
        )
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        if self.norm_first:
            x = x + self.attn(self.norm1(x), lengths)
            if self.conv is not None:
                x = x + self.conv(self.norm_conv(x), lengths)
            return x + self.ff(self.norm2(x))
        x = self.norm1(x + self.attn(x, lengths))
        return self.norm2(x + self.ff(x))


class TransformerEncoder(nn.Module):
    """A stack of :class:`EncoderLayer` sharing one attention spec."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        ff_dim: int,
        layers: int,
        attention: AttentionSpec = "full",
        shared_qk: bool = False,
        dropout: float = 0.1,
        norm_first: bool = True,
        conv_kernel: int | None = None,
        rotary: bool = False,
    ):
        super().__init__()
        positions = RotaryPositions(d_model // heads) if rotary else None  # one table for every layer
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, heads, ff_dim, attention, shared_qk, dropout, norm_first, conv_kernel, positions)
            for _ in range(layers)
        )
        self.final_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()

    def set_attention(self, attention: AttentionSpec) -> None:
        for layer in self.layers:
            layer.attn.set_attention(attention)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        return self.forward_with_taps(x, lengths)[0]

    def forward_with_taps(self, x: torch.Tensor, lengths: torch.Tensor | None,
                          taps: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The encoded sequence and the outputs of the ``taps`` layers (1-based numbers), each
        through the final norm as the last layer's is: ``(x, [x_tap, ...])``."""
        tapped: list[torch.Tensor] = []
        for number, layer in enumerate(self.layers, start=1):
            x = layer(x, lengths)
            if number in taps:
                tapped.append(self.final_norm(x))
        return self.final_norm(x), tapped
