"""Training-only augmentation: speed perturbation, additive noise, VTLP and pitch perturbation.

* **Speed perturbation** (Ko et al. 2015; Kaldi's and lhotse's 3-way 0.9/1.0/1.1):
  the waveform is resampled by ``1 / factor`` (``torchaudio``'s windowed-sinc
  resampling) and read at the original rate, so its duration becomes
  ``duration / factor`` and every frequency is multiplied by ``factor`` (tempo
  and pitch change together). The factor is chosen uniformly per utterance and
  epoch from ``speed_factors``.
* **Noise mixing**: with probability ``noise_prob`` a random segment of a random
  file from a noise set (a manifest or a directory of audio files) is scaled so
  that the signal-to-noise ratio, over the whole utterance, is an SNR drawn
  uniformly from ``noise_snr_db``, and added. Short noise files are looped.
* **VTLP** (vocal-tract length perturbation, Jaitly & Hinton 2013): the filterbank's frequency
  axis is warped by a factor chosen uniformly per utterance and epoch from ``vtlp_factors``
  (``torchaudio.compliance.kaldi.fbank``'s ``vtln_warp``: Kaldi's piecewise-linear warp, the
  bins between 100 Hz and Nyquist − 500 Hz moved to ``f / factor``), so a factor > 1 moves
  the energy up the mel axis as a shorter vocal tract would. A feature-side change: the
  waveform and the frame count stay.
* **Pitch perturbation**: F0 moved by a number of semitones chosen uniformly per utterance and
  epoch from ``pitch_semitones``, the formants kept (:func:`fastasr.data.voice.change_voice`),
  the duration kept.

An utterance's perturbations in an epoch are a :class:`Variant` (speed, VTLP factor, semitones),
each drawn on its own. The factors are few and fixed so that a feature cache can hold one copy
of the training set per variant (``fastasr.data.feature_cache``), as lhotse and icefall cache
speed perturbation: the costly pitch shift is computed once per copy, not once per epoch.

Every random draw is a function of ``(seed, epoch, utterance id)`` only — not of
the DataLoader worker, the batch order or the process — so a run is
reproducible for a seed and a resumed run sees the augmentation it would have
seen. The epoch lives in a shared-memory tensor: ``set_epoch`` in the main
process reaches persistent worker processes (``EpochListeners`` connects it to
Lightning's per-epoch ``set_epoch`` call).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import product
from pathlib import Path
from typing import NamedTuple

import soundfile as sf
import torch

from fastasr.data.audio import resample
from fastasr.data.voice import change_voice
from fastasr.sections import dataclass_from_mapping

log = logging.getLogger(__name__)

_MAX_DENOMINATOR = 100  # speed factors are used as the fraction p/q closest to them (0.9 = 9/10)
VTLP_RANGE = (0.7, 1.4)  # a sanity bound: VTLP draws from 0.9-1.1, a child's formants are about 1.15-1.25 an adult's
MAX_SEMITONES = 12.0


class Variant(NamedTuple):
    """One perturbed version of an utterance: what a feature-cache copy holds."""

    speed: float = 1.0  # speed perturbation factor (waveform resampled, length / speed)
    warp: float = 1.0  # VTLP factor of the filterbank (1.0: Kaldi's plain filterbank)
    semitones: float = 0.0  # pitch perturbation, formants kept (0: none)

    @classmethod
    def of(cls, variant: Variant | float) -> Variant:
        """A ``Variant``; a bare number is a speed factor (the callers from before VTLP)."""
        return variant if isinstance(variant, Variant) else cls(speed=float(variant))

    def describe(self) -> str:
        """``speed 0.9, VTLP 1.1, pitch +2 semitones``; the identity parts left out ("" for none)."""
        parts = [f"speed {self.speed:g}"] if self.speed != 1.0 else []
        parts += [f"VTLP {self.warp:g}"] if self.warp != 1.0 else []
        parts += [f"pitch {self.semitones:+g} semitones"] if self.semitones != 0.0 else []
        return ", ".join(parts)


@dataclass(frozen=True)
class AugmentConfig:
    """``data.augment`` (``conf/data/*.yaml``); everything off by default."""

    speed_perturb: bool = False  # resample each training utterance by a factor from speed_factors
    speed_factors: tuple[float, ...] = (0.9, 1.0, 1.1)  # chosen uniformly per utterance and epoch
    noise: str | None = None  # noise manifest (.jsonl with audio_filepath), audio file or directory of them
    noise_prob: float = 0.5  # probability that an utterance gets noise
    noise_snr_db: tuple[float, float] = (10.0, 20.0)  # SNR range (dB), drawn uniformly
    vtlp: bool = False  # warp each training utterance's filterbank by a factor from vtlp_factors
    vtlp_factors: tuple[float, ...] = (0.9, 1.0, 1.1)  # chosen uniformly per utterance and epoch
    pitch_shift: bool = False  # move each training utterance's F0 by semitones from pitch_semitones
    pitch_semitones: tuple[float, ...] = (-2.0, 0.0, 2.0)  # chosen uniformly per utterance and epoch

    def __post_init__(self) -> None:
        factors = tuple(float(f) for f in self.speed_factors)
        if not factors or any(not math.isfinite(f) or f <= 0 for f in factors):
            raise ValueError(f"data.augment.speed_factors {list(self.speed_factors)}; expected factors > 0")
        warps = tuple(float(f) for f in self.vtlp_factors)
        lo, hi = VTLP_RANGE
        if not warps or any(not lo <= f <= hi for f in warps):
            raise ValueError(f"data.augment.vtlp_factors {list(self.vtlp_factors)}; expected factors within "
                             f"[{lo}, {hi}]")
        steps = tuple(float(s) for s in self.pitch_semitones)
        if not steps or any(not abs(s) <= MAX_SEMITONES for s in steps):
            raise ValueError(f"data.augment.pitch_semitones {list(self.pitch_semitones)}; expected semitones "
                             f"within [-{MAX_SEMITONES:g}, {MAX_SEMITONES:g}]")
        object.__setattr__(self, "vtlp_factors", warps)
        object.__setattr__(self, "pitch_semitones", steps)
        snr = tuple(float(s) for s in self.noise_snr_db)
        if len(snr) != 2 or not snr[0] <= snr[1]:
            raise ValueError(f"data.augment.noise_snr_db {list(self.noise_snr_db)}; expected [low, high] with low ≤ high")
        if not 0.0 <= self.noise_prob <= 1.0:
            raise ValueError(f"data.augment.noise_prob {self.noise_prob}; expected within [0, 1]")
        object.__setattr__(self, "speed_factors", factors)
        object.__setattr__(self, "noise_snr_db", snr)

    @classmethod
    def from_dict(cls, cfg: Mapping | AugmentConfig | None) -> AugmentConfig:
        """Build from a mapping (or DictConfig); unknown keys raise ``ValueError``."""
        return dataclass_from_mapping(cls, cfg, "data.augment")

    @property
    def enabled(self) -> bool:
        return self.speed_perturb or self.noise is not None or self.vtlp or self.pitch_shift

    @property
    def factors(self) -> tuple[float, ...]:
        """The speed factors in use: ``speed_factors`` when perturbing, else ``(1.0,)``."""
        return self.speed_factors if self.speed_perturb else (1.0,)

    @property
    def warps(self) -> tuple[float, ...]:
        """The VTLP factors in use: ``vtlp_factors`` when warping, else ``(1.0,)``."""
        return self.vtlp_factors if self.vtlp else (1.0,)

    @property
    def semitones(self) -> tuple[float, ...]:
        """The pitch shifts in use: ``pitch_semitones`` when shifting, else ``(0.0,)``."""
        return self.pitch_semitones if self.pitch_shift else (0.0,)

    @property
    def variants(self) -> tuple[Variant, ...]:
        """Every variant an utterance can take: speed × VTLP × pitch factors in use (one
        feature-cache copy each; ``(Variant(),)`` without them)."""
        return tuple(Variant(*v) for v in product(self.factors, self.warps, self.semitones))

    @property
    def needs_audio(self) -> bool:
        """True when features must come from the augmented waveform at load time (noise
        mixing is random per epoch; speed perturbation alone can be cached per factor)."""
        return self.noise is not None


# ------------------------------------------------------------------ waveform operations


def _as_fraction(factor: float) -> Fraction:
    return Fraction(factor).limit_denominator(_MAX_DENOMINATOR)


def perturbed_num_samples(num_samples: int, factor: float) -> int:
    """Samples after ``speed_perturb(wav, factor)`` of a ``num_samples`` waveform
    (``ceil(num_samples / factor)``, as torchaudio's resampling rounds)."""
    if factor == 1.0:
        return int(num_samples)
    frac = _as_fraction(factor)
    return math.ceil(num_samples * frac.denominator / frac.numerator)


def speed_perturb(wav: torch.Tensor, factor: float) -> torch.Tensor:
    """Speed-perturb a waveform ``(T,)``: ``(ceil(T / factor),)`` samples at the same rate,
    every frequency × ``factor``. The factor is used as the nearest fraction p/q with
    q ≤ 100 (0.9 = 9/10), so the resampling kernel stays small."""
    if factor == 1.0:
        return wav
    frac = _as_fraction(factor)
    return resample(wav, frac.numerator, frac.denominator)


def perturb(wav: torch.Tensor, variant: Variant | float, sample_rate: int) -> torch.Tensor:
    """A variant's waveform: speed-perturbed, then pitch-shifted (formants kept). The VTLP
    factor is the filterbank's (``Fbank(wav, warp=variant.warp)``), not applied here."""
    variant = Variant.of(variant)
    wav = speed_perturb(wav, variant.speed)
    if variant.semitones != 0.0:
        wav = change_voice(wav, sample_rate, variant.semitones)
    return wav


def mix_at_snr(speech: torch.Tensor, noise: torch.Tensor, snr_db: float) -> torch.Tensor:
    """``speech + g · noise`` with ``g`` chosen so that ``10 log10(P_speech / P_(g·noise)) = snr_db``,
    powers being mean squares over the whole waveform. ``speech``, ``noise``: ``(T,)``.
    Silent speech or silent noise: ``speech`` unchanged. The sum is not clipped."""
    if noise.shape != speech.shape:
        raise ValueError(f"mix_at_snr: noise {tuple(noise.shape)} and speech {tuple(speech.shape)}; expected equal shapes")
    p_speech = speech.double().pow(2).mean()
    p_noise = noise.double().pow(2).mean()
    if p_speech == 0 or p_noise == 0:
        return speech
    gain = torch.sqrt(p_speech / (p_noise * 10.0 ** (snr_db / 10.0)))
    return speech + (gain * noise.double()).to(speech.dtype)


# ------------------------------------------------------------------ noise sets

AUDIO_SUFFIXES = {"." + ext.lower() for ext in sf.available_formats()} | {".sph", ".mp3", ".ogg", ".opus"}


def noise_files(source: str | Path) -> list[Path]:
    """Noise audio files named by ``source``: a directory (searched recursively for files
    soundfile can read), one audio file, or a JSON-lines manifest whose lines have
    ``audio_filepath`` (absolute or relative to the manifest; other fields ignored). A bad
    manifest line is reported with its line number and skipped; no file at all raises
    ``ValueError``."""
    source = Path(source)
    if source.is_file() and source.suffix.lower() in AUDIO_SUFFIXES:
        return [source]
    if source.is_dir():
        found = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES)
        if not found:
            raise ValueError(f"data.augment.noise {source}: no audio file ({', '.join(sorted(AUDIO_SUFFIXES))}) "
                             "in this directory; expected a directory of noise recordings or a noise manifest")
        return found
    if not source.is_file():
        raise ValueError(f"data.augment.noise {source}: no such file or directory; "
                         "expected a noise manifest (.jsonl) or a directory of audio files")
    try:
        lines = source.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise ValueError(f"data.augment.noise {source}: neither UTF-8 JSON lines nor an audio file "
                         f"({', '.join(sorted(AUDIO_SUFFIXES))}); expected a noise manifest, "
                         "an audio file or a directory of audio files") from None
    found, bad = [], 0
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            rel = json.loads(raw)["audio_filepath"]
            path = Path(rel) if os.path.isabs(rel) else source.parent / rel
            if not path.is_file():
                raise ValueError(f"audio_filepath {rel!r}: no such file {str(path)!r}")
        except (ValueError, KeyError, TypeError) as e:
            bad += 1
            log.warning("noise manifest %s line %d: %s; expected a JSON object with an existing audio_filepath "
                        "(skipped)", source, lineno, e if not isinstance(e, KeyError) else "missing field 'audio_filepath'")
            continue
        found.append(path)
    if not found:
        raise ValueError(f"noise manifest {source}: no usable line ({bad} bad); expected lines with audio_filepath")
    return found


class NoiseBank:
    """Random noise segments at ``sample_rate`` from a noise set (see :func:`noise_files`).

    Files are opened at draw time and only the needed part is read (soundfile seeks), so
    a large noise set costs no memory. Unreadable or empty files are reported and skipped.
    """

    def __init__(self, source: str | Path, sample_rate: int) -> None:
        self.sample_rate = int(sample_rate)
        self.files: list[tuple[str, int, int]] = []  # (path, frames, rate)
        for path in noise_files(source):
            try:
                info = sf.info(str(path))
            except Exception as e:  # soundfile raises LibsndfileError / RuntimeError
                log.warning("noise file %s: not readable audio (%s); skipped", path, str(e).strip())
                continue
            if info.frames <= 0:
                log.warning("noise file %s: 0 samples; skipped", path)
                continue
            self.files.append((str(path), int(info.frames), int(info.samplerate)))
        if not self.files:
            raise ValueError(f"data.augment.noise {source}: no readable noise file")
        log.info("noise set %s: %d files, %.1f s", source, len(self.files),
                 sum(n / r for _, n, r in self.files))

    def segment(self, num_samples: int, generator: torch.Generator) -> torch.Tensor:
        """A ``(num_samples,)`` float32 noise segment: a random file, a random start, looped
        when the file is shorter, resampled to ``sample_rate``."""
        path, frames, rate = self.files[int(torch.randint(len(self.files), (1,), generator=generator))]
        need = math.ceil(num_samples * rate / self.sample_rate) + 1
        start = int(torch.randint(max(frames - need, 0) + 1, (1,), generator=generator))
        data, _ = sf.read(path, start=start, frames=min(need, frames), dtype="float32", always_2d=True)
        noise = torch.from_numpy(data.mean(axis=1))
        if noise.numel() < need:
            noise = noise.repeat(math.ceil(need / noise.numel()))
        # `need` has one source sample to spare, so the resampled noise has ≥ num_samples samples
        return resample(noise, rate, self.sample_rate)[:num_samples].contiguous()


# ------------------------------------------------------------------ per-utterance augmentation


def draw_seed(*parts: object) -> int:
    """A 63-bit seed from any printable parts (stable across processes and runs)."""
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class WaveformAugment:
    """Applies ``AugmentConfig`` to training waveforms; draws depend on ``(seed, epoch, id)``.

    Args:
        config: an ``AugmentConfig`` or mapping.
        sample_rate: Hz of the waveforms it gets (noise is resampled to it).
        seed: base seed (the data module's).
    """

    def __init__(self, config: AugmentConfig | Mapping, sample_rate: int, seed: int = 0) -> None:
        self.config = AugmentConfig.from_dict(config)
        self.sample_rate = int(sample_rate)
        self.seed = int(seed)
        self._epoch = torch.zeros((), dtype=torch.long).share_memory_()  # seen by worker processes
        self.noise = NoiseBank(self.config.noise, sample_rate) if self.config.noise is not None else None

    @property
    def epoch(self) -> int:
        return int(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose draws to produce (call in the main process; workers see it)."""
        self._epoch.fill_(int(epoch))

    def generator(self, utterance_id: str, stream: str) -> torch.Generator:
        """The generator of one utterance's draws in this epoch; ``stream`` separates uses."""
        return torch.Generator().manual_seed(draw_seed(self.seed, self.epoch, stream, utterance_id))

    def _pick(self, choices: tuple[float, ...], utterance_id: str, stream: str) -> float:
        if len(choices) == 1:
            return choices[0]
        return choices[int(torch.randint(len(choices), (1,), generator=self.generator(utterance_id, stream)))]

    def speed_factor(self, utterance_id: str) -> float:
        """This epoch's speed factor for an utterance (1.0 when speed perturbation is off)."""
        return self._pick(self.config.factors, utterance_id, "speed")

    def vtlp_factor(self, utterance_id: str) -> float:
        """This epoch's VTLP factor for an utterance (1.0 when VTLP is off)."""
        return self._pick(self.config.warps, utterance_id, "vtlp")

    def pitch_semitones(self, utterance_id: str) -> float:
        """This epoch's pitch shift for an utterance (0.0 when pitch perturbation is off)."""
        return self._pick(self.config.semitones, utterance_id, "pitch")

    def variant(self, utterance_id: str) -> Variant:
        """This epoch's variant of an utterance: its speed, VTLP and pitch draws (each its own stream)."""
        return Variant(self.speed_factor(utterance_id), self.vtlp_factor(utterance_id),
                       self.pitch_semitones(utterance_id))

    def add_noise(self, wav: torch.Tensor, utterance_id: str) -> torch.Tensor:
        """Noise at a drawn SNR with probability ``noise_prob`` (unchanged otherwise)."""
        if self.noise is None:
            return wav
        gen = self.generator(utterance_id, "noise")
        if float(torch.rand((), generator=gen)) >= self.config.noise_prob:
            return wav
        lo, hi = self.config.noise_snr_db
        snr = lo + (hi - lo) * float(torch.rand((), generator=gen))
        return mix_at_snr(wav, self.noise.segment(wav.numel(), gen), snr)

    def __call__(self, wav: torch.Tensor, utterance_id: str) -> torch.Tensor:
        """``wav (T,)`` at ``sample_rate`` → augmented ``(T',)``, ``T' = ceil(T / factor)``:
        speed, pitch, then noise. This epoch's VTLP factor (:meth:`vtlp_factor`) is for the
        filterbank to apply."""
        variant = Variant(self.speed_factor(utterance_id), 1.0, self.pitch_semitones(utterance_id))
        return self.add_noise(perturb(wav, variant, self.sample_rate), utterance_id)


class EpochListeners:
    """Forwards Lightning's per-epoch ``set_epoch(epoch)`` to several objects.

    Lightning calls ``set_epoch`` on ``dataloader.batch_sampler.sampler``; setting that
    attribute to ``EpochListeners(old_sampler_attr, dataset)`` lets the dataset's
    augmentation follow the epoch as the batch order does.
    """

    def __init__(self, *targets: object) -> None:
        self.targets: Sequence[object] = targets

    def set_epoch(self, epoch: int) -> None:
        for target in self.targets:
            target.set_epoch(epoch)
