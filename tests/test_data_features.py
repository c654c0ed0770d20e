"""Filterbanks vs torchaudio's Kaldi reference, CMVN, SpecAugment."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.compliance.kaldi as kaldi
import torchaudio.functional as AF

from fastasr.data.features import (
    Fbank,
    FeatureConfig,
    GlobalCMVN,
    SpecAugment,
    cmvn_cache_path,
    compute_cmvn_stats,
)
from fastasr.data.manifest import Utterance


def tone(n, rate=16000, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n) / rate
    return 0.3 * torch.sin(2 * torch.pi * 440 * t) + 0.05 * torch.randn(n, generator=g)


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


def test_global_cmvn_normalises_and_is_saved():
    mean, std = torch.randn(4), torch.rand(4) + 0.5
    cmvn = GlobalCMVN(mean=mean, std=std)
    x = torch.randn(2, 5, 4)
    y = cmvn(x, torch.tensor([5, 3]))
    torch.testing.assert_close(y[0], (x[0] - mean) / std)
    assert torch.all(y[1, 3:] == 0)
    state = cmvn.state_dict()
    assert set(state) == {"mean", "std"}
    other = GlobalCMVN(4)
    other.load_state_dict(state)
    torch.testing.assert_close(other.mean, mean)
    with pytest.raises(ValueError, match="expected 8"):
        GlobalCMVN(8, mean=mean, std=std)


def test_spec_augment_eval_is_identity():
    sa = SpecAugment().eval()
    x = torch.randn(2, 50, 40)
    assert sa(x, torch.tensor([50, 30])) is x


def test_spec_augment_time_masks_stay_inside_valid_frames():
    torch.manual_seed(0)
    sa = SpecAugment(freq_masks=0, time_masks=2, time_width=10, max_time_ratio=0.5).train()
    lengths = torch.tensor([100, 40, 7, 1])
    x = torch.full((4, 100, 8), 7.0)
    masked_any = False
    for _ in range(50):
        y = sa(x, lengths)
        for b, length in enumerate(lengths.tolist()):
            assert torch.all(y[b, length:] == 7.0), "a time mask touched padding"
            hit = (y[b, :length] == 0).all(-1)
            assert int(hit.sum()) <= 2 * min(10, int(0.5 * length))
            masked_any |= bool(hit.any())
    assert masked_any
    assert torch.all(x == 7.0), "input modified in place"


def test_spec_augment_freq_masks_per_utterance():
    torch.manual_seed(1)
    sa = SpecAugment(freq_masks=2, freq_width=5, time_masks=0).train()
    y = sa(torch.ones(16, 20, 40), torch.full((16,), 20))
    bands = (y == 0).all(1)  # (B, F): fully masked bins
    assert torch.all(bands.sum(1) <= 2 * 4)
    assert bands.any()
    assert len({tuple(b.tolist()) for b in bands}) > 1, "masks should differ between utterances"
    assert torch.all((y == 0) | (y == 1))


def test_spec_augment_keeps_gradients():
    sa = SpecAugment(freq_width=5, time_width=5).train()
    x = torch.randn(2, 30, 10, requires_grad=True)
    sa(x, torch.tensor([30, 20])).sum().backward()
    assert x.grad is not None and np.isfinite(x.grad.numpy()).all()
