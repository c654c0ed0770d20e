"""Voice changes (fastasr.data.voice) and the augmentation built on them: VTLP (the filterbank's
warp) and pitch perturbation, their draws, their feature-cache copies."""

from __future__ import annotations

import math

import pytest
import torch

import fastasr.data.feature_cache as feature_cache
from fastasr.data.augment import AugmentConfig, Variant, WaveformAugment, perturb
from fastasr.data.datamodule import ASRDataModule
from fastasr.data.feature_cache import (
    _settings,
    build_feature_cache,
    build_feature_caches,
    cache_dir,
    cache_key,
    cache_prefix,
    open_feature_caches,
)
from fastasr.data.feature_sources import AudioFeatures, CachedFeatures
from fastasr.data.features import Fbank, FeatureConfig
from fastasr.data.manifest import read_manifest
from fastasr.data.voice import change_voice, scale_frequencies

RATE = 16000


def harmonic(f0: float, seconds: float = 1.5, rate: int = RATE, formant: float = 700.0) -> torch.Tensor:
    """A voiced-like sound: harmonics of ``f0`` under a three-formant envelope (F1 = ``formant``)."""
    t = torch.arange(int(seconds * rate), dtype=torch.float64) / rate
    x = torch.zeros_like(t)
    for k in range(1, int(rate / 2 / f0)):
        f = k * f0
        gain = sum(a * math.exp(-((f - c * formant) / w) ** 2) for c, a, w in ((1, 1, 200), (2.2, 0.4, 250), (4, 0.15, 300)))
        x += (gain + 0.003) * torch.sin(2 * math.pi * f * t + 0.3 * k * k)
    return (0.3 * x / x.abs().max()).float()


