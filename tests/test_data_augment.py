"""Speed perturbation, noise mixing, determinism, train-only application, frame budget."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
import soundfile as sf
import torch
from lightning.fabric.utilities.data import _set_sampler_epoch

from fastasr.data.augment import (
    AugmentConfig,
    NoiseBank,
    WaveformAugment,
    mix_at_snr,
    noise_files,
    perturbed_num_samples,
    speed_perturb,
)
from fastasr.data.datamodule import ASRDataModule
from fastasr.data.feature_sources import AudioFeatures
from fastasr.data.features import Fbank

RATE = 16000


def sine(freq: float, seconds: float, rate: int = RATE) -> torch.Tensor:
    t = torch.arange(int(seconds * rate)) / rate
    return 0.5 * torch.sin(2 * math.pi * freq * t)


def peak_hz(wav: torch.Tensor, rate: int = RATE) -> float:
    spec = torch.fft.rfft(wav * torch.hann_window(wav.numel()))
    return int(spec.abs().argmax()) * rate / wav.numel()


def snr_db(speech: torch.Tensor, mixed: torch.Tensor) -> float:
    noise = (mixed - speech).double()
    return 10 * math.log10(float(speech.double().pow(2).mean() / noise.pow(2).mean()))


@pytest.fixture(scope="module")
def noise_dir(tmp_path_factory):
    """Synthesised noise: 0.7 s white noise at 16 kHz (shorter than most utterances, so it
    is looped) and 3 s brown-ish noise at 8 kHz (resampled)."""
    d = tmp_path_factory.mktemp("noise")
    g = np.random.default_rng(0)
    sf.write(d / "white.wav", (0.1 * g.standard_normal(int(0.7 * RATE))).astype(np.float32), RATE)
    brown = np.cumsum(g.standard_normal(3 * 8000)).astype(np.float32)
    (d / "sub").mkdir()
    sf.write(d / "sub" / "brown.flac", 0.5 * brown / np.abs(brown).max(), 8000)
    (d / "notes.txt").write_text("not audio")
    return d


@pytest.mark.parametrize("factor", [0.9, 1.0, 1.1])
def test_speed_perturbation_scales_duration_and_frequency(factor):
    wav = sine(1000.0, 3.0)
    out = speed_perturb(wav, factor)
    assert out.numel() == perturbed_num_samples(wav.numel(), factor) == math.ceil(wav.numel() / factor - 1e-9)
    assert abs(out.numel() / RATE - 3.0 / factor) < 1e-3
    assert peak_hz(out) == pytest.approx(1000.0 * factor, abs=1.0)  # pitch moves with the factor
    # frames follow: the fbank of the perturbed audio has ~1/factor the frames
    fb = Fbank({"num_mel_bins": 40})
    assert fb(out).shape[0] == fb.num_frames(perturbed_num_samples(wav.numel(), factor))


@pytest.mark.parametrize("n", [1, 399, 16000, 48001])
def test_perturbed_num_samples_is_exact(n):
    wav = torch.randn(n)
    for f in (0.9, 1.1, 0.95):
        assert speed_perturb(wav, f).numel() == perturbed_num_samples(n, f)


@pytest.mark.parametrize("snr", [-5.0, 0.0, 10.0, 30.0])
def test_mix_at_snr_hits_the_requested_snr(snr):
    g = torch.Generator().manual_seed(1)
    speech, noise = sine(300.0, 1.0), 0.3 * torch.randn(RATE, generator=g)
    assert snr_db(speech, mix_at_snr(speech, noise, snr)) == pytest.approx(snr, abs=0.01)
    assert torch.equal(mix_at_snr(torch.zeros(RATE), noise, snr), torch.zeros(RATE))  # silence stays silent


def test_noise_sets_from_directory_and_manifest(noise_dir, tmp_path, caplog):
    assert sorted(p.name for p in noise_files(noise_dir)) == ["brown.flac", "white.wav"]
    manifest = tmp_path / "noise.jsonl"
    manifest.write_text(json.dumps({"audio_filepath": str(noise_dir / "white.wav")}) + "\n"
                        + "{not json\n" + json.dumps({"duration": 1.0}) + "\n")
    with caplog.at_level(logging.WARNING):
        assert noise_files(manifest) == [noise_dir / "white.wav"]
    msgs = " ".join(r.getMessage() for r in caplog.records)
    assert f"{manifest} line 2" in msgs and "line 3: missing field 'audio_filepath'" in msgs
    assert noise_files(noise_dir / "white.wav") == [noise_dir / "white.wav"]
    (tmp_path / "noise.bin").write_bytes(b"\x80\x81 binary")
    with pytest.raises(ValueError, match="neither UTF-8 JSON lines nor an audio file"):
        noise_files(tmp_path / "noise.bin")
    with pytest.raises(ValueError, match="no such file or directory"):
        noise_files(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no audio file"):
        noise_files(tmp_path / "empty")
    bank = NoiseBank(noise_dir, RATE)
    g = torch.Generator().manual_seed(0)
    for n in (100, RATE, 5 * RATE):  # longer than either file: looped
        seg = bank.segment(n, g)
        assert seg.shape == (n,) and seg.dtype == torch.float32 and float(seg.pow(2).mean()) > 0


def test_augment_noise_snr_and_determinism(noise_dir):
    cfg = {"noise": str(noise_dir), "noise_prob": 1.0, "noise_snr_db": [7.5, 7.5]}
    aug = WaveformAugment(cfg, RATE, seed=3)
    speech = sine(440.0, 2.0)
    for utt in ("a", "b", "c"):
        assert snr_db(speech, aug(speech, utt)) == pytest.approx(7.5, abs=0.05)
    # SNR drawn within the range; noise_prob 0 leaves the audio alone
    ranged = WaveformAugment({**cfg, "noise_snr_db": [0.0, 20.0]}, RATE, seed=3)
    snrs = [snr_db(speech, ranged(speech, f"u{i}")) for i in range(8)]
    assert all(-0.05 < s < 20.05 for s in snrs) and max(snrs) - min(snrs) > 2.0
    assert torch.equal(WaveformAugment({**cfg, "noise_prob": 0.0}, RATE)(speech, "a"), speech)

    both = {"speed_perturb": True, **cfg, "noise_snr_db": [0.0, 20.0]}
    a1, a2, other = WaveformAugment(both, RATE, 5), WaveformAugment(both, RATE, 5), WaveformAugment(both, RATE, 6)
    ids = [f"utt{i}" for i in range(12)]
    run1 = [a1(speech, i) for i in ids]
    assert all(torch.equal(x, a2(speech, i)) for x, i in zip(run1, ids))  # same seed, epoch, id → same
    assert any(not torch.equal(x, other(speech, i)) for x, i in zip(run1, ids))  # another seed differs
    epoch0 = [a1.speed_factor(i) for i in ids]
    assert set(epoch0) == {0.9, 1.0, 1.1}  # uniform over the factors (12 draws)
    a1.set_epoch(1)
    assert [a1.speed_factor(i) for i in ids] != epoch0  # a new draw every epoch
    a1.set_epoch(0)
    assert [a1.speed_factor(i) for i in ids] == epoch0


def test_augment_config_errors():
    with pytest.raises(ValueError, match="unknown key"):
        AugmentConfig.from_dict({"speed": True})
    with pytest.raises(ValueError, match="speed_factors"):
        AugmentConfig(speed_factors=(0.9, 0.0))
    with pytest.raises(ValueError, match="noise_snr_db"):
        AugmentConfig(noise_snr_db=(20.0, 10.0))
    with pytest.raises(ValueError, match="noise_prob"):
        AugmentConfig(noise_prob=1.5)
    assert not AugmentConfig().enabled and AugmentConfig().factors == (1.0,)
    assert AugmentConfig(speed_perturb=True).factors == (0.9, 1.0, 1.1)


def make_dm(corpus, **kw):
    args = dict(train_manifest=str(corpus / "train.jsonl"), dev_manifest=str(corpus / "dev.jsonl"),
                test_manifest=str(corpus / "test.jsonl"), features={"num_mel_bins": 40, "dither": 0.0},
                max_frames_per_batch=2000, cmvn_stats={"mean": [0.0] * 40, "std": [1.0] * 40})
    args.update(kw)
    return ASRDataModule(**args)


def test_augmentation_is_train_only_and_within_the_frame_budget(tiny_corpus, noise_dir):
    augment = {"speed_perturb": True, "noise": str(noise_dir), "noise_prob": 1.0}
    dm = make_dm(tiny_corpus, augment=augment)
    dm.setup("fit")
    dm.setup("test")
    fb = Fbank({"num_mel_bins": 40})
    for split, loader in (("dev", dm.val_dataloader()), ("test", dm.test_dataloader())):
        assert dm.datasets[split].source.augment is None
        by_id = {u.id: u for u in dm.datasets[split].utterances}
        for batch in loader:  # dev/test features are the plain ones
            for b, utt_id in enumerate(batch["ids"]):
                n = int(batch["feature_lengths"][b])
                torch.testing.assert_close(batch["features"][b, :n], fb.from_file(by_id[utt_id].audio_filepath))
    train = dm.datasets["train"]
    assert isinstance(train.source, AudioFeatures) and train.source.augment is not None
    plain = [fb.config.frames_for_duration(u.duration) for u in train.utterances]
    priced = train.frame_lengths()  # priced at the slowest factor (0.9): ~1/0.9 the frames
    assert all(p >= math.floor(q / 0.9) - 1 for p, q in zip(priced, plain))
    factors = set()
    loader = dm.train_dataloader()
    for epoch in range(3):
        _set_sampler_epoch(loader, epoch)  # what Lightning does at every epoch start
        for batch in loader:
            B, T, _ = batch["features"].shape
            assert B * T <= 2000 or B == 1  # the budget holds for perturbed lengths
            for b, utt_id in enumerate(batch["ids"]):
                i = [u.id for u in train.utterances].index(utt_id)
                n = int(batch["feature_lengths"][b])
                assert n <= priced[i]
                factor = train.source.augment.speed_factor(utt_id)
                factors.add(factor)
                assert n == fb.num_frames(perturbed_num_samples(round(train.utterances[i].duration * RATE), factor))
    assert factors == {0.9, 1.0, 1.1}


@pytest.mark.timeout(120)
def test_epoch_reaches_persistent_workers(tiny_corpus):
    """Lightning's set_epoch in the main process changes the draws in worker processes."""
    dm = make_dm(tiny_corpus, dev_manifest=None, augment={"speed_perturb": True}, num_workers=2)
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.persistent_workers
    train = dm.datasets["train"]
    dur = {u.id: u.duration for u in train.utterances}
    fb = Fbank({"num_mel_bins": 40})
    seen = []
    for epoch in (0, 1, 0):
        _set_sampler_epoch(loader, epoch)
        got = {utt_id: int(n) for batch in loader for utt_id, n in zip(batch["ids"], batch["feature_lengths"])}
        expected = {i: fb.num_frames(perturbed_num_samples(round(dur[i] * RATE), train.source.augment.speed_factor(i)))
                    for i in got}
        assert got == expected
        seen.append(got)
    assert seen[0] != seen[1] and seen[0] == seen[2]
