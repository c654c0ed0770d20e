"""Audio I/O: read any soundfile-readable file as a mono float waveform at a
chosen sample rate, and write 16-bit PCM wavs."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torchaudio.functional as AF
import torchaudio.transforms as AT


def load_audio(path: str | Path, sample_rate: int | None = None) -> torch.Tensor:
    """Read an audio file as a mono waveform.

    Multi-channel audio is mixed down by averaging the channels; when
    ``sample_rate`` is given and differs from the file's rate, the waveform is
    resampled with ``torchaudio.functional.resample``.

    Returns:
        float32 tensor of shape ``(T,)`` with values in [-1, 1].
    """
    data, rate = sf.read(str(path), dtype="float32", always_2d=True)  # (T, C)
    wav = torch.from_numpy(data.mean(axis=1) if data.shape[1] > 1 else data[:, 0])
    if sample_rate is not None and rate != sample_rate:
        wav = resample(wav, rate, sample_rate)
    return wav


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
