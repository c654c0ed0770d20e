"""Chunked context: what an encoder frame may see when the encoder runs chunk by chunk.

A :class:`ChunkContext` cuts a sequence of encoder frames into chunks of ``size`` frames; a frame
of chunk ``i`` sees the frames of its own chunk and of the ``left_chunks`` chunks before it
(``None``: every earlier chunk), and nothing after its chunk. It is what streaming recognition
computes (WeNet's dynamic chunk mask, Zhang et al. 2021), applied to the whole sequence at once,
so training and "simulated" decoding see exactly what chunk-by-chunk decoding sees:

* attention (:meth:`ChunkContext.windows`): each chunk's queries attend in a *window* of the frames
  they may see, its left chunks and itself, laid out as a sequence of its own with the usual
  right padding. Every inner attention runs on the windows unchanged (one signature, exact
  padding); the clustered variants so form their clusters over a window's frames only, and no
  query of a chunk reaches a later frame;
* the convolution module (:meth:`ChunkContext.limit_conv`): a frame's kernel sees its chunk and
  the frames before it, zeros after its chunk's end;
* per-utterance CMVN (:meth:`ChunkContext.prefix_ends`): a frame is normalised by the statistics
  of the utterance up to the end of its chunk.

:class:`ChunkTraining` draws a context per training batch (``model.streaming``): a chunk size
from a list, or full context for a share of batches, with a left context in frames.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ChunkContext:
    """Chunks of ``size`` encoder frames, each seeing ``left_chunks`` chunks back (None: all)."""

    size: int
    left_chunks: int | None = None

    def __post_init__(self) -> None:
        if int(self.size) < 1:
            raise ValueError(f"chunk size {self.size} encoder frames; expected >= 1")
        if self.left_chunks is not None and int(self.left_chunks) < 0:
            raise ValueError(f"left context {self.left_chunks} chunks; expected >= 0 (or None: all)")

    @classmethod
    def with_left_frames(cls, size: int, left_frames: int | None) -> ChunkContext:
        """Chunks of ``size`` frames with at least ``left_frames`` frames of left context
        (rounded up to whole chunks; None: all)."""
        return cls(size, None if left_frames is None else math.ceil(int(left_frames) / int(size)))

    @property
    def left_frames(self) -> int | None:
        """Frames of left context the chunk's first frame sees (None: all)."""
        return None if self.left_chunks is None else self.left_chunks * self.size

    def describe(self, frame_seconds: float) -> str:
        """``"chunks of 0.64 s (16 frames), left context 2.56 s"`` at ``frame_seconds`` a frame."""
        left = "every earlier frame" if self.left_chunks is None else f"{self.left_frames * frame_seconds:.2f} s"
        return f"chunks of {self.size * frame_seconds:.2f} s ({self.size} frames), left context {left}"

    def window_frames(self, n: int) -> int:
        """Frames of the longest window in a sequence of ``n`` frames."""
        return n if self.left_chunks is None else min(n, (self.left_chunks + 1) * self.size)

    def _starts(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Each chunk's first frame and its window's first frame, ``(chunks,)`` each."""
        starts = torch.arange(0, max(n, 1), self.size, device=device)
        if self.left_chunks is None:
            return starts, torch.zeros_like(starts)
        return starts, (starts - self.left_chunks * self.size).clamp_min(0)

    def windows(self, x: torch.Tensor, lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``x (B, H, N, ...)`` → the chunks' windows ``(B * chunks, H, W, ...)`` and their valid
        lengths ``(B * chunks,)``: window ``(b, i)`` holds frames ``[start_i, end_i)`` of sequence
        ``b``, from the first frame chunk ``i`` sees to its end (or the sequence's end)."""
        B, H, N = x.shape[:3]
        starts, window_starts = self._starts(N, x.device)
        W = self.window_frames(N)
        index = (window_starts[:, None] + torch.arange(W, device=x.device)[None, :]).clamp_max(N - 1)  # (C, W)
        chunks = index.shape[0]
        gathered = x[:, :, index.flatten()]  # (B, H, C * W, ...)
        gathered = gathered.view(B, H, chunks, W, *x.shape[3:]).transpose(1, 2)
        gathered = gathered.reshape(B * chunks, H, W, *x.shape[3:])
        valid = torch.full((B,), N, device=x.device) if lengths is None else lengths.to(x.device)
        ends = torch.minimum((starts + self.size)[None, :], valid[:, None])  # (B, C)
        window_lengths = (ends - window_starts[None, :]).clamp_min(0).flatten()
        return gathered, window_lengths

    def unwindow(self, y: torch.Tensor, n: int) -> torch.Tensor:
        """The inverse of :meth:`windows` for the chunks' own frames: ``(B * chunks, H, W, ...)``
        → ``(B, H, n, ...)``, frame ``t`` taken from its chunk's window."""
        starts, window_starts = self._starts(n, y.device)
        chunks, W = starts.shape[0], y.shape[2]
        y = y.view(-1, chunks, *y.shape[1:]).transpose(1, 2)  # (B, H, C, W, ...)
        frames = torch.arange(n, device=y.device)
        chunk_of = frames // self.size
        flat = y.reshape(*y.shape[:2], chunks * W, *y.shape[4:])
        return flat[:, :, chunk_of * W + frames - window_starts[chunk_of]]

    def limit_conv(self, y: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
        """A same-padded depthwise ``conv`` over ``y (B, D, N)``, each chunk's outputs seeing its
        chunk and the frames before it, zeros after the chunk's end: ``(B, D, N)``."""
        half = conv.kernel_size[0] // 2
        B, D, N = y.shape
        chunks = math.ceil(N / self.size)
        padded = nn.functional.pad(y, (half, chunks * self.size - N + half))
        windows = padded.unfold(2, self.size + 2 * half, self.size)  # (B, D, chunks, size + 2 half)
        if half:
            windows = torch.cat([windows[..., :half + self.size], windows.new_zeros(*windows.shape[:3], half)], -1)
        windows = windows.transpose(1, 2).reshape(B * chunks, D, self.size + 2 * half)
        out = nn.functional.conv1d(windows, conv.weight, conv.bias, groups=conv.groups)  # (B * chunks, D, size)
        return out.view(B, chunks, D, self.size).transpose(1, 2).reshape(B, D, chunks * self.size)[..., :N]

    def prefix_ends(self, frames: int, factor: int, device: torch.device) -> torch.Tensor:
        """``(frames,)``: for each input frame (before ``factor``-fold subsampling), the input
        frames up to the end of its chunk, the statistics a streaming per-utterance CMVN has."""
        per_chunk = self.size * factor
        return (torch.arange(frames, device=device) // per_chunk + 1) * per_chunk


@dataclass(frozen=True)
class ChunkTraining:
    """The chunks training draws from (``model.streaming``), one context per batch.

    Attributes:
        chunk_sizes: encoder frames a chunk may have, drawn uniformly.
        full_context: share of batches with no chunks (the whole utterance), in [0, 1).
        left_frames: encoder frames of left context (rounded up to whole chunks); None: all.
    """

    chunk_sizes: tuple[int, ...] = (4, 8, 16, 32)
    full_context: float = 0.5
    left_frames: int | None = 64

    def __post_init__(self) -> None:
        if not self.chunk_sizes or any(int(c) < 1 for c in self.chunk_sizes):
            raise ValueError(f"model.streaming.chunk_sizes={list(self.chunk_sizes)}; expected a non-empty list of "
                             "encoder frames >= 1")
        if not 0.0 <= float(self.full_context) < 1.0:
            raise ValueError(f"model.streaming.full_context={self.full_context}; expected a share in [0, 1)")
        if self.left_frames is not None and int(self.left_frames) < 0:
            raise ValueError(f"model.streaming.left_frames={self.left_frames}; expected >= 0 or null (all)")

    @classmethod
    def from_config(cls, cfg: Mapping | ChunkTraining | None) -> ChunkTraining | None:
        """From ``model.streaming`` (a mapping with this class's fields); None when it is None or
        its ``chunk_sizes`` is empty (full context only)."""
        if cfg is None or isinstance(cfg, ChunkTraining):
            return cfg
        unknown = set(cfg) - {"chunk_sizes", "full_context", "left_frames"}
        if unknown:
            raise ValueError(f"model.streaming: unknown key(s) {sorted(unknown)}; expected chunk_sizes, "
                             "full_context, left_frames")
        sizes = cfg.get("chunk_sizes", cls.chunk_sizes)
        sizes = (sizes,) if isinstance(sizes, int) else tuple(int(c) for c in sizes)
        if not sizes:
            return None
        left = cfg.get("left_frames", cls.left_frames)
        return cls(sizes, float(cfg.get("full_context", cls.full_context)), None if left is None else int(left))

    def draw(self, rng: random.Random | None = None) -> ChunkContext | None:
        """A context for one batch: None (full context) with probability ``full_context``."""
        rng = rng or random
        if rng.random() < self.full_context:
            return None
        return ChunkContext.with_left_frames(rng.choice(self.chunk_sizes), self.left_frames)

