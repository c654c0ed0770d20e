"""Where a dataset's features come from: the audio at load time, or the feature cache.

``ASRDataset`` calls ``source(utterance, train)``; the DataModule picks a source per
split with :func:`feature_source`:

* no cache (``data.cache.mode=off``, or ``auto`` and none built) → ``AudioFeatures``:
  load the audio, augment it (training only), compute the filterbank (dither in training);
* a matching cache (found, or built in ``build`` mode) → ``CachedFeatures``: read the
  features; in training, add dither in the power domain (``ReadTimeDither``);
* training with noise mixing → ``AudioFeatures`` whatever the cache mode (noise is drawn
  anew every epoch and needs the waveform); the log says so;
* training with speed perturbation, VTLP and/or pitch perturbation (no noise) →
  ``CachedFeatures`` over one cache per variant (speed × VTLP × pitch factors; lhotse/icefall's
  per-factor copies): this epoch's variant of the utterance picks the cache.

Every source also answers ``frame_range(duration)``: the frames of the shortest and
the longest version an utterance can take (speed perturbation changes its length; VTLP and
pitch perturbation keep it), so
batches are priced at the longest (the frame budget holds) and the CTC length filter
uses the shortest.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch

from fastasr.data.audio import BadAudioError
from fastasr.data.augment import Variant, WaveformAugment, perturbed_num_samples
from fastasr.data.feature_cache import CacheConfig, FeatureCache, open_feature_caches
from fastasr.data.features import INT16_SCALE, Fbank, FeatureConfig, load_utterance_audio
from fastasr.data.manifest import Utterance

log = logging.getLogger(__name__)


class FeatureSource:
    """Base: ``source(utt, train) -> (frames, bins) float32``; training-only augmentation."""

    def __init__(self, config: FeatureConfig, augment: WaveformAugment | None = None) -> None:
        self.config = config
        self.augment = augment

    @property
    def factors(self) -> tuple[float, ...]:
        return self.augment.config.factors if self.augment is not None else (1.0,)

    def frame_range(self, duration: float) -> tuple[int, int]:
        """(fewest, most) frames of an utterance of ``duration`` s over the speed factors."""
        samples = int(round(duration * self.config.sample_rate))
        frames = [self.config.num_frames(perturbed_num_samples(samples, f)) for f in self.factors]
        return min(frames), max(frames)

    @property
    def variants(self) -> tuple[Variant, ...]:
        return self.augment.config.variants if self.augment is not None else (Variant(),)

    def speed_factor(self, utt: Utterance) -> float:
        return self.augment.speed_factor(utt.id) if self.augment is not None else 1.0

    def variant(self, utt: Utterance) -> Variant:
        """This epoch's variant of a training utterance (``Variant()`` without augmentation)."""
        return self.augment.variant(utt.id) if self.augment is not None else Variant()

    def set_epoch(self, epoch: int) -> None:
        """Forward the epoch to the augmentation's draws (no-op without augmentation)."""
        if self.augment is not None:
            self.augment.set_epoch(epoch)

    def __call__(self, utt: Utterance, train: bool = False) -> torch.Tensor:
        """``(frames, bins)`` float32. Raises ``fastasr.data.audio.BadAudioError`` for an
        utterance whose audio is unusable (the dataset skips and reports it)."""
        raise NotImplementedError


class AudioFeatures(FeatureSource):
    """Features computed from the audio at load time: load → augment (train) → ``Fbank``
    (warped by this epoch's VTLP factor in training)."""

    def __init__(self, fbank: Fbank, augment: WaveformAugment | None = None) -> None:
        super().__init__(fbank.config, augment)
        self.fbank = fbank

    def __call__(self, utt: Utterance, train: bool = False) -> torch.Tensor:
        """``(frames, bins)`` float32; with ``train``: augmented and dithered. Unusable audio
        (``load_utterance_audio``'s checks) raises ``BadAudioError``."""
        wav = load_utterance_audio(utt, self.config)
        if train and self.augment is not None:
            return self.fbank(self.augment(wav, utt.id), train=True, warp=self.augment.vtlp_factor(utt.id))
        return self.fbank(wav, train=train)


