"""Where each unit and word of a CTC hypothesis lies in time: forced alignment of the
hypothesis' units against the log-probabilities it was decoded from.

``torchaudio.functional.forced_align`` finds the best CTC path that spells exactly the
hypothesis' units (word boundaries ``|`` included, as the model emits them); a unit's frames
are those its path label covers, and a word spans the frames of its units (the ``|`` between
words belongs to no word). Times are frames × the model's output frame duration
(:func:`fastasr.recognition.recogniser.Recogniser.frame_seconds`: subsampling × frame shift).

The alignment keeps a back-pointer per frame and path state, ``T × (2L + 1)`` bytes: a
minute of audio is some 10 MB, an hour 10 GB. A long hypothesis is therefore cut at word
boundaries into pieces of about ``piece_frames`` frames, each aligned alone: the cuts sit at
the frame where the decoder emitted that boundary (``Hypothesis.frames``, greedy's argmax run
or the beam search's time step), so each piece holds the frames of its own units. Without
those frames (or where a piece cannot hold its units) the pieces are merged back.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
import torchaudio.functional as AF

from fastasr.data.tokenizer import ctc_min_frames
from fastasr.decoding.hypothesis import word_frames, word_unit_groups  # noqa: F401  (this module's API too)

log = logging.getLogger(__name__)

MAX_CELLS = 2**26  # T x (2L + 1) aligned in one piece (64 MB of back-pointers); above: cut into pieces
PIECE_FRAMES = 2000  # frames of a piece when cut (20 s at 10 ms frames, 80 s at 40 ms)


def _align_piece(log_probs: torch.Tensor, ids: Sequence[int], blank: int) -> list[tuple[int, int]]:
    """``[start, end)`` frames of each unit of ``ids`` in ``log_probs (T, V)`` (one forced_align)."""
    targets = torch.tensor([list(ids)], dtype=torch.int32)
    labels, _ = AF.forced_align(log_probs.unsqueeze(0).float().cpu().contiguous(), targets, blank=blank)
    labels = labels[0].tolist()
    spans: list[tuple[int, int]] = []
    prev = blank
    for t, label in enumerate(labels):
        if label != blank and label != prev:  # a new unit starts (equal neighbours have a blank between)
            spans.append((t, t + 1))
        elif label != blank:
            spans[-1] = (spans[-1][0], t + 1)
        prev = label
    if len(spans) != len(ids):
        raise RuntimeError(f"forced alignment gave {len(spans)} spans for {len(ids)} units")
    return spans


def _cuts(ids: Sequence[int], frames: Sequence[int], cut_before: Sequence[bool], total: int,
          piece_frames: int) -> list[tuple[int, int]]:
    """Unit indices where the hypothesis is cut (a cut before unit ``i`` at frame ``frames[i]``),
    as ``(unit index, frame)``: about ``piece_frames`` apart, at a unit ``cut_before`` allows (or,
    past twice that, at any unit), every piece able to hold its units."""
    cuts: list[tuple[int, int]] = [(0, 0)]
    for i in range(1, len(ids)):
        unit0, frame0 = cuts[-1]
        span = frames[i] - frame0
        if ids[i] == ids[i - 1] or span < piece_frames or not (cut_before[i] or span >= 2 * piece_frames):
            continue
        if ctc_min_frames(ids[unit0:i]) <= frames[i] - frame0 and ctc_min_frames(ids[i:]) <= total - frames[i]:
            cuts.append((i, frames[i]))
    return cuts


def align_units(log_probs: torch.Tensor, ids: Sequence[int], *, blank: int = 0,
                frames: Sequence[int] | None = None, cut_before: Sequence[bool] | None = None,
                max_cells: int = MAX_CELLS, piece_frames: int = PIECE_FRAMES) -> list[tuple[int, int]] | None:
    """The ``[start, end)`` output frames of each unit of a hypothesis.

    Args:
        log_probs: ``(T, V)`` log-probabilities the hypothesis was decoded from.
        ids: the hypothesis' unit ids (word boundaries included), ``(L,)``.
        blank: the CTC blank's id.
        frames: the frame at which the decoder emitted each unit (``Hypothesis.frames``); lets
            a long hypothesis be aligned in pieces. None: one piece, whatever its size.
        cut_before: where a piece should begin (``True`` at word boundaries: the cut then falls
            between words); a piece twice ``piece_frames`` long is cut anywhere. None: anywhere.
        max_cells: ``T × (2L + 1)`` up to which the hypothesis is aligned in one piece.
        piece_frames: the frames of a piece beyond that.

    Returns:
        ``L`` spans, or None when no CTC path spells ``ids`` in ``T`` frames (a hypothesis that
        did not come from these log-probabilities).
    """
    ids = [int(i) for i in ids]
    total = int(log_probs.shape[0])
    if not ids:
        return []
    if ctc_min_frames(ids) > total:
        return None
    usable = (frames is not None and len(frames) == len(ids)
              and all(0 <= a <= b < total for a, b in zip(frames, list(frames[1:]) + [total - 1])))
    cuts = [(0, 0)]
    if usable and total * (2 * len(ids) + 1) > max_cells:
        cuts = _cuts(ids, frames, cut_before or [True] * len(ids), total, piece_frames)
    bounds = cuts + [(len(ids), total)]
    spans: list[tuple[int, int]] = []
    for (u0, f0), (u1, f1) in zip(bounds, bounds[1:]):
        try:
            piece = _align_piece(log_probs[f0:f1], ids[u0:u1], blank)
        except RuntimeError as err:  # e.g. -inf scores on every path: no alignment
            log.warning("forced alignment of units %d-%d over frames %d-%d failed: %s", u0, u1, f0, f1, err)
            return None
        spans.extend((f0 + a, f0 + b) for a, b in piece)
    return spans
