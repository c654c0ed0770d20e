"""Recordings of any length through the model: in one pass, or in overlapping windows.

A recording's features ``(frames, bins)`` become its log-probabilities ``(T', V)`` at the
model's output rate (``T' = ceil(frames / subsampling)``), ready for one decoder pass:

* ``one_pass``: the whole recording through the model at once. With clustered or improved
  clustered attention time and memory grow linearly with its length.
* ``windowed`` (NeMo's buffered inference is the model): windows of ``window_s`` seconds,
  consecutive ones overlapping by ``overlap_s``, each run through the model alone (batched);
  of each window only its middle is kept — ``overlap_s / 2`` is dropped at either inner edge —
  and the kept parts tile the recording exactly. Windows start at feature frames that are
  multiples of the subsampling factor, so output frame ``j`` of a window that starts at input
  frame ``s`` is output frame ``s / subsampling + j`` of the recording: the bookkeeping is
  frame-exact, and a window at least as long as the recording is the one-pass result.
* ``auto``: one pass when the attention the model would run at the recording's length costs
  linear time (clustered, i-clustered, LSH; ``auto`` attention above its crossover, by the
  rule of :meth:`fastasr.attention.auto.AutoAttention.choose`), windows when it is quadratic
  (full, top-k).

A model trained on short utterances may read a long one worse than its pieces: positions it
never saw, attention spread over a context it never had (docs/TRANSCRIBE.md). Windows about
the training utterances' length keep it in its trained regime.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fastasr.decoding.windows import MODES, LongFormConfig, Window, output_frames, plan_windows

__all__ = ["MODES", "LongFormConfig", "Window", "output_frames", "plan_windows", "attention_cost",
           "inner_attention_cost", "resolve_mode", "long_form_log_probs"]

def attention_cost(model: nn.Module, length: int) -> str:
    """``linear`` or ``quadratic``: the cost of the attention ``model`` runs on ``length`` output
    frames without autograd (``auto`` attention: the variant it chooses at that length)."""
    layers = model.attention_layers() if hasattr(model, "attention_layers") else []
    return inner_attention_cost(layers[0].inner, length) if layers else "linear"


def inner_attention_cost(inner: nn.Module, length: int) -> str:
    """``linear`` or ``quadratic``: the cost of inner attention ``inner`` on ``length`` positions
    without autograd (``auto``: the variant it chooses at that length)."""
    if hasattr(inner, "choose"):  # AutoAttention: its own rule, as decoding runs it (no autograd)
        with torch.no_grad():
            inner = inner.choose(length)
    return inner.length_cost


def resolve_mode(config: LongFormConfig, model: nn.Module, length: int) -> str:
    """``one_pass`` or ``windowed`` for a recording of ``length`` output frames (``auto``: by
    :func:`attention_cost`)."""
    if config.mode != "auto":
        return config.mode
    return "one_pass" if attention_cost(model, length) == "linear" else "windowed"


@dataclass(frozen=True)
class _Piece:
    recording: int
    window: Window


def _batches(pieces: Sequence[_Piece], batch_size: int, max_frames: int) -> Iterator[list[_Piece]]:
    """Consecutive pieces, at most ``batch_size`` and ``max_frames`` padded input frames a batch
    (a piece longer than that alone)."""
    batch: list[_Piece] = []
    longest = 0
    for piece in pieces:
        n = piece.window.end - piece.window.start
        if batch and (len(batch) >= batch_size or max(longest, n) * (len(batch) + 1) > max_frames):
            yield batch
            batch, longest = [], 0
        batch.append(piece)
        longest = max(longest, n)
    if batch:
        yield batch


def long_form_log_probs(model: nn.Module, features: Sequence[torch.Tensor], config: LongFormConfig | None = None, *,
                        frame_shift_ms: float = 10.0, batch_size: int = 4, max_frames_per_batch: int = 48000,
                        device: str | torch.device = "cpu") -> list[torch.Tensor]:
    """The log-probabilities of each recording.

    Args:
        model: a ``CTCModel`` (``forward(features (B,T,F), lengths (B,)) -> (log_probs (B,T',V),
            lengths)``, ``subsampling_factor``, ``attention_layers()``), in eval mode on ``device``.
        features: each recording's ``(frames, bins)`` filterbanks (raw: CMVN is the model's).
        config: one pass, windows or auto (:class:`LongFormConfig`); None: the defaults.
        frame_shift_ms: the features' frame shift (to turn ``window_s`` into frames).
        batch_size: model inputs (recordings or windows) run together.
        max_frames_per_batch: padded input frames a batch may hold (a longer input runs alone).

    Returns:
        ``(T'_i, V)`` float32 CPU tensors, ``T'_i = ceil(frames_i / subsampling)``.
    """
    config = config or LongFormConfig()
    s = int(getattr(model, "subsampling_factor", 1))
    window = int(round(config.window_s * 1000.0 / frame_shift_ms))
    overlap = int(round(config.overlap_s * 1000.0 / frame_shift_ms))
    pieces: list[_Piece] = []
    totals = [output_frames(int(f.shape[0]), s) for f in features]
    for r, feats in enumerate(features):
        frames = int(feats.shape[0])
        if resolve_mode(config, model, totals[r]) == "windowed":
            pieces += [_Piece(r, w) for w in plan_windows(frames, s, window, overlap)]
        else:
            pieces.append(_Piece(r, Window(0, frames, 0, totals[r], 0)))
    outputs: list[torch.Tensor | None] = [None] * len(features)
    with torch.inference_mode():
        for batch in _batches(pieces, max(1, batch_size), max_frames_per_batch):
            inputs = [features[p.recording][p.window.start:p.window.end] for p in batch]
            lengths = torch.tensor([x.shape[0] for x in inputs], dtype=torch.long)
            padded = nn.utils.rnn.pad_sequence(inputs, batch_first=True)
            log_probs, out_lengths = model(padded.to(device), lengths.to(device))
            log_probs, out_lengths = log_probs.float().cpu(), out_lengths.cpu()
            for b, p in enumerate(batch):
                w = p.window
                if int(out_lengths[b]) < w.keep_end:
                    raise RuntimeError(f"window [{w.start}, {w.end}) gave {int(out_lengths[b])} output frames; "
                                       f"expected at least {w.keep_end}")
                if outputs[p.recording] is None:
                    outputs[p.recording] = torch.empty(totals[p.recording], log_probs.shape[-1])
                outputs[p.recording][w.to:w.to + w.keep_end - w.keep_start] = log_probs[b, w.keep_start:w.keep_end]
    return outputs
