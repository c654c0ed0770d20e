"""The espeak-ng corpus: lexicon, voices, manifests, determinism, idempotency."""

from __future__ import annotations

import json
import re

import pytest
import soundfile as sf

from fastasr.corpora import sentences, speaking, synthetic
from fastasr.corpora.espeak import Espeak, normalize_phoneme
from fastasr.corpora.marker import MARKER
from fastasr.data.manifest import read_manifest


def test_lexicon_has_at_least_1000_plain_words():
    words = sentences.vocabulary()
    assert len(words) >= 1000
    assert all(re.fullmatch(r"[a-z]+", w) for w in words)
    lex = sentences.load_lexicon()
    assert {"det", "noun", "verb", "adj"} <= set(lex)


def test_voices_of_splits_are_disjoint():
    train, dev, test = (set(speaking.voices(s)) for s in speaking.SPLITS)
    assert not train & test and not train & dev and not dev & test
    assert len(train) >= 8 and len(test) >= 4
    # several accents and male/female variants everywhere
    for split in (train, dev, test):
        assert len({v.split("+")[0] for v in split}) >= 2


@pytest.mark.parametrize("raw, units", [
    ("ˈaɪ", ["aɪ"]), ("ˌtʃ", ["tʃ"]), ("ɜː", ["ɜː"]), ("ˈɑːɹ", ["ɑː", "ɹ"]), ("ɹ", ["ɹ"]),
    ("aɪə", ["aɪ", "ə"]), ("ˈ", []),
])
def test_normalize_phoneme(raw, units):
    assert normalize_phoneme(raw) == units


def test_espeak_phonemize_units():
    es = Espeak()
    words = es.phonemize("the judge chose thirty shoes", "en-us+m1")
    assert len(words) == 5
    assert words[1] == ["dʒ", "ʌ", "dʒ"]
    assert all("ˈ" not in u and "ˌ" not in u for w in words for u in w)


def test_tiny_corpus_manifests(tiny_corpus):
    counts = json.loads((tiny_corpus / MARKER).read_text())["counts"]
    speakers = {}
    for split in speaking.SPLITS:
        utts = read_manifest(tiny_corpus / f"{split}.jsonl", on_error="raise")
        assert len(utts) == counts[split]
        speakers[split] = {u.speaker for u in utts}
        assert speakers[split] <= set(speaking.voices(split))
        for u in utts:
            info = sf.info(u.audio_filepath)
            assert info.samplerate == 16000 and info.channels == 1 and info.subtype == "PCM_16"
            assert 1.0 <= u.duration <= 8.0
            assert abs(info.frames / 16000 - u.duration) < 1e-5
            assert "|" in u.phonemes or len(u.text.split()) == 1
            assert not re.search("[ˈˌ]", u.phonemes)
            assert len(u.phonemes.split("|")) >= 1
    assert not speakers["test"] & speakers["train"]
    rec = json.loads((tiny_corpus / "train.jsonl").read_text().splitlines()[0])
    assert rec["audio_filepath"].startswith("wav/train/")  # relative to the manifest


def test_deterministic_and_idempotent(tmp_path, capsys):
    counts = {"train": 3, "dev": 1, "test": 1}
    a, b = tmp_path / "a", tmp_path / "b"
    assert synthetic.build_corpus(a, seed=5, counts=counts, workers=1)
    assert synthetic.build_corpus(b, seed=5, counts=counts, workers=2)  # other worker count, same bytes
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    capsys.readouterr()
    mtime = (a / "train.jsonl").stat().st_mtime_ns
    assert synthetic.main(["--out", str(a), "--seed", "5", "--train", "3", "--dev", "1", "--test", "1"]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert (a / "train.jsonl").stat().st_mtime_ns == mtime
    # another seed rebuilds, and differs
    assert synthetic.build_corpus(a, seed=6, counts=counts, workers=1)
    assert "rebuilding" in capsys.readouterr().out
    assert (a / "train.jsonl").read_bytes() != (b / "train.jsonl").read_bytes()