def formant_noise(formant: float, seconds: float = 1.5, rate: int = RATE, seed: int = 0) -> torch.Tensor:
    """Noise under a three-formant envelope (F1 = ``formant``): a whispered vowel, whose envelope
    is measurable without harmonics in the way."""
    n = torch.randn(int(seconds * rate), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    spec = torch.fft.rfft(n)
    f = torch.arange(spec.numel()) * rate / n.numel()
    env = sum(a * torch.exp(-((f - c * formant) / w) ** 2) for c, a, w in ((1, 1, 150), (2.2, 0.5, 200), (4, 0.2, 300)))
    x = torch.fft.irfft(spec * (env + 0.003), n=n.numel())
    return (0.3 * x / x.abs().max()).float()


def f0_hz(x: torch.Tensor, rate: int = RATE, lo: float = 60.0, hi: float = 600.0) -> float:
    """F0 by autocorrelation of the middle half: the first lag whose peak is within 15 % of the highest."""
    x = x[len(x) // 4: 3 * len(x) // 4].double()
    x = x - x.mean()
    ac = torch.fft.irfft(torch.fft.rfft(x, 2 * len(x)).abs() ** 2)[: len(x)]
    a, b = int(rate / hi), int(rate / lo)
    seg = ac[a:b]
    i = int(torch.nonzero(seg >= 0.85 * seg.max())[0])
    while i + 1 < len(seg) and seg[i + 1] > seg[i]:
        i += 1
    return rate / (a + i)


def formant_hz(x: torch.Tensor, rate: int = RATE) -> float:
    """F1: the peak, between 200 Hz and 3 kHz, of the power spectrum averaged over 64 ms frames
    (Welch) and smoothed over ±100 Hz, interpolated between bins."""
    window = torch.hann_window(1024, dtype=torch.float64)
    power = torch.stft(x.double(), 1024, 256, window=window, return_complex=True).abs().pow(2).mean(1)
    df = rate / 1024
    k = int(100 / df)
    smooth = torch.nn.functional.avg_pool1d(power[None, None], 2 * k + 1, 1, k)[0, 0]
    f = torch.arange(smooth.numel()) * df
    band = torch.nonzero((f > 200) & (f < 3000))[:, 0]
    i = int(band[smooth[band].argmax()])
    a, b, c = smooth[i - 1], smooth[i], smooth[i + 1]
    return float((i + 0.5 * (a - c) / (a - 2 * b + c)) * df)


# ------------------------------------------------------------------ the voice change


@pytest.mark.parametrize("f0", [110.0, 210.0])
@pytest.mark.parametrize(("semitones", "scale"), [(6.0, 1.2), (4.0, 1.15), (-2.0, 1.0), (2.0, 1.0)])
def test_change_voice_moves_f0_by_the_semitones_and_keeps_the_length(f0, semitones, scale):
    x = harmonic(f0)
    y = change_voice(x, RATE, semitones, scale)
    assert y.shape == x.shape and y.dtype == torch.float32
    assert f0_hz(y) / f0_hz(x) == pytest.approx(2 ** (semitones / 12), rel=0.02)
    assert float(y.pow(2).mean().sqrt()) == pytest.approx(float(x.pow(2).mean().sqrt()), rel=1e-3)  # the level kept


@pytest.mark.parametrize("formant", [700.0, 900.0])
@pytest.mark.parametrize(("semitones", "scale"), [(6.0, 1.2), (4.0, 1.15), (7.0, 1.25), (4.0, 1.0), (0.0, 0.9)])
def test_change_voice_scales_the_formants_by_their_own_factor(formant, semitones, scale):
    """The envelope's peak moves × scale, not × the pitch ratio (within 10 %: the 1.6 ms envelope
    blurs a sharp formant, which then lags a little, most below 600 Hz)."""
    x = formant_noise(formant, seconds=2.0)
    ratio = formant_hz(change_voice(x, RATE, semitones, scale)) / formant_hz(x)
    assert ratio == pytest.approx(scale, rel=0.1)
    if semitones >= 4:
        assert abs(ratio - scale) < abs(ratio - 2 ** (semitones / 12))


def test_change_voice_identity_determinism_and_errors():
    x = harmonic(150.0, seconds=0.5)
    assert torch.equal(change_voice(x, RATE), x)
    assert torch.equal(change_voice(x, RATE, 5.0, 1.2), change_voice(x.clone(), RATE, 5.0, 1.2))
    short = harmonic(150.0, seconds=0.01)  # shorter than a window: still its own length
    assert change_voice(short, RATE, 3.0, 1.1).shape == short.shape
    assert scale_frequencies(x, 8000, 1.3).shape == x.shape
    loud = x / x.abs().max()
    assert float(change_voice(loud, RATE, 6.0, 1.2).abs().max()) <= 0.99 + 1e-6
    with pytest.raises(ValueError, match="formant_scale"):
        change_voice(x, RATE, 2.0, 0.0)
    with pytest.raises(ValueError, match="semitones"):
        change_voice(x, RATE, math.nan, 1.0)


# ------------------------------------------------------------------ VTLP: the filterbank's warp


def test_vtlp_factor_one_is_the_plain_filterbank_exactly():
    x = harmonic(140.0, seconds=0.7)
    fb = Fbank(FeatureConfig(num_mel_bins=40))
    assert torch.equal(fb(x, warp=1.0), fb(x))


def test_vtlp_moves_energy_up_or_down_the_mel_axis():
    """A 1 kHz tone: the warp > 1 puts it in a higher mel bin (as a formant × the warp), < 1 lower."""
    t = torch.arange(RATE) / RATE
    tone = 0.3 * torch.sin(2 * math.pi * 1000 * t)
    fb = Fbank(FeatureConfig(num_mel_bins=80))

    def centre(warp: float) -> float:  # the energy-weighted mean bin
        e = fb(tone, warp=warp).exp().mean(0)
        return float((e * torch.arange(e.numel())).sum() / e.sum())

    plain, up, down = centre(1.0), centre(1.15), centre(0.87)
    assert up > plain + 2 and down < plain - 2
    # the same as a tone at 1.15 kHz / 870 Hz without a warp, within a bin
    assert up == pytest.approx(centre_of(fb, 1150.0), abs=1.0)
    assert down == pytest.approx(centre_of(fb, 870.0), abs=1.0)


def centre_of(fb: Fbank, hz: float) -> float:
    t = torch.arange(RATE) / RATE
    e = fb(0.3 * torch.sin(2 * math.pi * hz * t)).exp().mean(0)
    return float((e * torch.arange(e.numel())).sum() / e.sum())


def test_vtlp_works_at_8_khz():
    fb = Fbank(FeatureConfig(sample_rate=8000, num_mel_bins=40))
    x = harmonic(140.0, seconds=0.5, rate=8000)
    assert fb(x, warp=1.1).shape == fb(x).shape


# ------------------------------------------------------------------ the draws and the config


def test_augment_config_variants_and_errors():
    assert AugmentConfig().variants == (Variant(),) and not AugmentConfig().enabled
    cfg = AugmentConfig(vtlp=True, pitch_shift=True, vtlp_factors=[1.0, 1.1], pitch_semitones=[0, 2])
    assert cfg.enabled and cfg.variants == (Variant(1, 1, 0), Variant(1, 1, 2), Variant(1, 1.1, 0), Variant(1, 1.1, 2))
    assert len(AugmentConfig(speed_perturb=True, vtlp=True, pitch_shift=True).variants) == 27
    with pytest.raises(ValueError, match="data.augment.vtlp_factors"):
        AugmentConfig(vtlp_factors=[0.5])
    with pytest.raises(ValueError, match="data.augment.pitch_semitones"):
        AugmentConfig(pitch_semitones=[])
    with pytest.raises(ValueError, match="vtlp_warp"):  # unknown keys are named
        AugmentConfig.from_dict({"vtlp_warp": 1.1})


def test_variants_are_drawn_per_utterance_and_epoch_deterministically_by_seed():
    cfg = {"vtlp": True, "pitch_shift": True, "speed_perturb": True}
    ids = [f"u{i}" for i in range(60)]

    def draws(seed: int, epoch: int) -> list[Variant]:
        aug = WaveformAugment(cfg, RATE, seed)
        aug.set_epoch(epoch)
        return [aug.variant(i) for i in ids]

    assert draws(3, 0) == draws(3, 0)  # a function of (seed, epoch, id) only
    assert draws(3, 0) != draws(3, 1) and draws(3, 0) != draws(4, 0)
    assert {v.warp for v in draws(3, 0)} == {0.9, 1.0, 1.1} and {v.semitones for v in draws(3, 0)} == {-2, 0, 2}
    # each axis its own stream: the speed draws are the ones a run without VTLP and pitch gets
    speed_only = WaveformAugment({"speed_perturb": True}, RATE, 3)
    assert [v.speed for v in draws(3, 0)] == [speed_only.speed_factor(i) for i in ids]
    off = WaveformAugment({"speed_perturb": True}, RATE, 3)
    assert all(off.variant(i).warp == 1.0 and off.variant(i).semitones == 0.0 for i in ids)


def test_perturb_is_speed_then_pitch():
    x = harmonic(150.0, seconds=0.6)
    assert torch.equal(perturb(x, Variant(warp=1.1), RATE), x)  # VTLP is the filterbank's
    y = perturb(x, Variant(0.9, 1.0, 2.0), RATE)
    assert y.numel() == math.ceil(x.numel() / 0.9)
    assert f0_hz(y) / f0_hz(x) == pytest.approx(0.9 * 2 ** (2 / 12), rel=0.02)


# ------------------------------------------------------------------ the feature cache's copies


def test_cache_keys_and_names_include_the_variant(tiny_corpus, tmp_path):
    utts = read_manifest(tiny_corpus / "train.jsonl")
    cfg = FeatureConfig(num_mel_bins=40)
    keys = {v: cache_key(utts, cfg, v) for v in (Variant(), Variant(0.9), Variant(warp=1.1), Variant(semitones=2),
                                                Variant(0.9, 1.1, -2))}
    assert len(set(keys.values())) == len(keys)
    assert keys[Variant()] == cache_key(utts, cfg) and keys[Variant(0.9)] == cache_key(utts, cfg, 0.9)
    # the plain and speed-only settings are what they were before VTLP: their caches stay valid
    assert set(_settings(cfg, Variant(0.9), "float32")) == {"version", "features", "speed", "dtype"}
    assert {"vtlp", "pitch_semitones", "voice_version"} <= set(_settings(cfg, Variant(0.9, 1.1, -2), "float32"))
    manifest = tiny_corpus / "train.jsonl"
    assert cache_prefix(manifest, Variant(0.9, 1.1, -2)).endswith("_train_sp0.9_vtlp1.1_ps-2")
    assert cache_prefix(manifest, Variant(semitones=2)).endswith("_train_ps+2")
    assert cache_prefix(manifest, 1.1).endswith("_train_sp1.1") and cache_prefix(manifest).endswith("_train")
    assert cache_dir(tmp_path, manifest, keys[Variant(warp=1.1)], Variant(warp=1.1)).name.startswith(
        cache_prefix(manifest, Variant(warp=1.1)) + "-")


def test_copies_of_one_speed_and_pitch_share_one_waveform(tiny_corpus, tmp_path, monkeypatch):
    """The VTLP copies of one speed and pitch are built in one pass: each utterance perturbed
    once, its caches equal to building each copy alone; copies of other speeds or pitches are
    refused in one pass and built in passes of their own by ``open_feature_caches``."""
    utts = read_manifest(tiny_corpus / "dev.jsonl")
    cfg = FeatureConfig(num_mel_bins=40)
    manifest = tiny_corpus / "dev.jsonl"
    calls = []
    real = feature_cache.perturb
    monkeypatch.setattr(feature_cache, "perturb", lambda wav, v, rate: calls.append(v) or real(wav, v, rate))
    group = [Variant(1.0, w, 2.0) for w in (0.9, 1.0, 1.1)]
    targets = [(cache_dir(tmp_path / "one", manifest, cache_key(utts, cfg, v), v), cache_key(utts, cfg, v), v)
               for v in group]
    together = build_feature_caches(utts, cfg, targets)
    assert len(calls) == len(utts)  # one waveform per utterance for the three copies
    for (directory, key, v), cache in zip(targets, together):
        alone = build_feature_cache(utts, cfg, tmp_path / "alone" / directory.name, key, v)
        assert cache.directory == directory and cache.settings == alone.settings and cache.settings.get("vtlp", 1.0) == v.warp
        for u in utts:
            assert torch.equal(cache[u.id], alone[u.id])
    assert not torch.equal(together[0][utts[0].id], together[2][utts[0].id])  # the warps differ
    with pytest.raises(ValueError, match="differ in speed or pitch"):
        build_feature_caches(utts, cfg, targets[:1] + [(tmp_path / "x", "k", Variant(0.9, 0.9, 2.0))])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alone", "one"]  # the refused build left nothing
    calls.clear()
    variants = [Variant(s, w, p) for s in (1.0, 1.1) for w in (0.9, 1.1) for p in (0.0, 2.0)]
    caches = open_feature_caches(utts, manifest, cfg, {"dir": str(tmp_path / "opened"), "mode": "build"}, variants)
    assert list(caches) == variants and len({c.directory for c in caches.values()}) == 8
    assert len(calls) == 4 * len(utts)  # four (speed, pitch) passes for eight copies
    calls.clear()
    assert {v: c.directory for v, c in open_feature_caches(
        utts, manifest, cfg, {"dir": str(tmp_path / "opened"), "mode": "auto"}, variants).items()} == \
        {v: c.directory for v, c in caches.items()} and not calls  # found, not built again
    assert open_feature_caches(utts, manifest, cfg, {"dir": str(tmp_path / "opened"), "mode": "auto"},
                               variants + [Variant(0.9)]) is None  # one copy missing: on the fly


def make_dm(corpus, cache_root, **kw):
    args = dict(train_manifest=str(corpus / "train.jsonl"), dev_manifest=str(corpus / "dev.jsonl"),
                test_manifest=str(corpus / "test.jsonl"), features={"num_mel_bins": 40, "dither": 0.0},
                max_frames_per_batch=2000, cmvn_stats={"mean": [0.0] * 40, "std": [1.0] * 40},
                cache={"dir": str(cache_root), "mode": "build"} if cache_root else None)
    args.update(kw)
    return ASRDataModule(**args)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_training_reads_the_copy_of_its_drawn_variant_equal_to_on_the_fly(tiny_corpus, tmp_path):
    augment = {"vtlp": True, "vtlp_factors": [1.0, 1.1], "pitch_shift": True, "pitch_semitones": [0.0, 2.0]}
    cached = make_dm(tiny_corpus, tmp_path / "cache", augment=augment)
    cached.setup("fit")
    fly = make_dm(tiny_corpus, None, augment=augment)
    fly.setup("fit")
    source, train = cached.datasets["train"].source, cached.datasets["train"]
    assert isinstance(source, CachedFeatures) and isinstance(fly.datasets["train"].source, AudioFeatures)
    assert set(source.caches) == {Variant(1, w, s) for w in (1.0, 1.1) for s in (0.0, 2.0)}
    assert len({c.directory for c in source.caches.values()}) == 4
    assert list(cached.datasets["dev"].source.caches) == [Variant()]  # dev and test: the plain features
    plain = Fbank({"num_mel_bins": 40})
    seen = set()
    for epoch in (0, 1):
        source.set_epoch(epoch)  # what Lightning's set_epoch reaches (test_data_augment checks the path)
        fly.datasets["train"].source.set_epoch(epoch)
        for i, utt in enumerate(train.utterances):
            variant = source.variant(utt)
            seen.add(variant)
            feats = train[i]["features"]
            assert torch.equal(feats, source.caches[variant][utt.id])
            torch.testing.assert_close(feats, fly.datasets["train"][i]["features"], atol=1e-4, rtol=1e-4)
            if variant != Variant():
                assert feats.shape[0] == plain.from_file(utt.audio_filepath).shape[0]  # the length kept
                assert not torch.equal(feats, source.caches[Variant()][utt.id])
    assert len(seen) >= 3
