"""Lexicons: pronunciation variants with counts from manifests, OOV reports, CMUdict, files."""

import json
from collections import Counter

import pytest

from fastasr.data.lexicon import (
    Lexicon,
    cmudict_lexicon,
    lexicon_from_manifests,
    read_lexicon,
    spelling_lexicon,
    write_lexicon,
)
from fastasr.data.tokenizer import Tokenizer
from fastasr.decoding.builder import build_lexicon, resolve_source


def write_manifest(path, rows):
    path.write_text("".join(json.dumps({"audio_filepath": "x.wav", "duration": 1.0, "text": t, "phonemes": p}) + "\n"
                            for t, p in rows))
    return path


ROWS = [
    ("No cat", "n oʊ | k æ t"),
    ("no dog", "n əʊ | d ɒ ɡ"),
    ("no cat", "n oʊ | k æ t"),
    ("with the cat", "w ɪ ð ð ə | k æ t"),  # espeak spoke two words as one phonetic word
]


def test_variants_are_counted_and_mismatches_reported(tmp_path):
    lexicon, report = lexicon_from_manifests([write_manifest(tmp_path / "train.jsonl", ROWS)])
    assert lexicon.entries["no"] == Counter({("n", "oʊ"): 2, ("n", "əʊ"): 1})
    assert lexicon.pronunciations("no") == [("n", "oʊ"), ("n", "əʊ")]  # most frequent first
    assert lexicon.entries["cat"] == Counter({("k", "æ", "t"): 2})  # not 3: the mismatched line is skipped
    assert "with" not in lexicon and "the" not in lexicon
    assert report.utterances == 4 and len(report.skipped) == 1
    assert "utterance 4" in report.skipped[0] and "3 words, 2 phonetic words" in report.skipped[0]
    assert "1 skipped" in report.summary()


def test_words_are_the_char_tokenizers_word_space():
    from fastasr.data.lexicon import words_of
    from fastasr.data.tokenizer import units_of

    text = "The  Cat\tsat"
    assert words_of(text) == ["the", "cat", "sat"]
    assert Tokenizer("char", ["<blank>", *"abcdefghijklmnopqrstuvwxyz", "|"]).units_to_words(
        units_of(text, "char")) == words_of(text)


def test_oov_report_counts_every_missing_word():
    lexicon = spelling_lexicon(["the", "cat"])
    report = lexicon.oov([["the", "cat", "sat"], ["the", "dog", "sat"]])
    assert (report.tokens, report.oov_tokens) == (6, 3)
    assert report.missing == Counter({"sat": 2, "dog": 1})
    assert report.rate == pytest.approx(50.0)
    assert "sat (2)" in report.summary() and "3 of 6 words" in report.summary()
    assert lexicon.oov([["the"]]).summary() == "all 1 words are in the lexicon"


def test_inverse_picks_the_most_frequent_homophone():
    lexicon = Lexicon()
    lexicon.add("no", ["n", "oʊ"], 5)
    lexicon.add("know", ["n", "oʊ"], 2)
    lexicon.add("know", ["n", "əʊ"], 1)
    assert lexicon.inverse() == {("n", "oʊ"): "no", ("n", "əʊ"): "know"}


def test_file_round_trip_override_and_restriction(tmp_path):
    lexicon = Lexicon()
    lexicon.add("no", ["n", "oʊ"], 3)
    lexicon.add("cat", ["k", "æ", "t"])
    assert read_lexicon(write_lexicon(lexicon, tmp_path / "lex.txt")) == lexicon  # counts kept
    user = tmp_path / "user.txt"
    user.write_text("# my words\nNO n oː\nzebra z iː b ɹ ə\n")
    merged = lexicon.override(read_lexicon(user))
    assert merged.pronunciations("no") == [("n", "oː")]  # replaced, not added to
    assert merged.pronunciations("cat") == [("k", "æ", "t")] and "zebra" in merged
    kept, dropped = merged.restrict_to_units({"k", "æ", "t", "n", "oː"})
    assert "zebra" not in kept and len(dropped) == 1 and "zebra" in dropped[0]


