"""Kaldi's log-mel filterbank in numpy, computed on whole arrays: the runtime's features.

The computation of ``torchaudio.compliance.kaldi.fbank`` (training's,
``fastasr.data.features.Fbank``) and of kaldi-native-fbank (sherpa-onnx's): frames of
``frame_length_ms`` every ``frame_shift_ms``, DC removed, pre-emphasis 0.97, the povey window,
zero-padded to a power of two, the power spectrum, triangular mel bins from ``low_freq`` to
``high_freq`` (≤ 0: that far below the Nyquist frequency), the log floored at float32's epsilon;
no dither, no energy. ``snip_edges``: frames lie wholly inside the samples (Kaldi's default,
training's); otherwise ``round(samples / shift)`` frames centred on each hop, the edges
reflected (sherpa-onnx's, lhotse's and icefall's). ``scale``: what the samples in [-1, 1] are
multiplied by first (32768: Kaldi's int16 range).

Frames are cut as strided views of the samples and transformed a block at a time (bounded
memory for an hour-long recording), one FFT and one matrix product a block, in float64 (numpy's
float64 FFT is as fast as its float32 one here, and the result is nearer Kaldi's exact value
than training's float32 torchaudio: within 1e-4 of the float64 computation, where torchaudio's
float32 rounding reaches 1.4e-4 in low-energy bins of speech).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = ["FilterbankOptions", "KALDI_FEATURES", "SHERPA_ONNX_FEATURES", "log_mel", "mel_banks", "num_frames"]

#: The floor of a mel energy before its log (Kaldi's and torchaudio's: float32's epsilon).
ENERGY_FLOOR = float(np.finfo(np.float32).eps)
PREEMPHASIS = 0.97
BLOCK_FRAMES = 4096  # frames transformed at a time
#: sherpa-onnx's default filterbank settings where they are not Kaldi's (its ``FeatureExtractorConfig``'s,
#: lhotse's and icefall's), named as training's (``fastasr.data.features.FeatureConfig``): samples in
#: [-1, 1] (its offline recognisers'; its online one gives a WeNet model int16-scaled samples), frames
#: centred on the hops, the mel bins up to 400 Hz below the Nyquist frequency.
SHERPA_ONNX_FEATURES = {"snip_edges": False, "high_freq": -400.0, "sample_scale": 1.0}
#: Kaldi's defaults of the same settings.
KALDI_FEATURES = {"snip_edges": True, "high_freq": 0.0, "sample_scale": 32768.0}


@dataclass(frozen=True)
class FilterbankOptions:
    """A filterbank's settings (module docstring)."""

    sample_rate: int = 16000
    num_mel_bins: int = 80
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    low_freq: float = 20.0
    high_freq: float = 0.0
    snip_edges: bool = True
    scale: float = 1.0

    @property
    def window(self) -> int:
        return int(self.sample_rate * self.frame_length_ms / 1000)

    @property
    def shift(self) -> int:
        return int(self.sample_rate * self.frame_shift_ms / 1000)

    @property
    def fft_size(self) -> int:
        return 1 << (self.window - 1).bit_length()


