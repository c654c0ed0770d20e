"""Feature cache: exact features, keys, stale caches, atomic builds, training without audio."""

from __future__ import annotations

import json
import logging
import math
import multiprocessing as mp
import os
import shutil
from dataclasses import replace

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.compliance.kaldi as kaldi
from lightning.fabric.utilities.data import _set_sampler_epoch

from fastasr.cli import features as features_command
from fastasr.data.augment import Variant, perturbed_num_samples
from fastasr.data.datamodule import ASRDataModule
from fastasr.data.feature_cache import (
    CacheConfig,
    FeatureCache,
    FeatureCacheError,
    build_feature_cache,
    cache_dir,
    cache_key,
    open_feature_cache,
)
from fastasr.data.feature_sources import AudioFeatures, CachedFeatures, ReadTimeDither
from fastasr.data.features import Fbank, FeatureConfig
from fastasr.data.manifest import Utterance, read_manifest

CFG = FeatureConfig(num_mel_bins=40, dither=1.0)


def build(corpus, split, root, **kw):
    utts = read_manifest(corpus / f"{split}.jsonl")
    cache = {"dir": str(root), "mode": "build", **kw}
    return utts, open_feature_cache(utts, corpus / f"{split}.jsonl", CFG, cache)


def test_cached_features_equal_on_the_fly(tiny_corpus, tmp_path):
    utts = read_manifest(tiny_corpus / "train.jsonl")
    key = cache_key(utts, CFG)
    directory = cache_dir(tmp_path, tiny_corpus / "train.jsonl", key)
    cache = build_feature_cache(utts, CFG, directory, key, frames_per_shard=1000)
    assert len(cache.shards) > 2  # sharded
    assert sorted(p.name for p in tmp_path.iterdir()) == [directory.name]  # no temporary left
    fb = Fbank(CFG)
    for u in utts:  # no dither in the cache: bit-identical to train=False features
        assert torch.equal(cache[u.id], fb.from_file(u.audio_filepath))
    assert cache.num_frames == sum(fb.from_file(u.audio_filepath).shape[0] for u in utts)
    # re-opened from disk (the DataLoader-worker path: pickled, memory maps re-opened lazily)
    again = FeatureCache(directory, key)
    import pickle

    clone = pickle.loads(pickle.dumps(again))
    assert torch.equal(clone[utts[3].id], cache[utts[3].id])
    half = open_feature_cache(utts, tiny_corpus / "train.jsonl", CFG, {"dir": str(tmp_path), "mode": "build",
                                                                      "dtype": "float16"})
    assert half.directory != directory and np.load(half.directory / half.shards[0]).dtype == np.float16
    torch.testing.assert_close(half[utts[0].id], cache[utts[0].id], atol=0.02, rtol=0.002)