def test_bad_lexicon_line_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("cat k æ t\ndog\n")
    with pytest.raises(ValueError, match=r"bad.txt line 2"):
        read_lexicon(bad)


def test_cmudict_arpabet_with_and_without_stress():
    lexicon = cmudict_lexicon(["hello", "zzzqx"])
    assert ("HH", "AH", "L", "OW") in lexicon.pronunciations("hello")
    assert "zzzqx" not in lexicon
    assert ("HH", "AH0", "L", "OW1") in cmudict_lexicon(["hello"], stress=True).pronunciations("hello")
    assert ("hh", "ah", "l", "ow") in cmudict_lexicon(["hello"], lowercase=True).pronunciations("hello")


def test_auto_source_per_model_kind(tmp_path):
    train = write_manifest(tmp_path / "train.jsonl", ROWS)
    phonemes = Tokenizer("phoneme", ["<blank>", "n", "oʊ", "|"])
    arpabet = Tokenizer("phoneme", ["<blank>", "hh", "ah", "l", "ow", "|"])
    chars = Tokenizer("char", ["<blank>", *"abcdefghijklmnopqrstuvwxyz", "|"])
    assert resolve_source("auto", phonemes, train) == "train"
    assert resolve_source("auto", phonemes, None) == "none"
    assert resolve_source("auto", arpabet, None) == "cmudict"
    assert resolve_source("auto", chars, train) == "spelling"
    spelt = build_lexicon({"source": "auto"}, chars, train)
    assert spelt.pronunciations("cat") == [("c", "a", "t")]
    with pytest.raises(ValueError, match="needs the training manifest"):
        build_lexicon({"source": "train"}, phonemes, None)
    with pytest.raises(ValueError, match="expected one of"):
        build_lexicon({"source": "wordnet"}, phonemes, train)


def test_auto_source_prefers_the_recogniser_lexicon(tmp_path):
    """``auto`` uses the lexicon a recogniser carries, with or without a training manifest;
    an explicit source still reads the manifest; ``recogniser`` without one is a clear error."""
    train = write_manifest(tmp_path / "train.jsonl", ROWS)
    phonemes = Tokenizer("phoneme", ["<blank>", "n", "oʊ", "əʊ", "k", "æ", "t", "d", "ɒ", "ɡ", "|"])
    own = Lexicon()
    own.add("know", ["n", "oʊ"], 7)
    assert resolve_source("auto", phonemes, None, own) == resolve_source("auto", phonemes, train, own) == "recogniser"
    assert build_lexicon({"source": "auto"}, phonemes, tmp_path / "moved.jsonl", own) is own
    assert build_lexicon(None, phonemes, None, own) is own
    assert "know" not in build_lexicon({"source": "train"}, phonemes, train, own)  # explicit: the manifest's
    user = tmp_path / "user.txt"
    user.write_text("zebra z iː\n")
    assert set(build_lexicon({"source": "auto", "path": str(user)}, phonemes, None, own).entries) == {"know", "zebra"}
    with pytest.raises(ValueError, match="carries no lexicon"):
        build_lexicon({"source": "recogniser"}, phonemes, train)


def test_lines_round_trip_keeps_counts_and_order():
    lexicon = Lexicon()
    lexicon.add("no", ["n", "oʊ"], 3)
    lexicon.add("no", ["n", "əʊ"], 1)
    lexicon.add("cat", ["k", "æ", "t"])
    lines = lexicon.lines(with_counts=True)
    assert lines == ["cat\tk æ t\t1", "no\tn oʊ\t3", "no\tn əʊ\t1"]
    assert Lexicon.from_lines(lines) == lexicon
    with pytest.raises(ValueError, match=r"ckpt: recogniser lexicon line 2"):
        Lexicon.from_lines(["cat\tk æ t\t1", "dog\t\t1"], where="ckpt: recogniser lexicon")
    with pytest.raises(ValueError, match="without spaces"):
        lexicon.add("dog", ["d", "ɒ ɡ"])  # a unit with a space could not be written to a lexicon file
