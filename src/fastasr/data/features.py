"""Data-side features: Kaldi-compatible log-mel filterbanks and the global CMVN statistics pass.

``Fbank`` runs in the dataset (CPU workers); ``compute_cmvn_stats`` measures the training
set's per-dimension mean and standard deviation once. The normalisation itself, SpecAugment
and subsampling belong to the model (``fastasr.model.frontend``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
import torchaudio.compliance.kaldi as kaldi
from torch import nn

from fastasr.data.audio import BadAudioError, file_sample_rate, load_audio
from fastasr.data.bad_audio import SkippedUtterance, all_bad_error, describe_skipped, refused
from fastasr.sections import dataclass_from_mapping

log = logging.getLogger(__name__)

INT16_SCALE = 32768.0  # Kaldi works on int16-scaled samples


@dataclass(frozen=True)
class FeatureConfig:
    """Filterbank settings (``conf/features/*.yaml``)."""

    sample_rate: int | None = 16000  # Hz; audio is resampled to it. None: the training audio's own (native_rate)
    num_mel_bins: int = 80  # filterbank channels (feature dim)
    frame_length_ms: float = 25.0  # analysis window
    frame_shift_ms: float = 10.0  # hop
    dither: float = 0.0  # Gaussian dither in int16 units, applied in training only (Kaldi default 1.0)
    channels: int | None = None  # channels a file must have (others are bad audio); None: any, mixed down
    snip_edges: bool = True  # frames wholly inside the samples (Kaldi's default); False: centred on the hops,
    # the edges mirrored (sherpa-onnx's, lhotse's and icefall's: an export then runs in sherpa-onnx exactly)
    high_freq: float = 0.0  # top of the mel bins in Hz; <= 0: that far below the Nyquist frequency (sherpa-onnx's -400)
    sample_scale: float = INT16_SCALE  # what samples in [-1, 1] are multiplied by first: Kaldi's int16 range;
    # 1.0: sherpa-onnx's and lhotse's (a bin whose energy is below float32's epsilon at that scale is floored)

    @classmethod
    def from_dict(cls, cfg: Mapping | FeatureConfig | None) -> FeatureConfig:
        """Build from a mapping (or DictConfig); unknown keys raise ``ValueError``."""
        return dataclass_from_mapping(cls, cfg, "features")

    @property
    def resolved(self) -> bool:
        """Whether ``sample_rate`` is set (``None`` waits for :func:`with_native_rate`)."""
        return self.sample_rate is not None

    @property
    def window_samples(self) -> int:
        return int(self._rate() * self.frame_length_ms / 1000)

    def _rate(self) -> int:
        if self.sample_rate is None:
            raise ValueError("features.sample_rate is null (the training audio's own rate) and has not been "
                             "resolved from a training manifest yet; set features.sample_rate or give "
                             "data.train_manifest")
        return self.sample_rate

    @property
    def shift_samples(self) -> int:
        return int(self._rate() * self.frame_shift_ms / 1000)

    def num_frames(self, num_samples: int) -> int:
        """Frames Kaldi's fbank gives for ``num_samples`` (at least 1: :class:`Fbank` pads input
        shorter than a window to one window)."""
        num_samples = max(num_samples, self.window_samples)
        if not self.snip_edges:
            return (num_samples + self.shift_samples // 2) // self.shift_samples
        return 1 + (num_samples - self.window_samples) // self.shift_samples

    @property
    def edge_samples(self) -> int:
        """Samples mirrored before the first with ``snip_edges`` False (frame ``i`` starts at
        ``i * shift - edge_samples``); 0 with edges snipped."""
        return 0 if self.snip_edges else self.window_samples // 2 - self.shift_samples // 2

    def key(self) -> dict:
        """The settings a cache of features or CMVN statistics is keyed by: every field but
        ``dither`` (caches hold features without it), and ``snip_edges``, ``high_freq`` and
        ``sample_scale`` only where they differ from Kaldi's defaults, so the keys of caches
        written before the three existed stay valid."""
        out = asdict(self)
        out.pop("dither")
        defaults = {f.name: f.default for f in fields(self)}
        for name in ("snip_edges", "high_freq", "sample_scale"):
            if out[name] == defaults[name]:
                out.pop(name)
        return out

    def frames_for_duration(self, seconds: float) -> int:
        """Frames for a duration in seconds (as in a manifest)."""
        return self.num_frames(int(round(seconds * self._rate())))


NATIVE_RATE_CAP = 16000  # Hz: features.sample_rate null never computes filterbanks above this rate
NATIVE_RATE_PROBES = 64  # files whose headers are read to find the training audio's rate


def native_rate(paths: Sequence[str | Path], source: str = "the training manifest") -> int:
    """The rate of ``features.sample_rate: null``: the most common header rate among up to
    ``NATIVE_RATE_PROBES`` files spread evenly over ``paths``, capped at ``NATIVE_RATE_CAP``.

    So 8 kHz telephone or digit recordings get 8 kHz filterbanks (up-sampling them would only
    add empty bins above 4 kHz and make every frame costlier), 16 kHz corpora 16 kHz, and
    44.1/48 kHz recordings (Common Voice, AudioMNIST) are down-sampled to 16 kHz. Unreadable
    files are passed over (training reports them); none readable raises ``ValueError``
    naming ``source``.
    """
    from collections import Counter

    if not paths:
        raise ValueError(f"features.sample_rate null: {source} has no utterances to read the rate from")
    step = max(1, len(paths) // NATIVE_RATE_PROBES)
    rates: Counter[int] = Counter()
    for path in list(paths)[::step][:NATIVE_RATE_PROBES]:
        try:
            rates[file_sample_rate(path)] += 1
        except BadAudioError:
            continue
    if not rates:
        raise ValueError(f"features.sample_rate null: no readable audio among the first files of {source} "
                         f"(e.g. {paths[0]}); set features.sample_rate")
    rate = rates.most_common(1)[0][0]
    if len(rates) > 1:
        log.warning("%s mixes sample rates %s (of %d files read); features at %d Hz", source, dict(rates),
                    sum(rates.values()), min(rate, NATIVE_RATE_CAP))
    return min(rate, NATIVE_RATE_CAP)


def with_native_rate(config: FeatureConfig, paths: Sequence[str | Path], source: str) -> FeatureConfig:
    """``config`` with ``sample_rate`` resolved by :func:`native_rate` when it is None."""
    if config.resolved:
        return config
    rate = native_rate(paths, source)
    log.info("features.sample_rate: %d Hz, the audio's own rate in %s (capped at %d)", rate, source,
             NATIVE_RATE_CAP)
    return replace(config, sample_rate=rate)


class Fbank:
    """Kaldi-compatible log-mel filterbank (``torchaudio.compliance.kaldi.fbank``).

    Povey window, pre-emphasis 0.97, DC removal, power spectrum, log; samples
    are scaled to the int16 range first, as Kaldi reads them (``sample_scale``).
    Dither (in int16 units) is added only when called with ``train=True``.
    """

    def __init__(self, config: FeatureConfig | Mapping | None = None, **overrides) -> None:
        cfg = FeatureConfig.from_dict(config)
        if overrides:
            cfg = FeatureConfig(**{**asdict(cfg), **overrides})
        cfg._rate()  # a null sample rate must be resolved (with_native_rate) before features are computed
        self.config = cfg

    @property
    def dim(self) -> int:
        return self.config.num_mel_bins

    def num_frames(self, num_samples: int) -> int:
        return self.config.num_frames(num_samples)

    def __call__(self, waveform: torch.Tensor, train: bool = False, warp: float = 1.0,
                 snip_edges: bool | None = None) -> torch.Tensor:
        """``waveform (T,)`` float in [-1, 1] at ``config.sample_rate`` → ``(frames, num_mel_bins)`` float32.

        ``warp`` ≠ 1: the mel bins' frequency axis warped by Kaldi's VTLN warp (``vtln_warp``;
        bins between 100 Hz and Nyquist − 500 Hz at ``f / warp``, piecewise linear outside), so
        ``warp`` > 1 moves energy up the mel axis: VTLP in training (``data.augment.vtlp``).
        ``snip_edges``: the config's unless given (:class:`FbankStream` cuts mirrored edges itself)."""
        c = self.config
        wav = waveform.reshape(1, -1).to(torch.float32) * c.sample_scale
        if wav.shape[1] < c.window_samples:
            wav = nn.functional.pad(wav, (0, c.window_samples - wav.shape[1]))
        vtln = {"vtln_warp": float(warp)} if warp != 1.0 else {}  # 1.0: the call exactly as without VTLP
        return kaldi.fbank(
            wav,
            num_mel_bins=c.num_mel_bins,
            frame_length=c.frame_length_ms,
            frame_shift=c.frame_shift_ms,
            dither=c.dither * c.sample_scale / INT16_SCALE if train else 0.0,  # dither is in int16 units
            energy_floor=0.0,
            sample_frequency=c.sample_rate,
            snip_edges=c.snip_edges if snip_edges is None else snip_edges,
            high_freq=c.high_freq,
            **vtln,
        )

    def stream(self) -> FbankStream:
        """A :class:`FbankStream`: the same frames, computed as the samples arrive."""
        return FbankStream(self)

    def from_file(self, path: str | Path, train: bool = False) -> torch.Tensor:
        """Load (mono, resampled) and compute features: ``(frames, num_mel_bins)``.

        Raises ``fastasr.data.audio.BadAudioError`` for unusable audio (see ``load_audio``)."""
        return self(load_audio(path, self.config.sample_rate, self.config.channels), train=train)


class FbankStream:
    """Filterbank frames of a recording that arrives in pieces: ``accept(samples)`` returns the
    frames whose window is complete (``(T, F)``, maybe none), ``finish()`` what the end of the
    recording adds. Together they are :class:`Fbank`'s frames of the whole recording (without
    dither): each frame depends on its own window's samples only. With ``snip_edges`` False the
    stream mirrors the first samples before them as the whole-recording filterbank does, and the
    last ones at ``finish``; no frame is given before a window's worth of samples has arrived
    (a shorter recording is padded to one window, as :class:`Fbank` pads it)."""

    def __init__(self, fbank: Fbank) -> None:
        self.fbank = fbank
        self.buffer = torch.zeros(0)  # samples not yet wholly used, edge samples included
        self.head = torch.zeros(0)  # the first samples, while fewer than a window have arrived
        self.tail = torch.zeros(0)  # the last window of samples (mirrored at the end; snip_edges False)
        self.received = 0  # samples accepted
        self.frames = 0  # frames given so far

    def accept(self, samples: torch.Tensor) -> torch.Tensor:
        """``samples (T,)`` in [-1, 1] at the features' rate → the new frames ``(T', F)``."""
        c = self.fbank.config
        samples = torch.as_tensor(samples, dtype=torch.float32).reshape(-1)
        self.received += samples.shape[0]
        if not c.snip_edges:  # finish mirrors the last window's samples
            self.tail = torch.cat([self.tail, samples])[-c.window_samples:]
        if self.received - samples.shape[0] < c.window_samples:  # still gathering the first window
            self.head = torch.cat([self.head, samples])
            if self.head.shape[0] < c.window_samples:
                return torch.zeros(0, self.fbank.dim)
            samples, self.head = self.head, torch.zeros(0)
            samples = torch.cat([samples[:c.edge_samples].flip(0), samples])
        self.buffer = torch.cat([self.buffer, samples])
        return self._frames(self.buffer, 1 + (self.buffer.shape[0] - c.window_samples) // c.shift_samples
                            if self.buffer.shape[0] >= c.window_samples else 0)

    def _frames(self, samples: torch.Tensor, n: int) -> torch.Tensor:
        """The first ``n`` edge-snipped frames of ``samples``; the buffer moves past them."""
        c = self.fbank.config
        if n <= 0:
            return torch.zeros(0, self.fbank.dim)
        frames = self.fbank(samples[:(n - 1) * c.shift_samples + c.window_samples], snip_edges=True)
        self.buffer = self.buffer[n * c.shift_samples:]
        self.frames += n
        return frames

    def finish(self) -> torch.Tensor:
        """The frames the end adds: a recording shorter than a window gives its one padded frame
        (or, edges not snipped, its frames of one padded window); edges not snipped, the frames
        over the mirrored end."""
        c = self.fbank.config
        if self.head.shape[0]:  # shorter than a window: the whole-recording call pads it
            head, self.head = self.head, torch.zeros(0)
            frames = self.fbank(head)
            self.frames += frames.shape[0]
            return frames
        left = c.num_frames(self.received) - self.frames if self.received else 0
        if left <= 0:
            return torch.zeros(0, self.fbank.dim)
        need = (left - 1) * c.shift_samples + c.window_samples - self.buffer.shape[0]
        mirrored = torch.cat([self.buffer, self.tail.flip(0)[:max(0, need)]])
        return self._frames(mirrored, left)


def load_utterance_audio(utt, config: FeatureConfig) -> torch.Tensor:
    """The waveform ``(T,)`` of a manifest utterance (``audio_filepath``, ``duration``) at
    ``config.sample_rate``, checked as every feature path checks it (the dataset's on-the-fly
    features, the feature-cache builder, the CMVN pass): ``config.channels`` channels, finite,
    non-empty and not shorter than the manifest duration.

    Raises ``fastasr.data.audio.BadAudioError`` (path and reason) otherwise."""
    return load_audio(utt.audio_filepath, config.sample_rate, config.channels, getattr(utt, "duration", None))


# --------------------------------------------------------------------- CMVN


def cmvn_cache_path(manifest_path: str | Path, config: FeatureConfig | Mapping,
                    utterance_ids: Sequence[str] | None = None) -> Path:
    """Where the CMVN statistics of a manifest are cached: next to it, named
    by a hash of the manifest's bytes, the feature config (dither excluded:
    statistics are computed without it) and the utterance ids used."""
    manifest_path = Path(manifest_path)
    cfg = FeatureConfig.from_dict(config).key()
    h = hashlib.sha256()
    h.update(manifest_path.read_bytes())
    h.update(json.dumps(cfg, sort_keys=True).encode())
    if utterance_ids is not None:
        h.update("\n".join(utterance_ids).encode())
    return manifest_path.with_name(f"{manifest_path.stem}.cmvn-{h.hexdigest()[:16]}.json")


class _FeatureSums(torch.utils.data.Dataset):
    """Per-utterance feature sums, or a ``SkippedUtterance`` for unusable audio."""

    def __init__(self, utterances: Sequence, fbank: Fbank) -> None:
        self.utterances, self.fbank = list(utterances), fbank

    def __len__(self) -> int:
        return len(self.utterances)

    def __getitem__(self, i: int):
        utt = self.utterances[i]
        try:
            x = self.fbank(load_utterance_audio(utt, self.fbank.config))
        except BadAudioError as err:
            return SkippedUtterance(str(getattr(utt, "id", i)), str(utt.audio_filepath), err.reason)
        x = x.to(torch.float64)
        return x.sum(0), (x * x).sum(0), x.shape[0]


def _as_is(item):
    return item  # no default_convert: keep SkippedUtterance records as they are


def compute_cmvn_stats(utterances: Sequence, fbank: Fbank, cache_path: str | Path | None = None,
                       num_workers: int = 0, min_std: float = 1e-5,
                       on_bad_audio: str = "skip") -> tuple[torch.Tensor, torch.Tensor]:
    """Global per-dimension mean and standard deviation of the features of
    ``utterances`` (objects with ``audio_filepath``), without dither.

    With ``cache_path``, statistics are read from it if it exists, else
    computed and written there (JSON). Returns float32 ``(F,)`` mean and std
    (std floored at ``min_std``).

    Utterances with unusable audio (``BadAudioError``) are left out with a warning naming each
    (``on_bad_audio="skip"``) or stop the computation (``"raise"``); if none is usable,
    ``AllAudioBadError`` names them.
    """
    if cache_path is not None and Path(cache_path).is_file():
        stats = json.loads(Path(cache_path).read_text())
        log.info("CMVN statistics from %s (%d frames)", cache_path, stats["frames"])
        return torch.tensor(stats["mean"]), torch.tensor(stats["std"])
    if not utterances:
        raise ValueError("compute_cmvn_stats: no utterances")
    dim = fbank.dim
    total = torch.zeros(dim, dtype=torch.float64)
    total_sq = torch.zeros(dim, dtype=torch.float64)
    frames = 0
    skipped: list[SkippedUtterance] = []
    loader = torch.utils.data.DataLoader(
        _FeatureSums(utterances, fbank), batch_size=None, num_workers=num_workers, shuffle=False,
        collate_fn=_as_is,
    )
    for item in loader:
        if isinstance(item, SkippedUtterance):
            if on_bad_audio == "raise":
                raise refused(item)
            skipped.append(item)
            continue
        s, sq, n = item
        total += s
        total_sq += sq
        frames += int(n)
    if skipped:
        if len(skipped) == len(utterances):
            raise all_bad_error("CMVN statistics (training set)", skipped)
        log.warning("CMVN statistics: skipped %d of %d utterances with unusable audio (training skips "
                    "them too):\n%s", len(skipped), len(utterances), describe_skipped(skipped))
    used = len(utterances) - len(skipped)
    mean = total / frames
    var = (total_sq / frames - mean * mean).clamp_min(0.0)
    std = var.sqrt().clamp_min(min_std)
    mean, std = mean.to(torch.float32), std.to(torch.float32)
    if cache_path is not None:
        cache_path = Path(cache_path)
        tmp = cache_path.with_name(cache_path.name + f".tmp{os.getpid()}")
        try:
            tmp.write_text(json.dumps({
                "mean": mean.tolist(), "std": std.tolist(), "frames": frames,
                "utterances": used, "features": asdict(fbank.config),
            }))
            os.replace(tmp, cache_path)
        except OSError as e:  # e.g. a read-only corpus directory: statistics are still returned
            log.warning("CMVN statistics not cached (%s): %s", cache_path, e)
        else:
            log.info("CMVN statistics over %d utterances (%d frames) cached in %s", used, frames, cache_path)
    return mean, std
