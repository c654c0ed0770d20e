"""Chunk-by-chunk encoding of one stream: :class:`ModelStream` (``CTCModel.start_stream``).

Filterbank frames arrive in any pieces; every ``chunk.size × subsampling`` of them make a chunk,
which runs through the model's front end and each encoder layer with what that layer kept of the
earlier chunks (:class:`fastasr.model.encoder.LayerStream`: the attention's keys and values over
the left context, the convolution module's last frames), and gives the chunk's log-probabilities.
Only the chunk's frames are computed: its queries attend to the cached keys and the chunk's own,
``C·(L + C)`` scores a head for ``C`` frames a chunk and ``L`` of left context, and the caches
drop what leaves the window, so with a bounded left context every chunk costs the same however
long the stream (:meth:`fastasr.model.encoder.AttentionLayer.stream`). The numbers are those
of ``CTCModel.forward(features, lengths, chunk)`` over the whole recording (the chunked context
the model trains and simulates with), up to the order of floating-point sums:

* the subsampling front end sees ``subsampling`` frames before the chunk (one output frame's
  worth, whose output is dropped): its output frame ``t`` depends on input frames up to
  ``subsampling × (t + 1) - 1`` only, so a chunk needs no frame after its own;
* per-utterance CMVN normalises a chunk by the running statistics of every frame heard up to the
  chunk's end (:class:`fastasr.model.utterance_cmvn.PrefixStatistics`);
* absolute and rotary positions count from the stream's start.

A clustered attention without a ``seed`` draws new hash planes at every call, here once a chunk
and in ``forward`` once a batch: the two then cluster alike only in distribution.
"""

from __future__ import annotations

import torch

from fastasr.model.chunking import ChunkContext
from fastasr.model.positional import SinusoidalPositionalEncoding
from fastasr.model.utterance_cmvn import PrefixStatistics


class ModelStream:
    """Encodes one stream of filterbank frames chunk by chunk (model in eval mode, no grad).

    ``accept(frames)`` takes ``(T, F)`` raw filterbank frames and returns the ``(T', V)``
    log-probabilities of the chunks they completed (``T'`` may be 0); ``finish()`` encodes what
    is left as a last, shorter chunk. ``position``: encoder frames given so far.
    """

    def __init__(self, model, chunk: ChunkContext) -> None:
        if model.training:
            raise ValueError("CTCModel.start_stream: the model is in training mode; call model.eval() first")
        self.model = model
        self.factor = model.subsampling_factor
        self.frames_per_chunk = chunk.size * self.factor
        like = model.head.weight
        feat = model.cmvn.mean.shape[0]
        self.pending = like.new_zeros(0, feat)
        self.before = like.new_zeros(1, 0, feat)  # the normalised frames before the next chunk
        self.statistics = None if model.utterance_cmvn is None else PrefixStatistics.empty(feat, like.device)
        self.layers = model.encoder.start_stream(chunk, 1, like)
        self.position = 0
        self.finished = False

    @torch.no_grad()
    def accept(self, frames: torch.Tensor) -> torch.Tensor:
        """Add ``frames (T, F)``; the log-probabilities ``(T', V)`` of the chunks now complete."""
        if self.finished:
            raise RuntimeError("ModelStream.accept after finish(): start a new stream")
        if frames.dim() != 2 or frames.shape[1] != self.pending.shape[1]:
            raise ValueError(f"ModelStream.accept: frames of shape {tuple(frames.shape)}; expected "
                             f"(T, {self.pending.shape[1]})")
        self.pending = torch.cat([self.pending, frames.to(self.pending)])
        out = []
        while self.pending.shape[0] >= self.frames_per_chunk:
            out.append(self._encode(self.pending[:self.frames_per_chunk]))
            self.pending = self.pending[self.frames_per_chunk:]
        return torch.cat(out) if out else self.pending.new_zeros(0, self.model.vocab_size)

    @torch.no_grad()
    def finish(self) -> torch.Tensor:
        """The log-probabilities ``(T', V)`` of the frames left (a last chunk shorter than the others)."""
        self.finished = True
        rest, self.pending = self.pending, self.pending[:0]
        return self._encode(rest) if rest.shape[0] else rest.new_zeros(0, self.model.vocab_size)

    def _encode(self, frames: torch.Tensor) -> torch.Tensor:
        model = self.model
        x = model.cmvn(frames[None])
        if self.statistics is not None:
            self.statistics.add(x)
            x = self.statistics.normalise(x, model.utterance_cmvn.min_std)
        window = torch.cat([self.before, x], 1)
        drop = 1 if self.before.shape[1] else 0
        if self.factor > 1:
            self.before = window[:, window.shape[1] - self.factor:]
        sub, _ = model.frontend(window, torch.tensor([window.shape[1]], device=window.device))
        sub = sub[:, drop:]
        if model.input_scale != 1.0:
            sub = sub * model.input_scale
        if isinstance(model.positions, SinusoidalPositionalEncoding):
            sub = model.positions(sub, offset=self.position)
        self.position += sub.shape[1]
        return model._log_probs(model.encoder.stream(sub, self.layers))[0]
