"""Audio that is only found bad when it is loaded (inside DataLoader workers) is skipped, counted
and reported; a corpus with nothing usable stops with a clear error."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from torch.utils.data import DataLoader

from fastasr.data.audio import BadAudioError, load_audio
from fastasr.data.bad_audio import AllAudioBadError
from fastasr.data.dataset import ASRDataset, collate
from fastasr.data.features import Fbank, compute_cmvn_stats
from fastasr.data.manifest import Utterance, read_manifest

RATE = 16000


def tone(seconds: float = 1.0, seed: int = 0) -> np.ndarray:
    g = np.random.default_rng(seed)
    return (0.1 * g.standard_normal(int(seconds * RATE))).astype(np.float32)


def make_bad_files(d: Path, source: np.ndarray | None = None) -> dict[str, tuple[Path, float, str]]:
    """Files that pass the manifest's header check but fail when decoded:
    name -> (path, manifest duration, expected reason)."""
    d.mkdir(parents=True, exist_ok=True)
    x = tone(2.0) if source is None else source
    seconds = len(x) / RATE
    sf.write(d / "whole.wav", x, RATE, subtype="PCM_16")
    wav = (d / "whole.wav").read_bytes()
    (d / "truncated.wav").write_bytes(wav[: len(wav) // 3])
    sf.write(d / "whole.flac", x, RATE)
    flac = (d / "whole.flac").read_bytes()
    (d / "truncated.flac").write_bytes(flac[: len(flac) // 3])
    y = x.copy()
    y[100:150] = np.nan
    sf.write(d / "nan.wav", y, RATE, subtype="FLOAT")
    sf.write(d / "stereo.wav", np.stack([x, x], 1), RATE, subtype="PCM_16")
    return {
        "truncated.wav": (d / "truncated.wav", seconds, "truncated"),
        "truncated.flac": (d / "truncated.flac", seconds, "unreadable"),
        "nan.wav": (d / "nan.wav", seconds, "50 NaN or infinite"),
        "stereo.wav": (d / "stereo.wav", seconds, "2 channels; expected 1"),
    }


def test_load_audio_names_each_kind_of_bad_file(tmp_path):
    bad = make_bad_files(tmp_path)
    sf.write(tmp_path / "empty.wav", np.zeros(0, np.float32), RATE)
    (tmp_path / "garbage.wav").write_bytes(b"RIFF" + bytes(range(256)) * 8)
    bad["empty.wav"] = (tmp_path / "empty.wav", 1.0, "0 samples")
    bad["garbage.wav"] = (tmp_path / "garbage.wav", 1.0, "unreadable")
    for name, (path, seconds, reason) in bad.items():
        with pytest.raises(BadAudioError, match=reason) as err:
            load_audio(path, RATE, channels=1, expected_seconds=seconds)
        assert err.value.path == str(path) and str(path) in str(err.value), name
    whole = load_audio(tmp_path / "whole.wav", RATE, channels=1, expected_seconds=2.0)
    assert whole.shape == (2 * RATE,)
    # channels=None (the Python default) mixes any channel count down
    assert load_audio(bad["stereo.wav"][0], RATE).shape == (2 * RATE,)
    # a small shortfall (rounded manifest durations) is not truncation
    assert load_audio(tmp_path / "whole.wav", expected_seconds=2.05).shape == (2 * RATE,)


def dataset(utts: list[Utterance]) -> ASRDataset:
    return ASRDataset(utts, [[1, 2]] * len(utts), ["a b"] * len(utts), Fbank(num_mel_bins=40, channels=1))


def test_dataset_skips_bad_items_and_the_batch_carries_them_from_the_workers(tmp_path):
    bad = make_bad_files(tmp_path)
    utts = [Utterance("good", str(tmp_path / "whole.wav"), 2.0, "a b")]
    utts += [Utterance(name, str(path), seconds, "a b") for name, (path, seconds, _) in bad.items()]
    ds = dataset(utts)
    batch = collate([ds[i] for i in range(len(ds))])
    assert batch["ids"] == ["good"] and batch["features"].shape[0] == 1
    assert [s.id for s in batch["skipped"]] == list(bad)
    for s in batch["skipped"]:
        assert s.path == str(bad[s.id][0]) and bad[s.id][2] in s.reason
    # every item bad: an empty batch that still names them
    empty = collate([ds[i] for i in range(1, len(ds))])
    assert empty["ids"] == [] and empty["features"].shape[0] == 0 and len(empty["skipped"]) == 4
    # workers are separate processes: the records come back inside the batches
    loader = DataLoader(ds, batch_size=2, collate_fn=collate, num_workers=2)
    got = [s.id for b in loader for s in b["skipped"]]
    assert sorted(got) == sorted(bad)


def test_a_feature_cache_skips_the_same_files_as_loading_the_audio(tmp_path, caplog):
    """The cache builder finds bad audio by the dataset's own checks; a dataset reading the
    cache skips and reports those utterances as one reading the audio does."""
    from fastasr.data.feature_cache import build_feature_cache, cache_key
    from fastasr.data.feature_sources import AudioFeatures, CachedFeatures

    bad = make_bad_files(tmp_path)
    utts = [Utterance("good", str(tmp_path / "whole.wav"), 2.0, "a b")]
    utts += [Utterance(name, str(path), seconds, "a b") for name, (path, seconds, _) in bad.items()]
    fbank = Fbank(num_mel_bins=40, channels=1)
    with caplog.at_level(logging.WARNING):
        cache = build_feature_cache(utts, fbank.config, tmp_path / "cache", cache_key(utts, fbank.config),
                                    num_workers=2)
    assert sorted(cache.skipped) == sorted(bad) and list(cache.entries) == ["good"]
    assert all(f"feature cache: {name}" in caplog.text for name in bad)

    def skipped_by(source):
        ds = ASRDataset(utts, [[1, 2]] * len(utts), ["a b"] * len(utts), fbank, source=source)
        loader = DataLoader(ds, batch_size=len(utts), collate_fn=collate, num_workers=2)
        (batch,) = list(loader)
        assert batch["ids"] == ["good"]
        return {s.id: s for s in batch["skipped"]}

    from_audio, from_cache = skipped_by(AudioFeatures(fbank)), skipped_by(CachedFeatures({1.0: cache}, fbank.config))
    assert sorted(from_cache) == sorted(from_audio) == sorted(bad)
    for name, (path, _, reason) in bad.items():
        assert from_cache[name].path == from_audio[name].path == str(path)
        assert reason in from_audio[name].reason
        assert from_cache[name].reason.startswith(from_audio[name].reason) and "feature cache" in from_cache[name].reason


def test_cmvn_statistics_skip_bad_files_and_stop_when_all_are_bad(tmp_path, caplog):
    bad = make_bad_files(tmp_path)
    good = Utterance("good", str(tmp_path / "whole.wav"), 2.0, "a b")
    bad_utts = [Utterance(name, str(path), seconds, "a b") for name, (path, seconds, _) in bad.items()]
    fb = Fbank(num_mel_bins=40, channels=1)
    with caplog.at_level(logging.WARNING):
        mean, std = compute_cmvn_stats([good, *bad_utts], fb)
    torch.testing.assert_close((mean, std), compute_cmvn_stats([good], fb))
    assert "skipped 4 of 5 utterances" in caplog.text and all(name in caplog.text for name in bad)
    with pytest.raises(AllAudioBadError, match=r"all 4 utterance\(s\) have unusable audio") as err:
        compute_cmvn_stats(bad_utts, fb)
    assert all(str(path) in str(err.value) for path, _, _ in bad.values())


# ----------------------------------------------------------------------------- in training
def bad_corpus(tiny_corpus: Path, out: Path, n_bad: int | None = None, bad_dev: bool = True) -> Path:
    """A copy of the tiny corpus's manifests whose first ``n_bad`` training files (all: None)
    are replaced by files that pass the manifest check but fail when decoded (truncated wav,
    truncated flac, NaN samples, stereo, in turn); with ``bad_dev`` the first dev file too."""
    out.mkdir(parents=True, exist_ok=True)
    train = read_manifest(tiny_corpus / "train.jsonl")
    n_bad = len(train) if n_bad is None else n_bad
    kinds = ["truncated.wav", "truncated.flac", "nan.wav", "stereo.wav"]
    lines = []
    for i, utt in enumerate(train):
        path = utt.audio_filepath
        if i < n_bad:
            x, _ = sf.read(utt.audio_filepath, dtype="float32")
            files = make_bad_files(out / f"bad{i}", x)
            path = str(files[kinds[i % len(kinds)]][0])
        lines.append({"id": utt.id, "audio_filepath": path, "duration": utt.duration, "text": utt.text,
                      "phonemes": utt.phonemes})
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    dev = []
    for i, utt in enumerate(read_manifest(tiny_corpus / "dev.jsonl")):
        path = utt.audio_filepath
        if i == 0 and bad_dev:
            path = str(make_bad_files(out / "devbad", sf.read(path, dtype="float32")[0])["nan.wav"][0])
        dev.append({"id": utt.id, "audio_filepath": path, "duration": utt.duration, "text": utt.text,
                    "phonemes": utt.phonemes})
    (out / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dev))
    (out / "test.jsonl").write_text("".join(json.dumps({**u.__dict__}) + "\n"
                                            for u in read_manifest(tiny_corpus / "test.jsonl")))
    return out


def test_training_skips_bad_audio_and_reports_every_file(tiny_corpus, tmp_path, caplog):
    from test_train_eval import compose_train

    from fastasr.training.fit import train

    corpus = bad_corpus(tiny_corpus, tmp_path / "corpus", n_bad=4)
    with caplog.at_level(logging.WARNING):
        # one utterance a batch: the four bad ones leave empty batches, which change nothing
        result = train(compose_train(corpus, tmp_path, "name=bad", "trainer.max_epochs=1", "test=false",
                                     "data.max_batch_size=1", "data.num_workers=2"))
    run_dir = Path(result.run_dir)
    report = json.loads((run_dir / "bad_audio.json").read_text())["skipped"]
    train_ids = [u.id for u in read_manifest(tiny_corpus / "train.jsonl")][:4]
    dev_id = read_manifest(tiny_corpus / "dev.jsonl")[0].id
    assert sorted(r["id"] for r in report) == sorted([*train_ids, dev_id])
    reasons = {r["id"]: r["reason"] for r in report}
    assert "truncated" in reasons[train_ids[0]] and "unreadable" in reasons[train_ids[1]]
    assert "NaN" in reasons[train_ids[2]] and "2 channels" in reasons[train_ids[3]] and "NaN" in reasons[dev_id]
    # one summary naming every file, after the per-file warnings; the epoch ran to its end
    assert "5 utterance(s) skipped for unusable audio" in caplog.text
    summary = caplog.text[caplog.text.index("5 utterance(s) skipped"):]
    assert all(r["path"] in summary for r in report)
    done = json.loads((run_dir / "fit_done.json").read_text())
    assert done["epochs"] == 1 and done["global_step"] == 10  # 10 batches, 4 of them empty
    assert result.val["val/per"] == result.val["val/per"]  # scored on the usable dev utterance

    # evaluate.py's decoding skips it as well, and names it in the result and the log
    from fastasr.recognition.loading import load_recogniser
    from fastasr.recognition.scoring import decode_manifest

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        decoded = decode_manifest(load_recogniser(result.last_ckpt), corpus / "dev.jsonl", accelerator="cpu",
                                  max_batch_size=1)
    assert decoded.utterances == 1 and decoded.skipped_utterances == 1
    # training read the cache that data=manifest builds, whose builder found the file; decoding reads the audio
    cached_reason, found_by = reasons[dev_id].split(" (found when the feature cache ")
    assert found_by.endswith(" was built)")
    assert decoded.skipped_audio == [{"id": dev_id, "path": reasons_path(report, dev_id), "reason": cached_reason}]
    assert "1 of 2 utterance(s) skipped for unusable audio" in caplog.text and dev_id in caplog.text


def reasons_path(report: list[dict], utt_id: str) -> str:
    return next(r["path"] for r in report if r["id"] == utt_id)


def test_a_corpus_with_no_usable_audio_stops_with_a_clear_error(tiny_corpus, tmp_path):
    from test_train_eval import compose_train

    from fastasr.training.fit import train

    corpus = bad_corpus(tiny_corpus, tmp_path / "corpus")
    with pytest.raises(AllAudioBadError, match=r"all 10 utterance\(s\) have unusable audio"):
        train(compose_train(corpus, tmp_path, "name=allbad", "trainer.max_epochs=1"))


def test_on_bad_utterance_raise_stops_at_the_first_bad_file(tiny_corpus, tmp_path):
    from test_train_eval import compose_train

    from fastasr.training.fit import train

    corpus = bad_corpus(tiny_corpus, tmp_path / "corpus", n_bad=1)
    cfg = compose_train(corpus, tmp_path, "name=raise", "trainer.max_epochs=1", "data.on_bad_utterance=raise")
    with pytest.raises(BadAudioError, match="truncated.*on_bad_utterance=raise"):
        train(cfg)  # in the CMVN pass over the training set, before training
    # statistics given: the first training batch holding the file stops the run
    cfg.data.cmvn_stats = {"mean": [0.0] * 40, "std": [1.0] * 40}
    cfg.name = "raise2"
    with pytest.raises(BadAudioError, match="truncated.*on_bad_utterance=raise"):
        train(cfg)
