"""Filterbanks vs Kaldi's algorithm and torchaudio's Kaldi reference; the CMVN statistics pass."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.compliance.kaldi as kaldi
import torchaudio.functional as AF

from fastasr.data.features import Fbank, FeatureConfig, cmvn_cache_path, compute_cmvn_stats
from fastasr.data.manifest import Utterance
from fastasr.onnx.filterbank import KALDI_FEATURES


def tone(n, rate=16000, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n) / rate
    return 0.3 * torch.sin(2 * torch.pi * 440 * t) + 0.05 * torch.randn(n, generator=g)


def kaldi_fbank_algorithm(wav: np.ndarray, rate: int, bins: int, frame_ms: float = 25.0,
                          shift_ms: float = 10.0, low_hz: float = 20.0, preemph: float = 0.97,
                          snip_edges: bool = True, high_hz: float = 0.0) -> np.ndarray:
    """Kaldi's ``compute-fbank-feats`` written out in float64 numpy, independently of torchaudio:
    int16-scaled samples, snip_edges framing (or, ``snip_edges`` False, ``round(n / shift)``
    frames, frame ``i`` from sample ``i * shift + shift / 2 - win / 2``, indices outside the
    samples mirrored: -1 reads 0, n reads n - 1), per-frame DC removal, pre-emphasis (first sample
    against itself), Povey window (Hann^0.85), power spectrum of the FFT padded to a power of
    two, triangular mel filters (mel = 1127 ln(1 + f/700)) from ``low_hz`` to ``high_hz`` (<= 0:
    that far below Nyquist), natural log floored at float32 epsilon. Returns ``(frames, bins)``."""
    x = wav.astype(np.float64) * 32768.0
    win, shift = int(rate * frame_ms / 1000), int(rate * shift_ms / 1000)
    if snip_edges:
        frames = np.stack([x[i * shift: i * shift + win] for i in range(1 + (len(x) - win) // shift)])
    else:
        n = len(x)

        def at(j):
            return x[-j - 1] if j < 0 else x[2 * n - 1 - j] if j >= n else x[j]

        starts = [i * shift + shift // 2 - win // 2 for i in range((n + shift // 2) // shift)]
        frames = np.array([[at(j) for j in range(s, s + win)] for s in starts])
    frames = frames - frames.mean(1, keepdims=True)
    frames = np.concatenate([frames[:, :1] * (1 - preemph), frames[:, 1:] - preemph * frames[:, :-1]], 1)
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(win) / (win - 1))) ** 0.85
    n_fft = 1 << (win - 1).bit_length()
    power = np.abs(np.fft.rfft(frames * window, n_fft)) ** 2

    def mel(f):
        return 1127.0 * np.log(1.0 + np.asarray(f) / 700.0)

    top = high_hz if high_hz > 0 else rate / 2 + high_hz
    edges = mel(low_hz) + (mel(top) - mel(low_hz)) * np.arange(bins + 2) / (bins + 1)
    fft_mel = mel(np.arange(n_fft // 2) * rate / n_fft)
    left, center, right = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    filters = np.maximum(0.0, np.minimum((fft_mel - left) / (center - left), (right - fft_mel) / (right - center)))
    energies = power[:, : n_fft // 2] @ filters.T
    return np.log(np.maximum(energies, np.finfo(np.float32).eps))


@pytest.mark.parametrize("bins,rate", [(40, 16000), (80, 16000), (23, 8000)])
def test_fbank_matches_kaldis_algorithm(bins, rate):
    """The numbers, not just the shape: Fbank equals Kaldi's fbank computed from its definition."""
    wav = tone(rate + 123, rate=rate)
    feats = Fbank({"num_mel_bins": bins, "sample_rate": rate})(wav)
    reference = kaldi_fbank_algorithm(wav.numpy(), rate, bins)
    assert feats.shape == reference.shape
    np.testing.assert_allclose(feats.numpy(), reference, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("rate", [16000, 8000])
def test_centred_frames_and_a_lower_top_match_kaldis_algorithm(rate):
    """``snip_edges`` False and ``high_freq`` -400 (sherpa-onnx's filterbank): Kaldi's frames centred
    on the hops with mirrored edges, the mel bins up to 400 Hz below Nyquist, and their count."""
    wav = tone(rate + 123, rate=rate)
    config = FeatureConfig(num_mel_bins=40, sample_rate=rate, snip_edges=False, high_freq=-400.0)
    feats = Fbank(config)(wav)
    reference = kaldi_fbank_algorithm(wav.numpy(), rate, 40, snip_edges=False, high_hz=-400.0)
    assert feats.shape == reference.shape == (config.num_frames(wav.shape[0]), 40)
    np.testing.assert_allclose(feats.numpy(), reference, rtol=1e-4, atol=1e-3)
    assert not np.allclose(feats.numpy()[1:-1], kaldi_fbank_algorithm(wav.numpy(), rate, 40)[:feats.shape[0] - 2],
                           atol=1e-1)


def test_samples_in_unit_range_shift_the_log_energies_and_floor_the_quietest():
    """``sample_scale`` 1 (sherpa-onnx's and lhotse's samples in [-1, 1]): every log-mel energy is
    ``ln(32768²)`` below the int16-scaled one, except where that falls below Kaldi's floor
    (float32's epsilon), which holds it; dither stays in int16 units."""
    wav = tone(16000 + 123) * 1e-4  # a quiet recording: some bins reach the floor at [-1, 1]
    int16 = Fbank(FeatureConfig(num_mel_bins=40))(wav)
    unit = Fbank(FeatureConfig(num_mel_bins=40, sample_scale=1.0))(wav)
    floor = float(np.log(np.finfo(np.float32).eps))
    shift = 2 * np.log(32768.0)
    expected = torch.clamp_min(int16 - shift, floor)
    torch.testing.assert_close(unit, expected, atol=2e-3, rtol=1e-4)
    assert (unit <= floor + 1e-4).any() and (int16 > floor + 1).all()
    torch.manual_seed(0)
    a = Fbank(FeatureConfig(num_mel_bins=40, dither=1.0))(torch.zeros(4000), train=True)
    torch.manual_seed(0)
    b = Fbank(FeatureConfig(num_mel_bins=40, dither=1.0, sample_scale=1.0))(torch.zeros(4000), train=True)
    torch.testing.assert_close(b, torch.clamp_min(a - shift, floor), atol=2e-3, rtol=1e-4)  # the same noise


def test_cache_keys_name_the_new_settings_only_where_they_differ_from_kaldis(tmp_path):
    """``FeatureConfig.key``: caches of features and CMVN statistics computed on Kaldi's defaults
    keep the keys they had before ``snip_edges``, ``high_freq`` and ``sample_scale`` existed; each
    setting changed gives another key."""
    kaldi_defaults = FeatureConfig(num_mel_bins=40)
    assert {k: getattr(kaldi_defaults, k) for k in KALDI_FEATURES} == KALDI_FEATURES  # the runtime's copy
    assert kaldi_defaults.key() == {"sample_rate": 16000, "num_mel_bins": 40, "frame_length_ms": 25.0,
                                    "frame_shift_ms": 10.0, "channels": None}
    centred = FeatureConfig(num_mel_bins=40, snip_edges=False)
    lower = FeatureConfig(num_mel_bins=40, high_freq=-400.0)
    unit = FeatureConfig(num_mel_bins=40, sample_scale=1.0)
    assert centred.key()["snip_edges"] is False and "high_freq" not in centred.key()
    assert lower.key()["high_freq"] == -400.0 and "snip_edges" not in lower.key()
    assert unit.key()["sample_scale"] == 1.0 and "sample_scale" not in lower.key()
    manifest = tmp_path / "train.jsonl"
    manifest.write_text("{}\n")
    paths = {cmvn_cache_path(manifest, c) for c in (kaldi_defaults, centred, lower, unit)}
    assert len(paths) == 4


@pytest.mark.parametrize("bins", [40, 80])
def test_fbank_matches_kaldi_reference(bins):
    wav = tone(16000 + 123)
    fb = Fbank({"num_mel_bins": bins})
    feats = fb(wav)
    ref = kaldi.fbank(wav[None] * 32768, num_mel_bins=bins, frame_length=25.0, frame_shift=10.0,
                      dither=0.0, sample_frequency=16000, energy_floor=0.0)
    assert feats.shape == (fb.num_frames(wav.shape[0]), bins) == (99, bins)
    assert feats.dtype == torch.float32
    torch.testing.assert_close(feats, ref)
    assert FeatureConfig(num_mel_bins=bins).frames_for_duration(1.0123) == 99


def test_fbank_dither_only_in_training():
    wav = tone(8000)
    fb = Fbank(num_mel_bins=40, dither=1.0)
    torch.testing.assert_close(fb(wav), fb(wav))
    assert not torch.equal(fb(wav, train=True), fb(wav))


def test_fbank_short_input_gives_one_frame():
    fb = Fbank(num_mel_bins=40)
    assert fb(torch.zeros(100)).shape == (1, 40) and fb.num_frames(100) == 1


def test_from_file_mixes_to_mono_and_resamples(tmp_path):
    left, right = tone(8000, rate=8000, seed=1), tone(8000, rate=8000, seed=2)
    sf.write(tmp_path / "st.wav", torch.stack([left, right], 1).numpy(), 8000, subtype="FLOAT")
    fb = Fbank(num_mel_bins=40)
    expected = fb(AF.resample((left + right) / 2, 8000, 16000))
    torch.testing.assert_close(fb.from_file(tmp_path / "st.wav"), expected, atol=1e-4, rtol=1e-4)


def test_feature_config_rejects_unknown_keys():
    with pytest.raises(ValueError, match="unknown key"):
        FeatureConfig.from_dict({"num_mel_bins": 40, "bins": 3})


def _utts(tmp_path, n=3):
    utts = []
    for i in range(n):
        path = tmp_path / f"{i}.wav"
        sf.write(path, tone(4000 + 1000 * i, seed=i).numpy(), 16000, subtype="FLOAT")
        utts.append(Utterance(str(i), str(path), 0.25 + 0.0625 * i, "x"))
    return utts


def test_cmvn_stats_match_direct_computation_and_cache(tmp_path):
    utts = _utts(tmp_path)
    fb = Fbank(num_mel_bins=40, dither=1.0)  # dither must not enter the statistics
    allf = torch.cat([Fbank(num_mel_bins=40)(torch.from_numpy(sf.read(u.audio_filepath, dtype="float32")[0]))
                      for u in utts]).double()
    manifest = tmp_path / "train.jsonl"
    manifest.write_text("placeholder\n")
    cache = cmvn_cache_path(manifest, fb.config, [u.id for u in utts])
    assert cache.parent == tmp_path and not cache.exists()
    mean, std = compute_cmvn_stats(utts, fb, cache)
    torch.testing.assert_close(mean, allf.mean(0).float(), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(std, allf.std(0, unbiased=False).float(), atol=1e-4, rtol=1e-4)
    assert json.loads(cache.read_text())["frames"] == allf.shape[0]
    # a second call reads the cache (proved by a doctored cache file)
    doctored = json.loads(cache.read_text())
    doctored["mean"] = [0.5] * 40
    cache.write_text(json.dumps(doctored))
    assert torch.equal(compute_cmvn_stats(utts, fb, cache)[0], torch.full((40,), 0.5))
    # the key follows the manifest content and the feature config, but not dither
    assert cmvn_cache_path(manifest, FeatureConfig(num_mel_bins=40, dither=0.0), [u.id for u in utts]) == cache
    assert cmvn_cache_path(manifest, FeatureConfig(num_mel_bins=80), [u.id for u in utts]) != cache
    manifest.write_text("changed\n")
    assert cmvn_cache_path(manifest, fb.config, [u.id for u in utts]) != cache


def test_native_rate_probes_headers_and_caps_at_16k(tmp_path, caplog):
    from fastasr.data.audio import write_wav
    from fastasr.data.features import NATIVE_RATE_CAP, native_rate, with_native_rate

    def files(rate, n, tag):
        out = []
        for i in range(n):
            write_wav(tmp_path / f"{tag}{i}.wav", np.zeros(rate // 10, np.float32), rate)
            out.append(tmp_path / f"{tag}{i}.wav")
        return out

    eight, forty8 = files(8000, 5, "a"), files(48000, 2, "b")
    assert native_rate(eight) == 8000
    assert native_rate(forty8) == NATIVE_RATE_CAP == 16000  # 48 kHz is down-sampled, never kept
    with caplog.at_level(logging.WARNING):
        assert native_rate(eight + forty8) == 8000  # the most common rate wins, with a warning
    assert "mixes sample rates" in caplog.text
    (tmp_path / "bad.wav").write_bytes(b"RIFF junk")
    assert native_rate([tmp_path / "bad.wav"] + eight) == 8000  # unreadable files are passed over
    with pytest.raises(ValueError, match="no readable audio among the first files of train.jsonl"):
        native_rate([tmp_path / "bad.wav"], "train.jsonl")
    cfg = FeatureConfig(sample_rate=None)
    assert with_native_rate(cfg, eight, "x").sample_rate == 8000
    assert with_native_rate(FeatureConfig(sample_rate=22050), eight, "x").sample_rate == 22050  # set: kept
    with pytest.raises(ValueError, match="features.sample_rate is null"):
        Fbank(cfg)
