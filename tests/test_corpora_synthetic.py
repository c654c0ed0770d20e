"""The espeak-ng corpus: lexicon, voices, manifests, determinism, idempotency."""

from __future__ import annotations

import json
import multiprocessing as mp
import re

import pytest
import soundfile as sf

from fastasr.corpora import sentences, speaking, synthetic
from fastasr.corpora.espeak import Espeak, normalize_phoneme
from fastasr.corpora.marker import MARKER
from fastasr.data.lexicon import lexicon_from_manifests
from fastasr.data.manifest import read_manifest, write_manifest


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


@pytest.mark.parametrize("spoken, alone, words", [
    ([["w", "ɪ", "ð", "ð", "ə"], ["m", "æ"]], [["w", "ɪ", "ð"], ["ð", "ə"], ["m", "æ"]],
     [["w", "ɪ", "ð"], ["ð", "ə"], ["m", "æ"]]),
    ([["ə", "v", "ə"]], [["ʌ", "v"], ["eɪ"]], [["ə", "v"], ["ə"]]),  # the spoken units, not the words' own
    ([["f", "ɚ", "ɹ", "ə"], ["b", "ɑː"]], [["f", "ɔː", "ɹ"], ["eɪ"], ["b", "ɑː"]], [["f", "ɚ", "ɹ"], ["ə"], ["b", "ɑː"]]),
    ([["ɐ"], ["b", "ɑː", "k", "s"]], [["eɪ"], ["b", "ɑː", "k", "s"]], [["ɐ"], ["b", "ɑː", "k", "s"]]),  # already paired
    # espeak-ng's cuts stay: the last word does not take "c", though it would align better
    ([["a", "b", "c"], ["d"]], [["a"], ["b"], ["c", "d"]], [["a"], ["b", "c"], ["d"]]),
])
def test_split_phonetic_words(spoken, alone, words):
    assert speaking.split_phonetic_words(spoken, alone) == words


@pytest.mark.parametrize("spoken, alone", [
    ([["a"], ["b"]], [["a"]]),  # more phonetic words than words
    ([["a", "b"]], [["a"], ["b"], ["c"]]),  # fewer units than words
])
def test_split_phonetic_words_refuses_what_cannot_pair(spoken, alone):
    with pytest.raises(ValueError):
        speaking.split_phonetic_words(spoken, alone)


@pytest.mark.parametrize("text, voice", [
    ("with the mango", "en-us+m1"), ("one crow in the lizard", "en-rp+m1"), ("plum from the coast", "en-us+m1"),
    ("our doll on the spoon", "en-nyc+m2"), ("my huge spider", "en-nyc+m1"),
])
def test_a_word_pair_spoken_as_one_gets_a_phonetic_word_each(text, voice):
    """espeak-ng speaks these pairs as one phonetic word (its dictionary's "with the", "in the",
    "from the", "on the"; the New York voice's "my huge", h dropped); the corpus's phonemes give each
    word its own, and the units stay those spoken."""
    es = Espeak()
    spoken = es.phonemize(text, speaking.espeak_voice_name(voice))
    assert len(spoken) < len(text.split())
    words = speaking.word_phonemes(es, text, voice)
    assert len(words) == len(text.split()) and all(words)
    assert [u for w in words for u in w] == [u for w in spoken for u in w]
    assert speaking.phonemes_of(es, text, voice) == " | ".join(" ".join(w) for w in words)


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
            assert len(u.phonemes.split(" | ")) == len(u.text.split())  # a phonetic word a word
            assert not re.search("[ˈˌ]", u.phonemes)
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


#: the slow test below draws every SAMPLE_STRIDE-th utterance of the built-in corpus (seed 0,
#: 3,000 / 300 / 300): 720 of its 3,600, among them 4 of the 24 whose words espeak-ng speaks as
#: fewer phonetic words ("my huge", "from the", "with the" twice)
SAMPLE_STRIDE = 5


@pytest.mark.slow  # a fifth of the built-in corpus's sentences synthesised (no noise, no files)
def test_a_fifth_of_the_built_in_corpus_pairs_its_words_and_phonetic_words(tmp_path):
    """Every fifth utterance of the default corpus (seed 0, 3,000 / 300 / 300; each drawn as the
    corpus draws it): the lexicon built from them skips no utterance for words and phonetic words
    that do not pair up (what ``make train`` warned about), and some of them are ones espeak-ng
    speaks with a word pair as one phonetic word, so the sample exercises the split."""
    counts = {"train": 3000, "dev": 300, "test": 300}
    jobs = [speaking.Job(0, split, i, str(tmp_path)) for split in speaking.SPLITS
            for i in range(0, counts[split], SAMPLE_STRIDE)]
    with mp.get_context("spawn").Pool(2, initializer=speaking.worker_init) as pool:
        texts = pool.map(synthetic.utterance_text, jobs, chunksize=16)
    for split in speaking.SPLITS:
        records = [{"audio_filepath": f"{job.index}.wav", "duration": 1.0, "text": text, "phonemes": phonemes}
                   for job, (text, phonemes, _) in zip(jobs, texts) if job.split == split]
        write_manifest(tmp_path / f"{split}.jsonl", records)
        _, report = lexicon_from_manifests([tmp_path / f"{split}.jsonl"])
        assert (report.utterances, report.skipped) == (len(records), []), split
    es = Espeak()
    merged = [text for text, _, voice in texts
              if len(es.phonemize(text, speaking.espeak_voice_name(voice))) < len(text.split())]
    assert merged, "no sampled utterance has a word pair spoken as one phonetic word: the sample tests nothing"