def num_frames(samples: int, options: FilterbankOptions) -> int:
    """Kaldi's frame count for ``samples`` (0 where ``snip_edges`` and fewer than a window)."""
    window, shift = options.window, options.shift
    if options.snip_edges:
        return 0 if samples < window else 1 + (samples - window) // shift
    return (samples + shift // 2) // shift


@lru_cache(maxsize=16)
def mel_banks(options: FilterbankOptions) -> np.ndarray:
    """``(fft_size // 2 + 1, num_mel_bins)`` triangular weights (Kaldi's ``MelBanks``; the Nyquist
    bin weighs nothing), computed in float32 arithmetic as torchaudio computes training's: the
    narrow low bins' weights carry float32's rounding (up to 8e-4 of a weight), which the log-mel
    energies then show."""
    f32 = np.float32
    nyquist = 0.5 * options.sample_rate
    high = options.high_freq if options.high_freq > 0 else nyquist + options.high_freq
    if not 0.0 <= options.low_freq < high <= nyquist:
        raise ValueError(f"filterbank: low_freq {options.low_freq} and high_freq {options.high_freq} give "
                         f"[{options.low_freq}, {high}] Hz; expected 0 <= low < high <= {nyquist}")
    bins = options.num_mel_bins
    mel_low, mel_high = 1127.0 * math.log(1.0 + options.low_freq / 700.0), 1127.0 * math.log(1.0 + high / 700.0)
    delta = f32((mel_high - mel_low) / (bins + 1))
    index = np.arange(bins, dtype=f32)[None, :]
    left, centre, right = (f32(mel_low) + index * delta, f32(mel_low) + (index + f32(1)) * delta,
                           f32(mel_low) + (index + f32(2)) * delta)
    freq = f32(options.sample_rate / options.fft_size) * np.arange(options.fft_size // 2, dtype=f32)
    mel = (f32(1127.0) * np.log(f32(1.0) + freq / f32(700.0)))[:, None]
    weights = np.maximum(f32(0.0), np.minimum((mel - left) / (centre - left), (right - mel) / (right - centre)))
    return np.concatenate([weights, np.zeros((1, bins), f32)]).astype(np.float64)


@lru_cache(maxsize=16)
def _povey(window: int) -> np.ndarray:
    n = np.arange(window, dtype=np.float64)
    return (0.5 - 0.5 * np.cos(2 * math.pi * n / (window - 1))) ** 0.85


def log_mel(waveform: np.ndarray, options: FilterbankOptions) -> np.ndarray:
    """``(frames, num_mel_bins)`` float32 log-mel filterbanks of a mono ``waveform`` in [-1, 1]
    (module docstring). No frames (``(0, num_mel_bins)``) for input shorter than Kaldi frames."""
    samples = np.asarray(waveform, dtype=np.float64).reshape(-1)
    if options.scale != 1.0:
        samples = samples * options.scale
    window, shift = options.window, options.shift
    frames = num_frames(samples.shape[0], options)
    out = np.empty((frames, options.num_mel_bins), np.float32)
    if frames == 0:
        return out
    if not options.snip_edges:  # frame i starts at i * shift + shift // 2 - window // 2, the edges mirrored
        left = window // 2 - shift // 2
        right = max(0, (frames - 1) * shift - left + window - samples.shape[0])
        samples = _mirrored(samples, left, right)
    views = sliding_window_view(samples, window)[::shift][:frames]  # (frames, window), no copy
    povey, banks, size = _povey(window), mel_banks(options), options.fft_size
    for first in range(0, frames, BLOCK_FRAMES):
        block = views[first:first + BLOCK_FRAMES]
        x = block - block.mean(axis=1, keepdims=True)
        x = np.concatenate([x[:, :1] * (1.0 - PREEMPHASIS), x[:, 1:] - PREEMPHASIS * x[:, :-1]], axis=1)
        spectrum = np.fft.rfft(x * povey, n=size, axis=1)
        energies = (spectrum.real ** 2 + spectrum.imag ** 2) @ banks
        out[first:first + block.shape[0]] = np.log(np.maximum(energies, ENERGY_FLOOR))
    return out


def _mirrored(samples: np.ndarray, left: int, right: int) -> np.ndarray:
    """``samples`` with ``left`` and ``right`` samples mirrored at its ends, the edge sample
    repeated (Kaldi's reflection: index -1 reads 0, n reads n - 1), repeatedly for short input."""
    n = samples.shape[0]
    index = np.concatenate([np.arange(-left, 0), np.arange(n, n + right)])
    while index.size and ((index < 0) | (index >= n)).any():
        index = np.where(index < 0, -index - 1, index)
        index = np.where(index >= n, 2 * n - 1 - index, index)
    return np.concatenate([samples[index[:left]], samples, samples[index[left:]]])
