"""Where a long recording is cut into windows for the model, without PyTorch: the windows
(:func:`plan_windows`), the output frames of an input (:func:`output_frames`) and the
``long_form`` settings (:class:`LongFormConfig`). :mod:`fastasr.decoding.long_form` runs the
model over them; the ONNX runtime (:mod:`fastasr.onnx`) plans the same windows."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from fastasr.sections import dataclass_from_mapping

MODES = ("auto", "one_pass", "windowed")


@dataclass(frozen=True)
class LongFormConfig:
    """How a recording reaches the model (``long_form`` of ``conf/transcribe.yaml``)."""

    mode: str = "auto"        # auto | one_pass | windowed
    window_s: float = 10.0    # windowed: seconds of audio per window
    overlap_s: float = 4.0    # windowed: seconds two consecutive windows share (half dropped from each)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"long_form.mode={self.mode!r}; expected one of {MODES}")
        if not self.window_s > 0:
            raise ValueError(f"long_form.window_s={self.window_s}; expected > 0 seconds")
        if not 0 <= self.overlap_s < self.window_s:
            raise ValueError(f"long_form.overlap_s={self.overlap_s}; expected 0 <= overlap_s < window_s "
                             f"({self.window_s})")

    @classmethod
    def from_dict(cls, cfg: Mapping | LongFormConfig | None) -> LongFormConfig:
        """From a mapping (or DictConfig); None: the defaults; unknown keys raise ``ValueError``."""
        return dataclass_from_mapping(cls, cfg, "long_form")


@dataclass(frozen=True)
class Window:
    """One model input cut from a recording, and the part of its output that is kept.

    ``start``/``end``: its input (feature) frames ``[start, end)``; ``keep``: the output
    frames of the window kept, ``[keep_start, keep_end)`` (window-relative); ``to``: the
    recording's output frame the first kept frame becomes."""

    start: int
    end: int
    keep_start: int
    keep_end: int
    to: int


def output_frames(frames: int, subsampling: int) -> int:
    """Output frames of ``frames`` input frames (each stride-2 convolution: ``ceil(T / 2)``)."""
    for _ in range(subsampling.bit_length() - 1):
        frames = (frames + 1) // 2
    return frames


def plan_windows(frames: int, subsampling: int, window: int, overlap: int) -> list[Window]:
    """The windows of a recording of ``frames`` input frames.

    ``window`` and ``overlap`` are input frames, rounded down to multiples of ``subsampling``
    (a window holds at least one output frame; the overlap is less than the window). Window
    ``k`` covers output frames ``[k h, k h + w)`` (``w``, ``o``: window and overlap in output
    frames, hop ``h = w - o``) and keeps ``[k h + o // 2, (k + 1) h + o // 2)``; the first keeps
    from 0, the last to the end. One window when the recording fits in it."""
    s = subsampling
    total = output_frames(frames, s)
    w = max(1, window // s)
    o = min(max(0, overlap // s), w - 1)
    h, a = w - o, o // 2
    count = 1 if total <= w else 1 + math.ceil((total - w) / h)
    out: list[Window] = []
    for k in range(count):
        first, last = k * h, min(k * h + w, total)
        keep_from = 0 if k == 0 else first + a
        keep_to = total if k == count - 1 else (k + 1) * h + a
        out.append(Window(first * s, min(last * s, frames), keep_from - first, keep_to - first, keep_from))
    return out
