"""Recordings to transcribe: audio files or in-memory waveforms, checked and turned into features.

Transcription (:meth:`fastasr.recognition.recogniser.Recogniser.transcribe`) takes what a user has — a
path, a waveform with its sample rate, a manifest line — as a :class:`Recording`. Its audio is
read by the same checked load as every feature path (:func:`fastasr.data.features.load_utterance_audio`:
finite, non-empty, not shorter than a manifest duration), resampled to the recogniser's rate,
with two differences that suit files found on a disk rather than a curated corpus:

* any channel count is mixed down to mono (``features.channels`` is a training-corpus rule);
* a missing path, a directory, an unreadable (permission) or empty (0-byte) file, and a WAV
  file whose header promises more samples than the file holds (:func:`wav_truncation`;
  soundfile would silently read what is there) are bad audio too, each with its reason.

Unusable audio raises :class:`fastasr.data.audio.BadAudioError`; in a dataset it becomes a
skipped item (``fastasr.data.bad_audio``), so one bad file never stops the others. A
recording is never cut or filtered by length: a one-hour file gives one ``(frames, bins)``
feature matrix (``fastasr.decoding.long_form`` decides how the model sees it).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from fastasr.data.audio import BadAudioError, resample
from fastasr.data.bad_audio import skipped_item
from fastasr.data.features import Fbank, FeatureConfig, load_utterance_audio

# What a directory is searched for (recursively, case-insensitively): the formats soundfile reads.
AUDIO_EXTENSIONS = frozenset({".wav", ".wave", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".sph", ".nist",
                              ".aif", ".aiff", ".aifc", ".au", ".snd", ".w64", ".rf64", ".caf"})


@dataclass(frozen=True)
class Recording:
    """One thing to transcribe: an audio file (``audio_filepath``) or a waveform in memory.

    Attributes:
        id: a name for it (a file's stem, a manifest's ``id``, ``waveform-<i>``).
        audio_filepath: the file; None for a waveform.
        waveform: ``(T,)`` mono, or ``(C, T)`` / ``(T, C)`` (the shorter axis is the channels,
            averaged), float in [-1, 1].
        sample_rate: the waveform's rate in Hz (files carry their own).
        duration: the duration a manifest gives (s); audio shorter than it is truncated.
    """

    id: str
    audio_filepath: str | None = None
    waveform: torch.Tensor | np.ndarray | None = field(default=None, repr=False, compare=False)
    sample_rate: int | None = None
    duration: float | None = None

    @property
    def name(self) -> str:
        """What a report calls it: the path, else the id."""
        return self.audio_filepath if self.audio_filepath is not None else self.id

    @classmethod
    def of(cls, item: Any, sample_rate: int | None = None, index: int = 0) -> Recording:
        """A recording from a path (str / PathLike), a waveform (tensor or array, with
        ``sample_rate``), a :class:`Recording`, or a manifest utterance (``audio_filepath``,
        ``duration``, ``id``)."""
        if isinstance(item, Recording):
            return item
        if isinstance(item, (str, os.PathLike)):
            return cls(id=Path(item).stem or str(item), audio_filepath=str(item))
        if isinstance(item, (torch.Tensor, np.ndarray)):
            if sample_rate is None:
                raise ValueError(f"audio item {index} is a waveform; give its sample_rate (Hz)")
            return cls(id=f"waveform-{index}", waveform=item, sample_rate=int(sample_rate))
        if hasattr(item, "audio_filepath"):
            return cls(id=str(getattr(item, "id", None) or Path(item.audio_filepath).stem),
                       audio_filepath=str(item.audio_filepath), duration=getattr(item, "duration", None))
        raise TypeError(f"audio item {index}: {type(item).__name__}; expected a path, a waveform "
                        "(torch.Tensor / numpy array with sample_rate) or a Recording")


def wav_truncation(path: str | Path) -> str | None:
    """Why a RIFF/WAVE file is truncated (its ``data`` chunk declares more bytes than the file
    holds), or None: not truncated, not a RIFF file, or a streaming header (size 0 or
    0xFFFFFFFF). Reads the chunk headers only."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(12)
            if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
                return None
            offset = 12
            while offset + 8 <= size:
                f.seek(offset)
                chunk, length = struct.unpack("<4sI", f.read(8))
                if chunk == b"data":
                    held = size - offset - 8
                    if length in (0, 0xFFFFFFFF) or length <= held:
                        return None
                    return (f"truncated: the WAV header declares {length} bytes of samples, the file holds "
                            f"{held}; expected a complete file")
                offset += 8 + length + (length & 1)
    except OSError:
        return None
    return None


def _check_file(path: str) -> None:
    """Raise ``BadAudioError`` for a path that cannot be audio before any decoding is tried."""
    p = Path(path)
    if not p.exists():
        raise BadAudioError(path, "no such file; expected an audio file")
    if p.is_dir():
        raise BadAudioError(path, "a directory; expected an audio file")
    if not os.access(p, os.R_OK):
        raise BadAudioError(path, "unreadable: permission denied; expected a readable audio file")
    if p.stat().st_size == 0:
        raise BadAudioError(path, "empty file (0 bytes); expected audio")
    truncated = wav_truncation(p)
    if truncated:
        raise BadAudioError(path, truncated)


def recording_audio(recording: Recording, features: FeatureConfig) -> torch.Tensor:
    """The mono waveform ``(T,)`` float32 of ``recording`` at ``features.sample_rate``.

    Raises ``BadAudioError`` (path or id, and reason) for unusable audio (module docstring)."""
    config = replace(features, channels=None)  # any channel count, mixed down
    rate = config._rate()
    if recording.audio_filepath is not None:
        _check_file(recording.audio_filepath)
        return load_utterance_audio(recording, config)
    wav = torch.as_tensor(recording.waveform).detach().to("cpu", torch.float32)
    if wav.ndim == 2:  # channels on the shorter axis: (C, T) as torchaudio, (T, C) as soundfile
        wav = wav.mean(dim=0 if wav.shape[0] <= wav.shape[1] else 1)
    if wav.ndim != 1:
        raise BadAudioError(recording.id, f"waveform of shape {tuple(wav.shape)}; expected (T,) or (C, T)")
    if wav.numel() == 0:
        raise BadAudioError(recording.id, "0 samples; expected non-empty audio")
    finite = torch.isfinite(wav)
    if not finite.all():
        raise BadAudioError(recording.id, f"{int((~finite).sum())} NaN or infinite sample(s) of {wav.numel()}; "
                                          "expected finite samples")
    return resample(wav, int(recording.sample_rate), rate)


class RecordingFeatures(Dataset):
    """``dataset[i]`` → ``{"index": i, "features": (frames, bins) float32, "seconds": float}``
    for a usable recording, else ``{"index": i, "skipped": SkippedUtterance(id, path, reason)}``.
    No dither; no length limit."""

    def __init__(self, recordings: list[Recording], features: FeatureConfig | Mapping) -> None:
        self.recordings = list(recordings)
        self.fbank = Fbank(features)

    def __len__(self) -> int:
        return len(self.recordings)

    def __getitem__(self, i: int) -> dict[str, Any]:
        rec = self.recordings[i]
        try:
            wav = recording_audio(rec, self.fbank.config)
        except BadAudioError as err:
            return {"index": i, **skipped_item(rec.id, rec.name, err.reason)}
        return {"index": i, "features": self.fbank(wav), "seconds": wav.shape[0] / self.fbank.config.sample_rate}
