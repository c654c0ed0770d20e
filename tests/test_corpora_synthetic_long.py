"""The long-utterance corpus (``--min-seconds/--max-seconds``, ``data=synthetic_long``): durations,
speaker split, phonemes, determinism, idempotency, and the short corpus left as it was."""

from __future__ import annotations

import json
import re

import pytest
import soundfile as sf
from hydra import compose, initialize_config_dir

from fastasr.config import CONFIG_DIR
from fastasr.corpora import speaking, synthetic, synthetic_long
from fastasr.corpora.espeak import Espeak
from fastasr.corpora.marker import MARKER
from fastasr.data.manifest import read_manifest

LONG_COUNTS = {"train": 3, "dev": 1, "test": 1}


@pytest.fixture(scope="module")
def long_corpus(tmp_path_factory):
    """A tiny long corpus at the make data-long bounds (10-40 s)."""
    out = tmp_path_factory.mktemp("long_corpus")
    assert synthetic.build_corpus(out, seed=0, counts=LONG_COUNTS, workers=1, durations=(10, 40))
    return out


def test_durations_speakers_and_phonemes(long_corpus):
    marker = json.loads((long_corpus / MARKER).read_text())
    assert marker["durations"] == [10.0, 40.0] and marker["counts"] == LONG_COUNTS
    es = Espeak()
    speakers = {}
    for split in speaking.SPLITS:
        records = [json.loads(line) for line in (long_corpus / f"{split}.jsonl").read_text().splitlines()]
        utts = read_manifest(long_corpus / f"{split}.jsonl", on_error="raise")
        assert len(utts) == len(records) == LONG_COUNTS[split]
        speakers[split] = {u.speaker for u in utts}
        assert speakers[split] <= set(speaking.voices(split))
        for u, rec in zip(utts, records, strict=True):
            info = sf.info(u.audio_filepath)
            assert info.samplerate == 16000 and info.channels == 1 and info.subtype == "PCM_16"
            assert 10.0 <= u.duration <= 40.0
            assert abs(info.frames / 16000 - u.duration) < 1e-5
            # several sentences of one voice; the phonemes are each sentence's, joined by a word boundary
            counts = rec["sentence_words"]
            assert len(counts) >= 2 and sum(counts) == len(u.text.split())
            words, sentences = u.text.split(), []
            for n in counts:
                sentences.append(" ".join(words[:n]))
                words = words[n:]
            expected = " | ".join(speaking.phonemes_of(es, s, u.speaker) for s in sentences)
            assert u.phonemes == expected and len(u.phonemes.split(" | ")) == len(u.text.split())
            assert not re.search("[ˈˌ]", u.phonemes) and "|  |" not in u.phonemes
    assert not speakers["train"] & speakers["dev"] and not speakers["train"] & speakers["test"]
    assert not speakers["dev"] & speakers["test"]


@pytest.mark.slow  # two builds, one with a 2-process pool
def test_deterministic_and_idempotent(tmp_path, capsys):
    """Same bytes whatever the worker count; a second run with the same arguments does nothing;
    other bounds rebuild."""
    counts = {"train": 2, "dev": 1, "test": 1}
    a, b = tmp_path / "a", tmp_path / "b"
    assert synthetic.build_corpus(a, seed=3, counts=counts, workers=1, durations=(4, 9))
    assert synthetic.build_corpus(b, seed=3, counts=counts, workers=2, durations=(4, 9))
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    for rec in map(json.loads, (a / "train.jsonl").read_text().splitlines()):
        assert 4.0 <= rec["duration"] <= 9.0
    capsys.readouterr()
    mtime = (a / "train.jsonl").stat().st_mtime_ns
    args = ["--out", str(a), "--seed", "3", "--train", "2", "--dev", "1", "--test", "1",
            "--min-seconds", "4", "--max-seconds", "9"]
    assert synthetic.main(args) == 0
    assert "long synthetic corpus" in (out := capsys.readouterr().out) and "nothing to do" in out
    assert (a / "train.jsonl").stat().st_mtime_ns == mtime
    # the short corpus of the same seed is another corpus: rebuilt, not taken as complete
    assert synthetic.build_corpus(a, seed=3, counts=counts, workers=1)
    assert "rebuilding" in capsys.readouterr().out
    assert "sentence_words" not in (a / "train.jsonl").read_text()


def test_short_corpus_settings_unchanged():
    """The 1-8 s corpus's marker holds no duration keys, so corpora built before the long option
    are still complete (its audio is byte-identical too: test_corpora_synthetic)."""
    settings = synthetic._settings(0, {"train": 1, "dev": 1, "test": 1})
    assert set(settings) == {"generator_version", "seed", "counts", "voices", "sample_rate"}
    long = synthetic._settings(0, {"train": 1, "dev": 1, "test": 1}, (10, 40))
    assert long["durations"] == [10.0, 40.0]
    assert long["long_generator_version"] == synthetic_long.LONG_GENERATOR_VERSION


@pytest.mark.parametrize("args, message", [
    (["--min-seconds", "10"], "go together"),
    (["--min-seconds", "20", "--max-seconds", "10"], "expected 0 < min < max"),
    (["--min-seconds", "10", "--max-seconds", "11"], "at least"),
])
def test_cli_refuses_bad_bounds(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit):
        synthetic.main(["--out", str(tmp_path / "c"), *args])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_target_durations_average_about_twenty_seconds():
    import numpy as np

    rng = np.random.default_rng(0)
    targets = [synthetic_long.target_seconds(rng, 10, 40) for _ in range(4000)]
    assert 10 <= min(targets) and max(targets) <= 40
    assert 19 < sum(targets) / len(targets) < 21


def test_data_config():
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["data=synthetic_long"])
    assert cfg.data.train_manifest.endswith("data/synthetic_long/train.jsonl")
    assert cfg.data.dev_manifest.endswith("data/synthetic_long/dev.jsonl")
    assert cfg.data.tokenizer == "phoneme" and cfg.data.max_duration == 45.0
    assert cfg.scheduler._target_.endswith("ReduceLROnPlateau")  # the built-in recipe, not real_speech's
