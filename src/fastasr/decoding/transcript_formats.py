"""The files a transcription writes besides its JSON lines, from timed words: SubRip subtitles
(:func:`srt_text`) and NIST CTM (:func:`ctm_lines`). No PyTorch: ``python -m fastasr.transcribe``
and the ONNX runtime (:mod:`fastasr.onnx`) write the same files."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

SRT_MAX_WORDS = 12  # words per subtitle
SRT_MAX_SECONDS = 6.0  # a subtitle's longest span
SRT_PAUSE_SECONDS = 1.0  # a pause this long between two words starts a new subtitle


def _timestamp(seconds: float) -> str:
    ms = int(round(seconds * 1000))
    return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d},{ms % 1000:03d}"


def srt_text(words: Iterable[Any]) -> str:
    """SubRip subtitles of timed words (``.word``, ``.start``, ``.end``): a cue holds at most
    ``SRT_MAX_WORDS`` words over at most ``SRT_MAX_SECONDS``; a pause of ``SRT_PAUSE_SECONDS`` ends one."""
    cues: list[list[Any]] = []
    for w in words:
        cue = cues[-1] if cues else None
        if (cue is None or len(cue) >= SRT_MAX_WORDS or w.end - cue[0].start > SRT_MAX_SECONDS
                or w.start - cue[-1].end >= SRT_PAUSE_SECONDS):
            cues.append([w])
        else:
            cue.append(w)
    return "".join(f"{i}\n{_timestamp(c[0].start)} --> {_timestamp(c[-1].end)}\n{' '.join(w.word for w in c)}\n\n"
                   for i, c in enumerate(cues, start=1))


def ctm_lines(transcription: Any) -> str:
    """NIST CTM lines of a transcription: ``<id> 1 <start> <duration> <word>`` (seconds)."""
    return "".join(f"{transcription.id} 1 {w.start:.3f} {w.end - w.start:.3f} {w.word}\n" for w in transcription.words)
