"""Audio I/O: read any soundfile-readable file as a mono float waveform at a
chosen sample rate (checking that the samples are usable), and write 16-bit PCM wavs."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torchaudio.functional as AF
import torchaudio.transforms as AT

# A file is "truncated" when it holds less audio than its manifest duration by more than this.
TRUNCATION_TOLERANCE_S = 0.1
TRUNCATION_TOLERANCE_FRACTION = 0.1


class BadAudioError(ValueError):
    """An audio file whose samples cannot be used. ``path`` is the file, ``reason`` says what
    was found and what was expected (``str()`` gives both)."""

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = str(path), reason


def load_audio(path: str | Path, sample_rate: int | None = None, channels: int | None = None,
               expected_seconds: float | None = None) -> torch.Tensor:
    """Read an audio file as a mono waveform, checking that its samples are usable.

    Multi-channel audio is mixed down by averaging the channels; when
    ``sample_rate`` is given and differs from the file's rate, the waveform is
    resampled with ``torchaudio.functional.resample``.

    Args:
        channels: the channel count the file must have (None: any, mixed down).
        expected_seconds: the duration the manifest gives; a file shorter by more than
            ``max(TRUNCATION_TOLERANCE_S, TRUNCATION_TOLERANCE_FRACTION × expected)`` is truncated.

    Returns:
        float32 tensor of shape ``(T,)`` with values in [-1, 1].

    Raises:
        BadAudioError: the file cannot be decoded (corrupt, truncated FLAC, unknown format),
            has 0 samples, NaN or infinite samples, another channel count than ``channels``,
            or less audio than ``expected_seconds``.
    """
    try:
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)  # (T, C)
    except (RuntimeError, OSError, EOFError, ValueError) as err:  # soundfile: LibsndfileError (a RuntimeError)
        raise BadAudioError(path, f"unreadable ({str(err).strip()}); expected audio soundfile can decode") from None
    if data.shape[0] == 0:
        raise BadAudioError(path, "0 samples; expected non-empty audio")
    if channels is not None and data.shape[1] != channels:
        raise BadAudioError(path, f"{data.shape[1]} channels; expected {channels} (features.channels)")
    finite = np.isfinite(data)
    if not finite.all():
        raise BadAudioError(path, f"{int((~finite).sum())} NaN or infinite sample(s) of {data.size}; expected finite samples")
    if expected_seconds is not None:
        seconds = data.shape[0] / rate
        if seconds < expected_seconds - max(TRUNCATION_TOLERANCE_S, TRUNCATION_TOLERANCE_FRACTION * expected_seconds):
            raise BadAudioError(path, f"truncated: {seconds:.2f} s of audio; the manifest says {expected_seconds:.2f} s")
    wav = torch.from_numpy(data.mean(axis=1) if data.shape[1] > 1 else data[:, 0])
    if sample_rate is not None and rate != sample_rate:
        wav = resample(wav, rate, sample_rate)
    return wav


def file_sample_rate(path: str | Path) -> int:
    """The sample rate in ``path``'s header (soundfile; the samples are not read).

    Raises:
        BadAudioError: soundfile cannot read the header.
    """
    try:
        return int(sf.info(str(path)).samplerate)
    except (RuntimeError, OSError, EOFError, ValueError) as err:
        raise BadAudioError(path, f"unreadable header ({str(err).strip()}); expected audio soundfile can decode") from None


@lru_cache(maxsize=16)
def _resampler(orig_rate: int, new_rate: int) -> AT.Resample:
    return AT.Resample(orig_rate, new_rate)  # builds the windowed-sinc kernel once


def resample(wav: torch.Tensor, orig_rate: int, new_rate: int) -> torch.Tensor:
    """Resample a float32 waveform ``(..., T)`` from ``orig_rate`` to ``new_rate`` Hz
    (``torchaudio``'s windowed-sinc resampling; the kernel is cached per rate pair)."""
    if orig_rate == new_rate:
        return wav
    if wav.device.type != "cpu":
        return AF.resample(wav, int(orig_rate), int(new_rate))
    with torch.no_grad():
        return _resampler(int(orig_rate), int(new_rate))(wav.to(torch.float32))


def write_wav(path: str | Path, wav: np.ndarray | torch.Tensor, sample_rate: int) -> None:
    """Write a mono float waveform ``(T,)`` in [-1, 1] as a 16-bit PCM wav (clipped)."""
    if isinstance(wav, torch.Tensor):
        wav = wav.detach().cpu().numpy()
    pcm = np.clip(np.round(np.asarray(wav, dtype=np.float64) * 32767.0), -32768, 32767)
    sf.write(str(path), pcm.astype(np.int16), int(sample_rate), subtype="PCM_16")


def audio_duration(path: str | Path) -> float:
    """Duration in seconds from the file header (no decoding)."""
    info = sf.info(str(path))
    return info.frames / float(info.samplerate)
