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

from fastasr.attention import AutoAttention, FullAttention, TopKAttention, build_attention
from fastasr.kernels.layers.dropout import Dropout, GeluDropout
from fastasr.kernels.layers.layer_norm import LayerNorm
from fastasr.kernels.layers.linear import Linear
from fastasr.model.chunking import ChunkContext
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
        self.q_proj = Linear(d_model, d_model)
        self.k_proj = None if shared_qk else Linear(d_model, d_model)
        self.v_proj = Linear(d_model, d_model)
        self.out_proj = Linear(d_model, d_model)
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

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None, chunk: ChunkContext | None = None,
                offset: int = 0) -> torch.Tensor:
        """x: (B, N, D), lengths: (B,) or None -> (B, N, D).

        ``chunk``: each chunk's queries attend in their window (:meth:`ChunkContext.windows`);
        None: every query sees every key. ``offset``: the position of ``x``'s first frame in its
        recording (rotary positions; a streamed window is not at 0)."""
        q = self._split(self.q_proj(x))
        k = q if self.k_proj is None else self._split(self.k_proj(x))
        v = self._split(self.v_proj(x))
        if self.rotary is not None:
            q, k = ((self.rotary(q, offset),) * 2 if k is q
                    else (self.rotary(q, offset), self.rotary(k, offset)))
        if chunk is None:
            out = self.inner(q, k, v, lengths)  # (B, H, N, E); observed by CTCModel.capture_attention
        else:
            n = x.shape[1]
            qw, window_lengths = chunk.windows(q, lengths)
            kw = qw if k is q else chunk.windows(k, lengths)[0]
            out = chunk.unwindow(self.inner(qw, kw, chunk.windows(v, lengths)[0], window_lengths), n)
        b, h, n, e = out.shape
        return self.dropout(self.out_proj(out.transpose(1, 2).reshape(b, n, h * e)))

    def stream(self, x: torch.Tensor, state: LayerStream) -> torch.Tensor:
        """One chunk ``x (B, C, D)`` of a stream → ``(B, C, D)``: only the chunk's queries, keys
        and values are projected; the keys and values of the left context come from ``state``'s
        cache, which then takes the chunk's and drops what leaves the window. The same numbers as
        :meth:`forward` with ``state.chunk`` (the chunk's rows of its window), up to rounding.

        Full and top-k attention give each query its own weights: the chunk's ``C`` queries attend
        to the window's ``L + C`` keys, ``C·(L + C)`` scores. Every other variant's output for a
        query depends on the window's other queries (clustered and i-clustered attention form their
        clusters over the window's queries, LSH its buckets over its shared queries and keys): for
        them (and ``auto``, which switches between the two by the window's length) the cache keeps
        the left context's queries too, and the inner attention runs on the window's ``L + C``
        queries as the simulated decoding runs it, linear in ``L + C`` for those variants
        (projections are still computed once a frame)."""
        q = self._split(self.q_proj(x))
        k = q if self.k_proj is None else self._split(self.k_proj(x))
        v = self._split(self.v_proj(x))
        if self.rotary is not None:
            q, k = ((self.rotary(q, state.position),) * 2 if k is q
                    else (self.rotary(q, state.position), self.rotary(k, state.position)))
        keys = torch.cat([state.keys, k], 2)
        values = torch.cat([state.values, v], 2)
        per_query = isinstance(self.inner, (FullAttention, TopKAttention))
        queries = None if per_query or k is q else torch.cat([state.queries, q], 2)
        inner = self.inner
        if isinstance(inner, AutoAttention):
            # chosen by the length of a whole window, as the simulated decoding of a recording
            # longer than one window chooses it (its windows padded to that length)
            left = state.chunk.left_frames
            inner = inner.choose(keys.shape[2] if left is None else left + state.chunk.size)
        if isinstance(inner, (FullAttention, TopKAttention)):
            out = chunk_attention(q, keys, values, inner.k if isinstance(inner, TopKAttention) else None)
        else:
            out = inner(keys if k is q else queries, keys, values, None)[:, :, -x.shape[1]:]
        state.keep(keys, values, queries)
        b, h, n, e = out.shape
        return self.dropout(self.out_proj(out.transpose(1, 2).reshape(b, n, h * e)))


def chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, top: int | None = None) -> torch.Tensor:
    """``softmax(q k^T / sqrt(E)) v`` for queries ``(B, H, C, E)`` over keys and values
    ``(B, H, W, E)``, none padded: full attention of a stream's chunk over its window; ``top``:
    each query's ``top`` largest scores only (top-k attention). Half-precision inputs on a CPU
    are computed in float32 (as :class:`~fastasr.attention.FullAttention` does there)."""
    dtype = q.dtype
    if q.device.type == "cpu" and dtype in (torch.float16, torch.bfloat16):
        q, k, v = q.float(), k.float(), v.float()
    if top is None:
        return nn.functional.scaled_dot_product_attention(q, k, v).to(dtype)
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (B, H, C, W)
    best = scores.topk(min(top, k.shape[2]), dim=-1)
    weights = best.values.softmax(-1)  # (B, H, C, top)
    picked = v[:, :, None].expand(-1, -1, q.shape[2], -1, -1).gather(
        3, best.indices[..., None].expand(-1, -1, -1, -1, v.shape[-1]))  # (B, H, C, top, E)
    return (weights[..., None] * picked).sum(3).to(dtype)


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
        self.pointwise_in = Linear(d_model, 2 * d_model)
        self.depthwise = nn.Conv1d(d_model, d_model, kernel, padding=kernel // 2, groups=d_model)
        self.norm = LayerNorm(d_model)
        self.pointwise_out = Linear(d_model, d_model)
        self.dropout = Dropout(dropout)

    @property
    def half_kernel(self) -> int:
        """Frames the kernel reaches on each side."""
        return self.depthwise.kernel_size[0] // 2

    def gate(self, x: torch.Tensor) -> torch.Tensor:
        """The depthwise convolution's input: pointwise conv and GLU, ``(B, T, d)``."""
        return nn.functional.glu(self.pointwise_in(x), dim=-1)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None, chunk: ChunkContext | None = None) -> torch.Tensor:
        """``chunk``: a frame's kernel sees its chunk and the frames before it, zeros after
        (:meth:`ChunkContext.limit_conv`); None: the whole sequence."""
        y = self.gate(x)
        if lengths is not None:
            valid = torch.arange(x.shape[1], device=x.device)[None, :] < lengths.to(x.device)[:, None]
            y = y * valid[..., None].to(y.dtype)
        y = y.transpose(1, 2)
        y = (self.depthwise(y) if chunk is None else chunk.limit_conv(y, self.depthwise)).transpose(1, 2)
        return self.finish(y)

    def finish(self, y: torch.Tensor) -> torch.Tensor:
        """What follows the depthwise convolution: LayerNorm, SiLU, pointwise conv, dropout."""
        return self.dropout(self.pointwise_out(nn.functional.silu(self.norm(y))))

    def stream(self, x: torch.Tensor, left: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One chunk ``x (B, C, d)`` of a stream, with ``left (B, half_kernel, d)``: the gated
        frames before it (zeros at the stream's start). Returns the chunk's output and the
        next chunk's ``left``. The same numbers as :meth:`forward` with a chunk context."""
        y = torch.cat([left, self.gate(x)], 1)
        h = self.half_kernel
        window = nn.functional.pad(y.transpose(1, 2), (0, h))  # zeros after the chunk's end
        out = nn.functional.conv1d(window, self.depthwise.weight, self.depthwise.bias, groups=self.depthwise.groups)
        return self.finish(out.transpose(1, 2)), y[:, y.shape[1] - h:]


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
        # pre-norm: each norm's output is read by projections alone (LayerNorm's cast_output)
        self.norm_conv = LayerNorm(d_model, cast_output=True) if conv_kernel is not None else None
        # GELU and its dropout one module (one Triton pass where it runs); the Identity keeps the
        # second product at index 3, its checkpoints' key (ff.3.weight)
        self.ff = nn.Sequential(
            Linear(d_model, ff_dim),
            GeluDropout(dropout),
            nn.Identity(),
            Linear(ff_dim, d_model),
            Dropout(dropout),
        )
        self.norm1 = LayerNorm(d_model, cast_output=norm_first)
        self.norm2 = LayerNorm(d_model, cast_output=norm_first)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None, chunk: ChunkContext | None = None) -> torch.Tensor:
        """``x (B, N, d)`` → ``(B, N, d)``; ``chunk``: a chunked context (:class:`ChunkContext`)."""
        if self.norm_first:
            x = x + self.attn(self.norm1(x), lengths, chunk)
            if self.conv is not None:
                x = x + self.conv(self.norm_conv(x), lengths, chunk)
            return x + self.ff(self.norm2(x))
        x = self.norm1(x + self.attn(x, lengths, chunk))
        return self.norm2(x + self.ff(x))

    def stream(self, x: torch.Tensor, state: LayerStream) -> torch.Tensor:
        """One chunk ``x (B, C, d)`` of a stream → ``(B, C, d)``; ``state`` holds the left context
        (keys, values, the convolution's frames) and is advanced. The same numbers as
        :meth:`forward` with ``state.chunk``; only the chunk's ``C`` frames are computed."""
        c = x.shape[1]
        if self.norm_first:
            x = x + self.attn.stream(self.norm1(x), state)
            if self.conv is not None:
                out, state.conv_left = self.conv.stream(self.norm_conv(x), state.conv_left)
                x = x + out
            x = x + self.ff(self.norm2(x))
        else:
            x = self.norm1(x + self.attn.stream(x, state))
            x = self.norm2(x + self.ff(x))
        state.position += c
        return x


class LayerStream:
    """What one encoder layer keeps between the chunks of a stream: the attention's keys and
    values of the left context (``keys``, ``values``: ``(B, H, ≤ left_frames, E)``, rotated
    when the model has rotary positions), the left context's queries for the variants that need
    them (:meth:`AttentionLayer.stream`; else an empty tensor), the convolution module's gated
    frames before the chunk (``conv_left``, ``(B, half_kernel, d)``), and the position of the
    next chunk's first frame. After each chunk it holds at most ``chunk.left_frames`` frames
    (every earlier frame when that is None)."""

    def __init__(self, layer: EncoderLayer, chunk: ChunkContext, batch: int, like: torch.Tensor):
        d = layer.norm1.normalized_shape[0]
        heads = layer.attn.heads
        self.chunk = chunk
        self.keys = like.new_zeros(batch, heads, 0, d // heads)
        self.values = self.keys
        self.queries = self.keys
        self.conv_left = None if layer.conv is None else like.new_zeros(batch, layer.conv.half_kernel, d)
        self.position = 0

    @property
    def frames(self) -> int:
        """Frames of left context held (the cache's length)."""
        return self.keys.shape[2]

    def keep(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor | None) -> None:
        """Hold the last ``chunk.left_frames`` frames of a window's keys, values (and queries)."""
        left = self.chunk.left_frames
        start = 0 if left is None else max(0, keys.shape[2] - left)
        self.keys, self.values = keys[:, :, start:], values[:, :, start:]
        self.queries = self.keys[:, :, :0] if queries is None else queries[:, :, start:]


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
        self.final_norm = LayerNorm(d_model) if norm_first else nn.Identity()

    def set_attention(self, attention: AttentionSpec) -> None:
        for layer in self.layers:
            layer.attn.set_attention(attention)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None, chunk: ChunkContext | None = None) -> torch.Tensor:
        return self.forward_with_taps(x, lengths, chunk=chunk)[0]

    def forward_with_taps(self, x: torch.Tensor, lengths: torch.Tensor | None, taps: tuple[int, ...] = (),
                          chunk: ChunkContext | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The encoded sequence and the outputs of the ``taps`` layers (1-based numbers), each
        through the final norm as the last layer's is: ``(x, [x_tap, ...])``. ``chunk``: every
        layer in that chunked context."""
        tapped: list[torch.Tensor] = []
        for number, layer in enumerate(self.layers, start=1):
            x = layer(x, lengths, chunk)
            if number in taps:
                tapped.append(self.final_norm(x))
        return self.final_norm(x), tapped

    def start_stream(self, chunk: ChunkContext, batch: int, like: torch.Tensor) -> list[LayerStream]:
        """Empty left contexts for a stream of ``batch`` sequences (``like``: device and dtype)."""
        return [LayerStream(layer, chunk, batch, like) for layer in self.layers]

    def stream(self, x: torch.Tensor, states: list[LayerStream]) -> torch.Tensor:
        """One chunk ``(B, C, d)`` through every layer, advancing ``states``."""
        for layer, state in zip(self.layers, states):
            x = layer.stream(x, state)
        return self.final_norm(x)
