"""Feature cache: filterbanks computed once into sharded NumPy arrays with an index.

A cache holds the features of one manifest for one feature setting (and one training
variant: speed factor, VTLP factor, pitch shift; ``fastasr.data.augment.Variant``) in a
directory under ``data.cache.dir``::

    <corpus>_<manifest stem>[_sp<factor>][_vtlp<factor>][_ps<±semitones>]-<key[:16]>/
        index.json        key, feature settings, per utterance [shard, first frame, frames]
        shard-00000.npy   (frames, bins) float32 (or float16): utterances one after another
        ...

**Key.** ``cache_key`` hashes the feature settings (sample rate, bins, frame length
and shift; dither is excluded, features are cached without it), the variant (the
speed factor; the VTLP factor and the pitch shift with the voice method's version where
they are not the identity, so the keys of plain and speed-perturbed caches are what they
were before VTLP), the storage dtype, and every utterance's id, resolved audio path, file size and
modification time. The key is part of the directory name and is checked against
``index.json`` on opening, so a cache built with other settings, from another
manifest or from audio that has changed since is never used: it is simply not
found (``auto``: features are computed on the fly; ``build``: a new cache is
built) and the log names the caches of the same manifest that exist but no
longer match (delete them to free the disk). An ``index.json`` whose key does not
match its directory (e.g. copied by hand) raises ``FeatureCacheError``.

**Writes are atomic.** A cache is written into a private temporary directory
and renamed into place when complete, so a killed build leaves no half cache
and two processes building the same cache at once (DDP ranks, parallel jobs)
both succeed: the first rename wins, the other copy is discarded.

**Copies of one waveform are built together.** The VTLP copies of one speed factor and pitch
shift share their waveform: :func:`open_feature_caches` builds the missing ones in one pass
(:func:`build_feature_caches`), each utterance decoded and perturbed once and the filterbank run
once per VTLP factor, so 27 copies (3 speeds × 3 warps × 3 pitches) cost 9 pitch shifts.

**Reading** memory-maps the shards (opened lazily in each DataLoader worker) and
copies one utterance out per lookup: no audio decoding, no resampling, no FFT.

``fastasr-features`` (:mod:`fastasr.cli.features`, ``make features``) builds the caches of a
training config's train/dev/test manifests, with the overrides ``train.py`` takes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from fastasr.data.audio import BadAudioError
from fastasr.data.augment import Variant, perturb
from fastasr.data.features import Fbank, FeatureConfig, load_utterance_audio
from fastasr.data.manifest import Utterance
from fastasr.data.voice import VOICE_VERSION
from fastasr.sections import dataclass_from_mapping

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
INDEX_NAME = "index.json"
FRAMES_PER_SHARD = 500_000  # ~1.4 h of audio at 10 ms: 80 MB of 40-d float32
DTYPES = ("float32", "float16")
MODES = ("off", "auto", "build")


class FeatureCacheError(RuntimeError):
    """A cache cannot be used (mismatched or damaged index, missing shard, missing utterance)."""


@dataclass(frozen=True)
class CacheConfig:
    """``data.cache`` (``conf/data/*.yaml``)."""

    dir: str | None = None  # root directory; one subdirectory per manifest × features × variant
    mode: str = "off"  # off: never; auto: use a matching cache when present; build: build it when missing
    dtype: str = "float32"  # stored precision: float32 (exact) or float16 (half the disk)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"data.cache.mode {self.mode!r}; expected one of {', '.join(MODES)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"data.cache.dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        if self.mode != "off" and not self.dir:
            raise ValueError(f"data.cache.mode {self.mode!r} needs data.cache.dir; got {self.dir!r}")

    @classmethod
    def from_dict(cls, cfg: Mapping | CacheConfig | None) -> CacheConfig:
        """Build from a mapping (or DictConfig); unknown keys raise ``ValueError``."""
        return dataclass_from_mapping(cls, cfg, "data.cache")

    @property
    def enabled(self) -> bool:
        return self.mode != "off"


# ------------------------------------------------------------------ keys and names


def _settings(config: FeatureConfig, variant: Variant | float, dtype: str) -> dict:
    variant = Variant.of(variant)
    features = config.key()  # cached features are computed without dither
    settings = {"version": FORMAT_VERSION, "features": features, "speed": float(variant.speed), "dtype": dtype}
    if variant.warp != 1.0:  # only where used: the keys of plain and speed-only caches stay as they were
        settings["vtlp"] = float(variant.warp)
    if variant.semitones != 0.0:
        settings["pitch_semitones"] = float(variant.semitones)
        settings["voice_version"] = VOICE_VERSION
    return settings


def cache_key(utterances: Sequence[Utterance], config: FeatureConfig, variant: Variant | float = 1.0,
              dtype: str = "float32") -> str:
    """SHA-256 (hex) of the feature settings (dither excluded), variant (a number: a speed
    factor), dtype and, for every utterance (order-independent), its id, audio path, file
    size and mtime."""
    h = hashlib.sha256(json.dumps(_settings(config, variant, dtype), sort_keys=True).encode())
    for utt_id, path in sorted((u.id, u.audio_filepath) for u in utterances):
        try:
            st = os.stat(path)
            stamp = f"{st.st_size}\t{st.st_mtime_ns}"
        except OSError:
            stamp = "missing"
        h.update(f"{utt_id}\t{path}\t{stamp}\n".encode())
    return h.hexdigest()


def cache_prefix(manifest_path: str | Path, variant: Variant | float = 1.0) -> str:
    """``<corpus dir>_<manifest stem>[_sp<factor>][_vtlp<factor>][_ps<±semitones>]``: the
    readable part of a cache's name."""
    variant = Variant.of(variant)
    manifest_path = Path(manifest_path).resolve()
    prefix = f"{manifest_path.parent.name}_{manifest_path.stem}"
    if variant.speed != 1.0:
        prefix += f"_sp{variant.speed:g}"
    if variant.warp != 1.0:
        prefix += f"_vtlp{variant.warp:g}"
    if variant.semitones != 0.0:
        prefix += f"_ps{variant.semitones:+g}"
    return prefix


def cache_dir(root: str | Path, manifest_path: str | Path, key: str, variant: Variant | float = 1.0) -> Path:
    """The directory of the cache with ``key`` for ``manifest_path`` under ``root``."""
    return Path(root) / f"{cache_prefix(manifest_path, variant)}-{key[:16]}"


# ------------------------------------------------------------------ reading


class FeatureCache:
    """Read side of one cache directory: ``cache[utt_id] -> (frames, bins) float32``.

    ``skipped`` maps the ids whose audio was unusable when the cache was built (the checks of
    ``fastasr.data.features.load_utterance_audio``: unreadable, empty, NaN, wrong channel
    count, truncated) to the reason; looking one of them up raises ``FeatureCacheError``
    naming it. ``CachedFeatures`` turns those into ``BadAudioError``, so training skips and
    reports them as it does bad audio read on the fly.
    """

    def __init__(self, directory: str | Path, key: str | None = None) -> None:
        self.directory = Path(directory)
        index_path = self.directory / INDEX_NAME
        try:
            index = json.loads(index_path.read_text())
        except (OSError, ValueError) as e:
            raise FeatureCacheError(f"feature cache {self.directory}: unreadable {INDEX_NAME} ({e}); "
                                    "delete the directory to rebuild it") from None
        if index.get("version") != FORMAT_VERSION:
            raise FeatureCacheError(f"feature cache {self.directory}: format version {index.get('version')}; "
                                    f"expected {FORMAT_VERSION}; delete the directory to rebuild it")
        if key is not None and index.get("key") != key:
            raise FeatureCacheError(
                f"feature cache {self.directory}: built for key {str(index.get('key'))[:16]}…, expected "
                f"{key[:16]}… (other feature settings, manifest or audio files); delete it to rebuild")
        self.key: str = index["key"]
        self.settings: dict = index["settings"]
        self.shards: list[str] = index["shards"]
        self.entries: dict[str, list[int]] = index["entries"]
        self.skipped: dict[str, str] = index.get("skipped", {})
        missing = [s for s in self.shards if not (self.directory / s).is_file()]
        if missing:
            raise FeatureCacheError(f"feature cache {self.directory}: shard(s) {missing} missing; "
                                    "delete the directory to rebuild it")
        self._arrays: dict[int, np.ndarray] = {}

    def __getstate__(self) -> dict:  # DataLoader workers re-open the memory maps themselves
        state = dict(self.__dict__)
        state["_arrays"] = {}
        return state

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, utt_id: str) -> bool:
        return utt_id in self.entries

    @property
    def num_frames(self) -> int:
        return sum(n for _, _, n in self.entries.values())

    def nbytes(self) -> int:
        return sum((self.directory / s).stat().st_size for s in self.shards)

    def _shard(self, i: int) -> np.ndarray:
        if i not in self._arrays:
            self._arrays[i] = np.load(self.directory / self.shards[i], mmap_mode="r")
        return self._arrays[i]

    def __getitem__(self, utt_id: str) -> torch.Tensor:
        entry = self.entries.get(utt_id)
        if entry is None:
            reason = (f"its audio was unusable when the cache was built: {self.skipped[utt_id]}"
                      if utt_id in self.skipped else "it is not in the manifest the cache was built from")
            raise FeatureCacheError(f"utterance {utt_id!r}: not in feature cache {self.directory} ({reason})")
        shard, start, frames = entry
        return torch.from_numpy(np.array(self._shard(shard)[start:start + frames], dtype=np.float32))


# ------------------------------------------------------------------ building


class _ComputeFeatures(Dataset):
    """Feature computation for the builder's DataLoader: ``(index, [features per variant] or
    None, reason)``. The variants share their speed factor and pitch shift, so the waveform is
    perturbed once and the filterbank run once per VTLP factor. Unusable audio is found by the
    checks the dataset makes (``load_utterance_audio``)."""

    def __init__(self, utterances: Sequence[Utterance], config: FeatureConfig, variants: Sequence[Variant]) -> None:
        self.utterances, self.fbank, self.variants = list(utterances), Fbank(config), list(variants)

    def __len__(self) -> int:
        return len(self.utterances)

    def __getitem__(self, i: int):
        utt = self.utterances[i]
        try:
            wav = load_utterance_audio(utt, self.fbank.config)
        except BadAudioError as err:  # a bad file in a corpus of thousands is reported, not fatal
            return i, None, err.reason
        wav = perturb(wav, self.variants[0], self.fbank.config.sample_rate)
        return i, [self.fbank(wav, train=False, warp=v.warp) for v in self.variants], ""


class _CacheWriter:
    """One cache being written: shards into a private temporary directory beside ``directory``,
    renamed into place by :meth:`publish`."""

    def __init__(self, directory: Path, key: str, settings: dict, dtype: str, frames_per_shard: int) -> None:
        self.directory, self.key, self.settings = directory, key, settings
        self.dtype, self.frames_per_shard = dtype, frames_per_shard
        directory.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        self.tmp.mkdir()
        self.entries: dict[str, list[int]] = {}
        self.shards: list[str] = []
        self.pending: list[np.ndarray] = []
        self.pending_frames = 0

    def add(self, utt_id: str, feats: torch.Tensor) -> None:
        self.entries[utt_id] = [len(self.shards), self.pending_frames, int(feats.shape[0])]
        self.pending.append(feats.numpy())
        self.pending_frames += int(feats.shape[0])
        if self.pending_frames >= self.frames_per_shard:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            name = f"shard-{len(self.shards):05d}.npy"
            np.save(self.tmp / name, np.concatenate(self.pending).astype(self.dtype, copy=False))
            self.shards.append(name)
            self.pending, self.pending_frames = [], 0

    def publish(self, skipped: dict[str, str], seconds: float) -> FeatureCache:
        """Write the index and rename the directory into place; if another process published
        the same cache meanwhile, that one is kept."""
        self.flush()
        index = {"version": FORMAT_VERSION, "key": self.key, "settings": self.settings,
                 "shards": self.shards, "entries": self.entries, "skipped": skipped}
        (self.tmp / INDEX_NAME).write_text(json.dumps(index))
        try:
            os.rename(self.tmp, self.directory)
        except OSError:
            if not (self.directory / INDEX_NAME).is_file():
                raise
            log.info("feature cache %s: another process built it first; using that copy", self.directory)
            return FeatureCache(self.directory, self.key)
        cache = FeatureCache(self.directory, self.key)
        log.info("feature cache %s: %d utterances, %d frames, %.1f MB in %.1f s%s", self.directory, len(cache),
                 cache.num_frames, cache.nbytes() / 1e6, seconds, f"; {len(skipped)} skipped" if skipped else "")
        return cache

    def discard(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def build_feature_caches(utterances: Sequence[Utterance], config: FeatureConfig | Mapping,
                         targets: Sequence[tuple[str | Path, str, Variant | float]], dtype: str = "float32",
                         num_workers: int = 0, frames_per_shard: int = FRAMES_PER_SHARD) -> list[FeatureCache]:
    """Compute the features of ``utterances`` for every ``(directory, key, variant)`` of
    ``targets`` in one pass over the audio (no dither) and publish each cache atomically as its
    ``directory``. The variants must share their speed factor and pitch shift: each utterance's
    waveform is decoded and perturbed once (the costly pitch shift shared by all of them), then
    the filterbank runs once per VTLP factor. A cache that another process published meanwhile
    is kept. Utterances whose audio is unusable (``BadAudioError``) are logged and listed in
    ``skipped``; duplicate ids keep their first occurrence. Returns the caches in ``targets``'
    order."""
    config = FeatureConfig.from_dict(config)
    targets = [(Path(d), k, Variant.of(v)) for d, k, v in targets]
    if not targets:
        return []
    variants = [v for _, _, v in targets]
    if len({(v.speed, v.semitones) for v in variants}) != 1:
        raise ValueError("build_feature_caches: variants " + "; ".join(v.describe() or "plain" for v in variants)
                         + " differ in speed or pitch; expected one waveform for them all (one speed and pitch)")
    writers: list[_CacheWriter] = []
    try:
        for directory, key, variant in targets:
            writers.append(_CacheWriter(directory, key, _settings(config, variant, dtype), dtype, frames_per_shard))
        seen: set[str] = set()
        unique = []
        for u in utterances:
            if u.id in seen:
                log.warning("feature cache: utterance id %r appears more than once; only its first line is cached", u.id)
                continue
            seen.add(u.id)
            unique.append(u)
        start_time = time.perf_counter()
        skipped: dict[str, str] = {}
        names = ", ".join(d.name for d, _, _ in targets)
        loader = DataLoader(_ComputeFeatures(unique, config, variants), batch_size=None, num_workers=num_workers)
        for done, (i, feats, reason) in enumerate(loader, start=1):
            utt = unique[i]
            if feats is None:
                skipped[utt.id] = reason
                log.warning("feature cache: %s (%s): %s; skipped", utt.id, utt.audio_filepath, reason)
            else:
                for writer, f in zip(writers, feats):
                    writer.add(utt.id, f)
            if done % 1000 == 0:
                log.info("feature cache %s: %d / %d utterances", names, done, len(unique))
        seconds = time.perf_counter() - start_time
        return [writer.publish(skipped, seconds) for writer in writers]
    finally:
        for writer in writers:
            writer.discard()


def build_feature_cache(utterances: Sequence[Utterance], config: FeatureConfig | Mapping, directory: str | Path,
                        key: str, variant: Variant | float = 1.0, dtype: str = "float32", num_workers: int = 0,
                        frames_per_shard: int = FRAMES_PER_SHARD) -> FeatureCache:
    """One cache: :func:`build_feature_caches` with one target (``variant`` a number: a speed factor)."""
    return build_feature_caches(utterances, config, [(directory, key, variant)], dtype, num_workers,
                                frames_per_shard)[0]


def open_feature_caches(utterances: Sequence[Utterance], manifest_path: str | Path, config: FeatureConfig,
                        cache: CacheConfig | Mapping, variants: Sequence[Variant | float] = (1.0,),
                        num_workers: int = 0) -> dict[Variant, FeatureCache] | None:
    """The caches of ``manifest_path``'s ``utterances`` for ``config``, one per variant of
    ``variants`` (a number: a speed factor): those present are opened; in ``build`` mode the
    missing ones are built, those that share a speed factor and pitch shift in one pass over the
    audio (:func:`build_feature_caches`). None when any is missing in ``auto`` mode (the split's
    features are then computed on the fly) or when the cache is off. Caches of the same
    manifest that no longer match are named in the log."""
    cache = CacheConfig.from_dict(cache)
    if not cache.enabled:
        return None
    found: dict[Variant, FeatureCache] = {}
    missing: dict[tuple[float, float], list[tuple[Path, str, Variant]]] = {}
    for variant in dict.fromkeys(Variant.of(v) for v in variants):
        which = f" ({variant.describe()})" if variant != Variant() else ""
        key = cache_key(utterances, config, variant, cache.dtype)
        directory = cache_dir(cache.dir, manifest_path, key, variant)
        if (directory / INDEX_NAME).is_file():
            found[variant] = FeatureCache(directory, key)
            log.info("features of %s%s from cache %s", manifest_path, which, directory)
            if found[variant].skipped:
                log.warning("feature cache %s: %d utterance(s) had unusable audio when it was built and are skipped, "
                            "e.g. %s", directory, len(found[variant].skipped), next(iter(found[variant].skipped.items())))
            continue
        others = sorted(p.name for p in Path(cache.dir).glob(f"{cache_prefix(manifest_path, variant)}-*")
                        if p.is_dir() and p != directory)
        if others:
            log.info("feature cache(s) %s under %s were built from other feature settings or audio and are not used; "
                     "delete them to free the disk", ", ".join(others), cache.dir)
        if cache.mode != "build":
            log.info("no feature cache of %s%s under %s: features are computed on the fly (`make features "
                     "ARGS=\"<this run's overrides>\"` or data.cache.mode=build builds it)", manifest_path, which,
                     cache.dir)
            return None
        missing.setdefault((variant.speed, variant.semitones), []).append((directory, key, variant))
    for group in missing.values():
        log.info("building the feature cache of %s (%s) in %s", manifest_path,
                 "; ".join(v.describe() or "plain" for _, _, v in group), ", ".join(str(d) for d, _, _ in group))
        for (_, _, variant), built in zip(group, build_feature_caches(utterances, config, group, cache.dtype,
                                                                      num_workers)):
            found[variant] = built
    return {Variant.of(v): found[Variant.of(v)] for v in variants}


def open_feature_cache(utterances: Sequence[Utterance], manifest_path: str | Path, config: FeatureConfig,
                       cache: CacheConfig | Mapping, variant: Variant | float = 1.0,
                       num_workers: int = 0) -> FeatureCache | None:
    """The cache of one variant: :func:`open_feature_caches` with ``[variant]``."""
    caches = open_feature_caches(utterances, manifest_path, config, cache, [variant], num_workers)
    return None if caches is None else caches[Variant.of(variant)]