class ReadTimeDither:
    """Kaldi's dither for dither-free (cached) log-mel features, added in the power domain.

    Dither adds Gaussian noise of standard deviation ``config.dither`` (int16 units) to the
    samples. Its filterbank energy is precomputed once per process on ``table_frames``
    frames of such noise; at read time each frame gets a random row ``n`` of that table:
    ``log(exp(x) + exp(n))``. The expected energy per bin is exact; what is left out is
    the signal × noise cross term, which is zero on average. It matters where dither
    matters: digital silence, whose cached value is log(ε) ≈ -15.9 and becomes the
    dither floor, as with on-the-fly dither.
    """

    def __init__(self, config: FeatureConfig, table_frames: int = 2000, seed: int = 0) -> None:
        self.config = config
        self.table_frames = int(table_frames)
        self.seed = int(seed)
        self._table: torch.Tensor | None = None

    def table(self) -> torch.Tensor:
        """``(table_frames, bins)`` log-mel energies of dither noise alone."""
        if self._table is None:
            c = self.config
            samples = c.window_samples + (self.table_frames - 1) * c.shift_samples
            gen = torch.Generator().manual_seed(self.seed)
            noise = torch.randn(samples, generator=gen) * (c.dither / INT16_SCALE)
            self._table = Fbank(replace(c, dither=0.0))(noise)
        return self._table

    def __call__(self, feats: torch.Tensor) -> torch.Tensor:
        """``feats (frames, bins)`` log-mel without dither → with dither, same shape."""
        table = self.table()
        rows = torch.randint(table.shape[0], (feats.shape[0],))  # global RNG, as kaldi.fbank's dither
        return torch.logaddexp(feats, table[rows])


class CachedFeatures(FeatureSource):
    """Features read from feature caches, one per variant (``{Variant(): cache}`` without
    augmentation; a number as a key is a speed factor); ``ReadTimeDither`` in training when
    ``config.dither > 0``."""

    def __init__(self, caches: Mapping[Variant | float, FeatureCache], config: FeatureConfig,
                 augment: WaveformAugment | None = None) -> None:
        super().__init__(config, augment)
        caches = {Variant.of(v): c for v, c in caches.items()}
        missing = [v for v in self.variants if v not in caches]
        if missing:
            raise ValueError(f"CachedFeatures: no cache for {', '.join(v.describe() or 'the plain features' for v in missing)}")
        self.caches = caches
        self.dither = ReadTimeDither(config) if config.dither > 0 else None

    def __call__(self, utt: Utterance, train: bool = False) -> torch.Tensor:
        """``(frames, bins)`` float32 from the cache of this epoch's variant (train) or the plain one.

        An utterance the cache builder skipped for unusable audio raises ``BadAudioError``
        with the builder's reason, as its audio would on the fly (the dataset skips and
        reports it); any other missing utterance is a ``FeatureCacheError``."""
        cache = self.caches[self.variant(utt) if train else Variant()]
        if utt.id in cache.skipped:
            raise BadAudioError(utt.audio_filepath, f"{cache.skipped[utt.id]} (found when the feature cache "
                                                    f"{cache.directory.name} was built)")
        feats = cache[utt.id]
        if train and self.dither is not None:
            feats = self.dither(feats)
        return feats


def feature_source(split: str, manifest_path: str | Path | None, utterances: list[Utterance],
                   config: FeatureConfig, cache: CacheConfig | Mapping | None = None,
                   augment: WaveformAugment | None = None, num_workers: int = 0) -> FeatureSource:
    """The feature source of one split (rules in the module docstring).

    Args:
        split: name for the log (``train``, ``dev``, a manifest name).
        manifest_path: the split's manifest (names the cache); None: no cache.
        utterances: all utterances read from the manifest — the cache covers the manifest,
            not a filtered subset, so that training and ``make features`` share it.
        config: feature settings.
        cache: ``data.cache``.
        augment: the training augmentation (None for dev/test and when off).
        num_workers: processes for building a cache.
    """
    cache = CacheConfig.from_dict(cache)
    fbank = Fbank(config)
    if not cache.enabled or manifest_path is None:
        return AudioFeatures(fbank, augment)
    if augment is not None and augment.config.needs_audio:
        log.info("%s: data.augment.noise mixes noise into the audio, so %s features are computed on the fly "
                 "(the feature cache serves the other splits)", split, split)
        return AudioFeatures(fbank, augment)
    variants = augment.config.variants if augment is not None else (Variant(),)
    if len(variants) > 1 and (augment.config.vtlp or augment.config.pitch_shift):
        log.info("%s: %d feature copies, one per variant (speed %s × VTLP %s × pitch %s semitones)", split,
                 len(variants), *("/".join(f"{x:g}" for x in axis) for axis in
                                  (augment.config.factors, augment.config.warps, augment.config.semitones)))
    caches = open_feature_caches(utterances, manifest_path, config, cache, variants, num_workers)
    if caches is None:
        return AudioFeatures(fbank, augment)
    return CachedFeatures(caches, config, augment)