def test_key_covers_settings_audio_and_manifest(tiny_corpus, tmp_path):
    utts = read_manifest(tiny_corpus / "dev.jsonl")
    key = cache_key(utts, CFG)
    assert key == cache_key(list(reversed(utts)), CFG)  # order-independent
    assert key == cache_key(utts, replace(CFG, dither=0.0))  # dither is not cached
    for other in (replace(CFG, num_mel_bins=80), replace(CFG, sample_rate=8000),
                  replace(CFG, frame_length_ms=20.0), replace(CFG, frame_shift_ms=5.0)):
        assert cache_key(utts, other) != key
    assert cache_key(utts, CFG, Variant(speed=0.9)) != key and cache_key(utts, CFG, dtype="float16") != key
    assert cache_key(utts[:1], CFG) != key  # another manifest
    # the audio changes (a copy re-written: new mtime)
    wav = tmp_path / "a.wav"
    shutil.copy(utts[0].audio_filepath, wav)
    moved = [replace(utts[0], audio_filepath=str(wav)), utts[1]]
    before = cache_key(moved, CFG)
    st = os.stat(wav)
    os.utime(wav, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert cache_key(moved, CFG) != before


def test_stale_cache_is_never_used(tiny_corpus, tmp_path, caplog):
    utts, built = build(tiny_corpus, "dev", tmp_path)
    auto = {"dir": str(tmp_path), "mode": "auto"}
    assert open_feature_cache(utts, tiny_corpus / "dev.jsonl", CFG, auto).directory == built.directory
    with caplog.at_level(logging.INFO, logger="fastasr.data.feature_cache"):
        assert open_feature_cache(utts, tiny_corpus / "dev.jsonl", replace(CFG, num_mel_bins=80), auto) is None
    msgs = " ".join(r.getMessage() for r in caplog.records)
    assert built.directory.name in msgs and "not used" in msgs and "computed on the fly" in msgs
    # a cache directory whose index was built for another key: a clear error
    with pytest.raises(FeatureCacheError, match="built for key"):
        FeatureCache(built.directory, "0" * 64)
    (built.directory / built.shards[0]).unlink()
    with pytest.raises(FeatureCacheError, match="missing"):
        FeatureCache(built.directory)
    assert open_feature_cache(utts, tiny_corpus / "dev.jsonl", CFG, {"mode": "off"}) is None
    with pytest.raises(ValueError, match="needs data.cache.dir"):
        CacheConfig(mode="auto")
    with pytest.raises(ValueError, match="mode 'sometimes'"):
        CacheConfig(dir="x", mode="sometimes")


def test_unreadable_audio_is_skipped_and_named(tiny_corpus, tmp_path, caplog):
    utts = read_manifest(tiny_corpus / "dev.jsonl")
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF....not a wav")
    utts = utts + [Utterance("broken", str(bad), 1.0, "x"), replace(utts[0], text="duplicate")]
    key = cache_key(utts, CFG)
    with caplog.at_level(logging.WARNING):
        cache = build_feature_cache(utts, CFG, tmp_path / "c", key)
    assert len(cache) == 2 and "broken" in cache.skipped
    assert any("broken" in r.getMessage() and "skipped" in r.getMessage() for r in caplog.records)
    assert any("more than once" in r.getMessage() for r in caplog.records)
    with pytest.raises(FeatureCacheError, match="'broken'.*bad.wav"):
        cache["broken"]


def _build_in_process(args):
    utts, directory, key = args
    return str(build_feature_cache(utts, CFG, directory, key).directory)


@pytest.mark.timeout(120)
def test_concurrent_builds_publish_one_cache(tiny_corpus, tmp_path):
    utts = read_manifest(tiny_corpus / "dev.jsonl")
    key = cache_key(utts, CFG)
    directory = tmp_path / "cache"
    with mp.get_context("spawn").Pool(2) as pool:
        got = pool.map(_build_in_process, [(utts, directory, key)] * 2)
    assert got == [str(directory)] * 2
    assert [p.name for p in tmp_path.iterdir()] == ["cache"]  # the losing copy was removed
    # building again over a published cache keeps it
    index = (directory / "index.json").stat().st_mtime_ns
    build_feature_cache(utts, CFG, directory, key)
    assert (directory / "index.json").stat().st_mtime_ns == index and len(list(tmp_path.iterdir())) == 1


def test_read_time_dither_matches_kaldi_dither_on_average():
    """Power-domain dither on cached features ≈ on-the-fly dither: same mean log energy per bin
    on a quiet tone, low noise and digital silence (where it matters)."""
    torch.manual_seed(0)
    t = torch.arange(32000) / 16000
    wav = torch.zeros(32000)
    wav[:16000] = 2e-4 * torch.sin(2 * math.pi * 440 * t[:16000])  # ~6 int16 units
    wav[16000:24000] = 3e-5 * torch.randn(8000)  # ~1 int16 unit
    fb = Fbank(CFG)
    clean = fb(wav)
    on_the_fly = torch.stack([fb(wav, train=True) for _ in range(40)]).mean(0)
    dither = ReadTimeDither(CFG)
    read_time = torch.stack([dither(clean) for _ in range(40)]).mean(0)
    for frames in (slice(0, 95), slice(101, 145), slice(151, 198)):
        assert (on_the_fly[frames].mean(0) - read_time[frames].mean(0)).abs().max() < 0.3
    assert clean[151:198].mean() < -15 and read_time[151:198].mean() > 0  # silence gets the floor


def make_dm(corpus, root, **kw):
    args = dict(train_manifest=str(corpus / "train.jsonl"), dev_manifest=str(corpus / "dev.jsonl"),
                features={"num_mel_bins": 40, "dither": 1.0}, max_frames_per_batch=2000,
                cache={"dir": str(root), "mode": "build"})
    args.update(kw)
    return ASRDataModule(**args)


@pytest.fixture
def no_audio(monkeypatch):
    """After this, reading any audio file raises (in this process and forked workers)."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"audio was read: {args[:1]}")

    def arm():
        monkeypatch.setattr(sf, "read", refuse)  # decoding; headers (sf.info) stay readable

    return arm


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.timeout(120)
def test_cached_epoch_reads_no_audio(tiny_corpus, tmp_path, no_audio, monkeypatch, workers):
    dm = make_dm(tiny_corpus, tmp_path, num_workers=workers)
    dm.setup("fit")  # builds the caches (and CMVN statistics) from the audio
    assert isinstance(dm.datasets["train"].source, CachedFeatures)
    no_audio()
    dm2 = make_dm(tiny_corpus, tmp_path, num_workers=workers, cache={"dir": str(tmp_path), "mode": "auto"})
    dm2.setup("fit")  # finds the caches; no audio read
    ids = []
    loader = dm2.train_dataloader()
    _set_sampler_epoch(loader, 0)
    fbank_calls = []
    real_fbank = kaldi.fbank
    monkeypatch.setattr(kaldi, "fbank", lambda *a, **k: fbank_calls.append(1) or real_fbank(*a, **k))
    for batch in loader:
        assert torch.isfinite(batch["features"]).all()
        ids += batch["ids"]
    assert sorted(ids) == sorted(u.id for u in dm2.datasets["train"].utterances)
    if workers == 0:  # no filterbank computed but the dither table's, once per process
        assert len(fbank_calls) == 1
    assert sum(len(b["ids"]) for b in dm2.val_dataloader()) == len(dm2.datasets["dev"])
    with pytest.raises(AssertionError, match="audio was read"):  # the patch bites where audio is read
        AudioFeatures(Fbank(CFG))(dm2.datasets["dev"].utterances[0])


def test_speed_perturbation_reads_per_factor_caches(tiny_corpus, tmp_path, no_audio):
    dm = make_dm(tiny_corpus, tmp_path, augment={"speed_perturb": True}, features={"num_mel_bins": 40, "dither": 0.0})
    dm.setup("fit")
    source = dm.datasets["train"].source
    assert isinstance(source, CachedFeatures) and sorted(v.speed for v in source.caches) == [0.9, 1.0, 1.1]
    assert len({c.directory for c in source.caches.values()}) == 3
    no_audio()
    train = dm.datasets["train"]
    for u in train.utterances:
        factor = source.augment.speed_factor(u.id)
        feats = train[train.utterances.index(u)]["features"]
        assert torch.equal(feats, source.caches[source.variant(u)][u.id])
        assert feats.shape[0] == Fbank(CFG).num_frames(perturbed_num_samples(round(u.duration * 16000), factor))
    dev = dm.datasets["dev"]
    assert list(dev.source.caches) == [Variant()] and dev.source.augment is None


def test_noise_bypasses_the_training_cache(tiny_corpus, tmp_path, caplog):
    noise = tmp_path / "noise.wav"
    sf.write(noise, (0.1 * np.random.default_rng(0).standard_normal(16000)).astype(np.float32), 16000)
    with caplog.at_level(logging.INFO):
        dm = make_dm(tiny_corpus, tmp_path / "cache", augment={"noise": str(noise)})
        dm.setup("fit")
    assert isinstance(dm.datasets["train"].source, AudioFeatures)
    assert isinstance(dm.datasets["dev"].source, CachedFeatures)
    assert any("computed on the fly" in r.getMessage() and "noise" in r.getMessage() for r in caplog.records)


def test_command_line_builds_the_config_caches(tiny_corpus, tmp_path, capsys):
    args = [f"data.train_manifest={tiny_corpus / 'train.jsonl'}", f"data.dev_manifest={tiny_corpus / 'dev.jsonl'}",
            f"data.test_manifest={tiny_corpus / 'test.jsonl'}", f"data.cache.dir={tmp_path}",
            "data.num_workers=0", "data.augment.speed_perturb=true"]
    features_command.main(args)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 5  # train × 3 speed factors, dev, test
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 5 and sum("_sp0.9-" in n or "_sp1.1-" in n for n in names) == 2
    stamps = {n: (tmp_path / n / "index.json").stat().st_mtime_ns for n in names}
    features_command.main(args)  # a second run finds them all and rebuilds nothing
    assert {n: (tmp_path / n / "index.json").stat().st_mtime_ns for n in names} == stamps
    index = json.loads((tmp_path / names[0] / "index.json").read_text())
    assert index["settings"]["features"]["num_mel_bins"] == 40 and "dither" not in index["settings"]["features"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_feature_cache_bench_runs_on_the_tiny_corpus(tiny_corpus, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "benchmarks.pipeline.feature_cache", "--out-dir", str(tmp_path / "out"),
           f"data.train_manifest={tiny_corpus / 'train.jsonl'}", f"data.dev_manifest={tiny_corpus / 'dev.jsonl'}",
           f"data.test_manifest={tiny_corpus / 'test.jsonl'}", f"data.cache.dir={tmp_path / 'cache'}",
           "data.num_workers=0"]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=170, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = (tmp_path / "out").glob("feature_cache_*.json")
    data = json.loads(result.read_text())
    fly, cached = data["epochs"]["on_the_fly"][0], data["epochs"]["cached"][0]
    assert fly["utterances"] == cached["utterances"] == 10 and fly["frames"] == cached["frames"]
    assert data["ratio_first_epoch"] == pytest.approx(fly["seconds"] / cached["seconds"])
    assert (tmp_path / "out" / result.name.replace(".json", ".md")).is_file()
