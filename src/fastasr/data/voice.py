"""Voice changes of a waveform: its pitch (F0) and its vocal-tract length (formants), apart.

A shorter vocal tract (a child's, about 0.8 of a man's) scales every formant frequency up by
about the ratio of lengths; a higher voice raises F0 and all its harmonics. :func:`change_voice`
does both, each by its own factor, at the same duration, so one function serves the ``voices``
corpus shape (children-like test voices) and pitch perturbation in training
(:mod:`fastasr.data.augment`). The method, in two steps:

1. **Every frequency × p** (``p = 2^(semitones/12)``) at the same duration
   (:func:`scale_frequencies`): a phase-vocoder time stretch by ``p``
   (``torchaudio.functional.phase_vocoder`` on a 64 ms Hann STFT, hop 1/4: long enough to
   resolve the harmonics of a low male voice), then windowed-sinc resampling by ``1/p``
   (``torchaudio``'s, ``p`` as the nearest fraction with denominator ≤ 100, as speed
   perturbation takes its factors). This is ``torchaudio.functional.pitch_shift``'s method;
   that function is not called because it resamples between ``int(rate · p)`` and ``rate`` Hz,
   two rates whose ratio rarely reduces, which makes a kernel of thousands of phases. F0 and
   formants are now both × p.
2. **The spectral envelope moved to × α** (``α`` = ``formant_scale``): on a 32 ms STFT of the
   source and of step 1's output (the same length, so frame for frame), each frame's envelope
   is the cepstrally smoothed log magnitude (quefrencies below 1.6 ms: below the period of a
   625 Hz voice, so the harmonics are smoothed out). Step 1's frames are multiplied by
   ``E_source(f / α) / E_shifted(f)`` (the gain bounded to ±30 dB), which puts the source's
   formants at × α and keeps step 1's harmonics at × p. This is the cepstral envelope
   correction that formant-preserving pitch shifters use (α = 1: pitch alone).

The result has the source's length and RMS level (scaled down whole if its peak would pass
0.99). It is deterministic: no random draw, the same floating-point operations for the same
input. Its phase-vocoder character (a slight phasiness) is shared by the shape's test audio
and by pitch-perturbed training audio, which the measurement plan in
docs/results/robustness/RESULTS.md allows for.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch
import torchaudio.functional as AF

from fastasr.data.audio import resample

VOICE_VERSION = 1  # bump when change_voice's output changes (feature caches of pitch-shifted copies key on it)
VOCODER_MS = 64.0  # phase-vocoder window: resolves harmonics 62.5 Hz apart
ENVELOPE_MS = 32.0  # envelope window (the filterbank's scale of detail)
LIFTER_MS = 1.6  # cepstral cutoff of the envelope: below a 625 Hz voice's period
MAX_GAIN_DB = 30.0  # bound on the envelope correction per bin
PEAK = 0.99  # an output whose peak passes this is scaled down whole
_MAX_DENOMINATOR = 100


def _n_fft(sample_rate: int, ms: float) -> int:
    """The power of two nearest to ``ms`` milliseconds at ``sample_rate`` (≥ 64)."""
    return 1 << max(6, round(math.log2(ms / 1000 * sample_rate)))


def _fit(wav: torch.Tensor, length: int) -> torch.Tensor:
    if wav.numel() >= length:
        return wav[:length]
    return torch.nn.functional.pad(wav, (0, length - wav.numel()))


def scale_frequencies(wav: torch.Tensor, sample_rate: int, ratio: float) -> torch.Tensor:
    """``wav (T,)`` with every frequency × ``ratio`` (F0 and formants alike), ``(T,)`` samples:
    a phase-vocoder stretch by ``ratio``, then resampling by ``1 / ratio`` (step 1 of the
    module docstring). ``ratio`` is used as the nearest fraction p/q with q ≤ 100."""
    if not ratio > 0:
        raise ValueError(f"scale_frequencies: ratio {ratio}; expected > 0")
    frac = Fraction(ratio).limit_denominator(_MAX_DENOMINATOR)
    if frac == 1:
        return wav
    n_fft = _n_fft(sample_rate, VOCODER_MS)
    hop = n_fft // 4
    window = torch.hann_window(n_fft, dtype=wav.dtype)
    length = wav.numel()
    padded = _fit(wav, max(length, n_fft))  # the STFT needs one window's samples
    spec = torch.stft(padded, n_fft, hop, window=window, return_complex=True)
    advance = torch.linspace(0, math.pi * hop, spec.shape[-2], dtype=wav.dtype)[..., None]
    stretched = AF.phase_vocoder(spec, float(frac.denominator / frac.numerator), advance)
    longer = torch.istft(stretched, n_fft, hop, window=window,
                         length=round(padded.numel() * frac.numerator / frac.denominator))
    return _fit(resample(longer, frac.numerator, frac.denominator), length)


def _log_envelope(magnitude: torch.Tensor, lifter: int) -> torch.Tensor:
    """Cepstrally smoothed log magnitude: ``(bins, frames)`` → the same, quefrencies < ``lifter`` kept."""
    cepstrum = torch.fft.irfft(torch.log(magnitude.clamp_min(1e-7)), dim=0)
    cepstrum[lifter:cepstrum.shape[0] - lifter + 1] = 0
    return torch.fft.rfft(cepstrum, dim=0).real


def _warp(envelope: torch.Tensor, factor: float) -> torch.Tensor:
    """``envelope(f / factor)`` by linear interpolation over the bins (held at the last bin)."""
    bins = envelope.shape[0]
    pos = (torch.arange(bins, dtype=torch.float64) / factor).clamp(0, bins - 1)
    lo = pos.floor().long()
    hi = (lo + 1).clamp(max=bins - 1)
    w = (pos - lo).to(envelope.dtype)[:, None]
    return envelope[lo] * (1 - w) + envelope[hi] * w


def change_voice(wav: torch.Tensor, sample_rate: int, semitones: float = 0.0,
                 formant_scale: float = 1.0) -> torch.Tensor:
    """``wav (T,)`` float with F0 raised by ``semitones`` (negative: lowered) and the formants
    scaled by ``formant_scale`` (> 1: a shorter vocal tract), ``(T,)`` float32 at the same
    RMS (peak ≤ 0.99). The method: the module docstring."""
    if not math.isfinite(semitones):
        raise ValueError(f"change_voice: semitones {semitones}; expected a finite number")
    if not (math.isfinite(formant_scale) and formant_scale > 0):
        raise ValueError(f"change_voice: formant_scale {formant_scale}; expected > 0")
    wav = wav.reshape(-1).to(torch.float32)
    if semitones == 0 and formant_scale == 1:
        return wav
    pitch = 2.0 ** (semitones / 12.0)
    shifted = scale_frequencies(wav, sample_rate, pitch)
    n_fft = _n_fft(sample_rate, ENVELOPE_MS)
    hop = n_fft // 4
    window = torch.hann_window(n_fft)
    length = wav.numel()
    source = torch.stft(_fit(wav, max(length, n_fft)), n_fft, hop, window=window, return_complex=True)
    moved = torch.stft(_fit(shifted, max(length, n_fft)), n_fft, hop, window=window, return_complex=True)
    lifter = max(4, round(LIFTER_MS / 1000 * sample_rate))
    bound = MAX_GAIN_DB / 20 * math.log(10)
    log_gain = _warp(_log_envelope(source.abs(), lifter), formant_scale) - _log_envelope(moved.abs(), lifter)
    out = torch.istft(moved * log_gain.clamp(-bound, bound).exp(), n_fft, hop, window=window,
                      length=max(length, n_fft))[:length]
    level, have = wav.pow(2).mean().sqrt(), out.pow(2).mean().sqrt()
    if have > 0:
        out = out * (level / have)
    peak = float(out.abs().max()) if out.numel() else 0.0
    return out * (PEAK / peak) if peak > PEAK else out
