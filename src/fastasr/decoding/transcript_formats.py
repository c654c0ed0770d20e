"""A transcription and its files, without PyTorch: :class:`Transcription` with its timed
:class:`Word` s (one JSON line each), SubRip subtitles (:func:`srt_text`) and NIST CTM
(:func:`ctm_lines`). ``fastasr-transcribe`` (``Recogniser.transcribe``) and the ONNX
runtime (:mod:`fastasr.onnx`) give the same objects and write the same files."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Word:
    """A recognised word and where it was spoken: ``start`` / ``end`` in seconds from the
    beginning of the recording (0 ≤ start ≤ end ≤ duration)."""

    word: str
    start: float
    end: float


@dataclass
class Transcription:
    """What ``Recogniser.transcribe`` and the ONNX runtime's ``OnnxRecogniser.transcribe`` give for
    one input (and ``fastasr-transcribe`` / ``fastasr-onnx-transcribe`` write
    as one JSON line).

    Attributes:
        id: the input's name (a file's stem, a manifest's id, ``waveform-<i>``).
        audio_filepath: the file; None for a waveform.
        text: the words, space-separated ("" when nothing was recognised, or on error).
        words: each word with its start and end time.
        units: the recognised units (phonemes, characters or subwords; ``|`` between words).
        duration: seconds of audio.
        real_words: False when the words are a phoneme model's phonetic words (no lexicon).
        score: the beam search's score (None for greedy decoding).
        mode: how the model read it: ``one_pass`` or ``windowed`` (``fastasr.decoding.long_form``).
        error: why the input could not be transcribed (unusable audio); None when it was.
    """

    id: str
    audio_filepath: str | None
    text: str
    words: list[Word]
    units: list[str]
    duration: float
    real_words: bool = True
    score: float | None = None
    mode: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the input was transcribed."""
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a JSON line: ``id, audio_filepath, duration, text, words [{word, start,
        end}], units`` (space-separated), ``real_words``, ``mode``, ``score`` (and ``error``)."""
        out = {"id": self.id, "audio_filepath": self.audio_filepath, "duration": self.duration, "text": self.text,
               "words": [asdict(w) for w in self.words], "units": " ".join(self.units),
               "real_words": self.real_words, "mode": self.mode, "score": self.score}
        if self.error is not None:
            out["error"] = self.error
        return out


SRT_MAX_WORDS = 12  # words per subtitle
SRT_MAX_SECONDS = 6.0  # a subtitle's longest span
SRT_PAUSE_SECONDS = 1.0  # a pause this long between two words starts a new subtitle


def _timestamp(seconds: float) -> str:
    ms = int(round(seconds * 1000))
    return f"{ms // 3_600_000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d},{ms % 1000:03d}"


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
