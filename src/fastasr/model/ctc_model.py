"""The CTC acoustic model: CMVN [→ per-utterance CMVN] → SpecAugment → [subsampling] → [× √d_model] → [positions] → encoder → CTC head.

Observers (dashboards, analysis scripts) see the attention through a public API instead of
reaching into layers: :meth:`CTCModel.attention_layers` and the context manager
:meth:`CTCModel.capture_attention`, which hooks one layer's inner attention.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fastasr.kernels.layers.dropout import Dropout
from fastasr.kernels.layers.linear import Linear
from fastasr.model.chunking import ChunkContext, ChunkTraining
from fastasr.model.encoder import AttentionLayer, AttentionSpec, TransformerEncoder
from fastasr.model.frontend import ConvSubsampling, GlobalCMVN, SpecAugment
from fastasr.model.positional import SinusoidalPositionalEncoding, check_positions
from fastasr.model.streaming import ModelStream
from fastasr.model.utterance_cmvn import UtteranceCMVN


@dataclass
class CapturedAttention:
    """The inputs of one layer's inner attention at its latest call, detached.

    ``q``, ``k``: ``(B, H, N, E)`` queries and keys (``k is q`` when the model shares the
    Q/K projection); ``lengths``: ``(B,)`` valid positions or None; ``calls``: how many
    forward calls were seen. All None/0 until the model has run inside the context.
    """

    layer: int
    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    lengths: torch.Tensor | None = None
    calls: int = 0


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
        spec_augment: keyword arguments of :class:`fastasr.model.frontend.SpecAugment`, or None.
        utterance_cmvn: after the global CMVN, normalise each utterance by its own mean and
            standard deviation (:class:`fastasr.model.utterance_cmvn.UtteranceCMVN`).
        conv_kernel: add a Conformer-style convolution module of this (odd) kernel to every
            encoder layer (:class:`fastasr.model.encoder.ConvolutionModule`); None: none.
        positions: ``absolute`` (sinusoids added to the encoder input, the paper's),
            ``rotary`` (queries and keys rotated in every attention layer) or ``none``
            (order from the convolutions alone); :mod:`fastasr.model.positional` says when
            each fits.
        xscaling: multiply the front end's output by ``sqrt(d_model)`` before the positions are
            added (ESPnet's and NeMo's ``xscaling``), so that the content and not the position
            table fills the encoder's input from the first update: at initialisation the front
            end's output has an RMS near 0.1 against the sinusoids' 0.71. False: the input as
            the front end gives it (the paper's model, and every checkpoint saved without the key).
        inter_ctc_layers: 1-based numbers of the encoder layers (below the last) whose outputs
            also get a CTC loss in training, through the final norm and the shared output layer
            (intermediate CTC, Lee & Watanabe, ICASSP 2021); empty: none.
        inter_ctc_weight: the weight ``w`` of their mean loss in training,
            ``(1 - w) * final + w * mean(intermediate)``; 0 with no layers, in (0, 1) with some.
            Decoding never computes them.
        streaming: train for chunk-by-chunk recognition (:class:`fastasr.model.chunking.ChunkTraining`:
            ``chunk_sizes``, ``full_context``, ``left_frames``): each training batch runs in a
            chunked context drawn from it, or in full context; None: always full context.
            Decoding chooses its own context (``forward``'s ``chunk``, :meth:`start_stream`).

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
        conv_kernel: int | None = None,
        positions: str = "absolute",
        inter_ctc_layers: Sequence[int] = (),
        inter_ctc_weight: float = 0.0,
        xscaling: bool = False,
        streaming: Mapping[str, Any] | None = None,
    ):
        super().__init__()
        self.chunk_training = ChunkTraining.from_config(streaming)
        self.decoding_context: ChunkContext | None = None  # set_decoding_context
        self.inter_ctc_layers, self.inter_ctc_weight = check_inter_ctc(inter_ctc_layers, inter_ctc_weight, layers)
        self.vocab_size = vocab_size
        self.position_kind = check_positions(positions)
        self.cmvn = GlobalCMVN(feat_in)
        self.utterance_cmvn = UtteranceCMVN() if utterance_cmvn else None
        self.spec_augment = SpecAugment(**spec_augment) if spec_augment else None
        self.frontend = ConvSubsampling(feat_in, d_model, subsampling)
        self.input_scale = math.sqrt(d_model) if xscaling else 1.0
        # the dropout the added positions carry stays where it was for the other two kinds
        self.positions = SinusoidalPositionalEncoding(d_model, dropout) if positions == "absolute" else Dropout(dropout)
        self.encoder = TransformerEncoder(
            d_model, heads, ff_dim, layers, attention, shared_qk, dropout, norm_first, conv_kernel,
            rotary=positions == "rotary",
        )
        self.head = Linear(d_model, vocab_size)

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
        """Canonical spec string of the attention every layer uses now (``"i-clustered-100"``)."""
        return self.attention_layers()[0].inner.spec

    def attention_layers(self) -> list[AttentionLayer]:
        """The encoder's attention layers, first to last (each has ``heads``, ``shared_qk`` and
        its parameter-free ``inner`` attention, whose ``dense_weights(q, k, lengths)`` gives
        the (B, H, N, N) matrix it applies)."""
        return [layer.attn for layer in self.encoder.layers]

    @contextlib.contextmanager
    def capture_attention(self, layer: int) -> Iterator[CapturedAttention]:
        """Record what layer ``layer`` (negative counts from the end) feeds its inner attention.

        ``with model.capture_attention(2) as captured: model(x, lengths)`` leaves the last
        call's queries, keys and lengths in ``captured`` (:class:`CapturedAttention`). A
        forward pre-hook on the layer's inner attention does it; it is removed on exit, so
        the model is unchanged afterwards. Swap attention (``set_attention``) before
        entering, not inside: the hook is on the inner attention present at entry.
        """
        layers = self.attention_layers()
        if not -len(layers) <= layer < len(layers):
            raise IndexError(f"capture_attention: layer {layer}; the model has {len(layers)} attention layers")
        index = layer % len(layers)
        captured = CapturedAttention(index)

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            names = ("q", "k", "v", "lengths")
            given = {**dict(zip(names, args)), **kwargs}
            q, k, lengths = given["q"], given["k"], given.get("lengths")
            captured.q = q.detach()
            captured.k = captured.q if k is q else k.detach()
            captured.lengths = None if lengths is None else lengths.detach()
            captured.calls += 1

        handle = layers[index].inner.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            yield captured
        finally:
            handle.remove()

    def forward(
        self, features: torch.Tensor, lengths: torch.Tensor, chunk: ChunkContext | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """features: (B, T, F) raw filterbanks, lengths: (B,) → (log_probs (B, T', V) float32, lengths (B,)).

        ``chunk``: run in that chunked context (:class:`fastasr.model.chunking.ChunkContext`, in
        encoder frames): what chunk-by-chunk decoding (:meth:`start_stream`) computes, for the
        whole batch at once. None: in training, a context drawn from ``streaming`` (full context
        without it); in eval mode, :meth:`set_decoding_context`'s (full context by default)."""
        chunk = self._context(chunk)
        x, lengths = self._encoder_input(features, lengths, chunk)
        return self._log_probs(self.encoder(x, lengths, chunk)), lengths

    def forward_with_intermediate(
        self, features: torch.Tensor, lengths: torch.Tensor, chunk: ChunkContext | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """As :meth:`forward`, plus the log-probabilities of each ``inter_ctc_layers`` layer
        (same shape and lengths; an empty list with none): what intermediate CTC trains on."""
        chunk = self._context(chunk)
        x, lengths = self._encoder_input(features, lengths, chunk)
        x, tapped = self.encoder.forward_with_taps(x, lengths, self.inter_ctc_layers, chunk)
        return self._log_probs(x), lengths, [self._log_probs(t) for t in tapped]

    def start_stream(self, chunk: ChunkContext) -> ModelStream:
        """A :class:`fastasr.model.streaming.ModelStream`: feed it filterbank frames as they come
        and it returns the log-probabilities of each finished chunk, equal to :meth:`forward`'s
        with ``chunk`` over the whole recording."""
        return ModelStream(self, chunk)

    def set_decoding_context(self, chunk: ChunkContext | None) -> None:
        """Decode (in eval mode) in this chunked context, what streaming with these chunks gives,
        when ``forward`` is given none; None: full context. Parameters are unchanged."""
        self.decoding_context = chunk

    def _context(self, chunk: ChunkContext | None) -> ChunkContext | None:
        if chunk is not None:
            return chunk
        if self.training:
            return None if self.chunk_training is None else self.chunk_training.draw()
        return self.decoding_context

    def _encoder_input(self, features: torch.Tensor, lengths: torch.Tensor,
                       chunk: ChunkContext | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.cmvn(features, lengths)
        if self.utterance_cmvn is not None:
            ends = None if chunk is None else chunk.prefix_ends(x.shape[1], self.subsampling_factor, x.device)
            x = self.utterance_cmvn(x, lengths, ends)
        if self.spec_augment is not None and self.training:
            x = self.spec_augment(x, lengths)
        x, lengths = self.frontend(x, lengths)
        if self.input_scale != 1.0:
            x = x * self.input_scale
        return self.positions(x), lengths

    def _log_probs(self, x: torch.Tensor) -> torch.Tensor:
        # float32 log-probabilities under mixed precision too: CTC sums over many alignments
        return self.head(x).float().log_softmax(dim=-1)


def check_inter_ctc(layers: Sequence[int], weight: float, depth: int) -> tuple[tuple[int, ...], float]:
    """``(layers, weight)`` of intermediate CTC, checked: layer numbers distinct, in
    ``1 .. depth - 1`` (the last layer's loss is the main one), and a weight in (0, 1) with
    layers, 0 without. Raises ValueError naming the ``model.`` key and what is expected."""
    taps = tuple(int(n) for n in (layers or ()))
    bad = [n for n in taps if not 1 <= n < depth]
    if bad or len(set(taps)) != len(taps):
        raise ValueError(f"model.inter_ctc_layers={list(taps)}: expected distinct layer numbers in 1..{depth - 1} "
                         f"(1-based, below the last of model.layers={depth})")
    weight = float(weight)
    if taps and not 0.0 < weight < 1.0:
        raise ValueError(f"model.inter_ctc_weight={weight}: expected a value in (0, 1) with "
                         f"model.inter_ctc_layers={list(taps)}")
    if not taps and weight != 0.0:
        raise ValueError(f"model.inter_ctc_weight={weight} but model.inter_ctc_layers is empty: "
                         "name the layers (e.g. model.inter_ctc_layers=[3]) or set the weight to 0")
    return tuple(sorted(taps)), weight
