"""Tokenizers: vocabulary, round trips, persistence, words."""

from __future__ import annotations

import json

import pytest

from fastasr.data.manifest import Utterance
from fastasr.data.tokenizer import BLANK, Tokenizer, UnknownUnitError


def utt(text, phonemes=None, uid="u"):
    return Utterance(uid, "/x.wav", 1.0, text, phonemes)


TRAIN = [
    utt("Hello world", "h ə l oʊ | w ɜː l d", "u1"),
    utt("the judge", "ð ə | dʒ ʌ dʒ", "u2"),
]


def test_phoneme_vocab_is_sorted_with_blank_first_and_order_independent():
    tok = Tokenizer.build(TRAIN, "phoneme")
    assert tok.vocab[0] == BLANK and tok.blank_id == 0
    assert tok.vocab[1:] == sorted(set("h ə l oʊ | w ɜː l d ð ə dʒ ʌ dʒ".split()))
    assert Tokenizer.build(list(reversed(TRAIN)), "phoneme") == tok
    assert "dʒ" in tok.vocab and "ɜː" in tok.vocab  # multi-character units stay whole


def test_phoneme_round_trip_and_words():
    tok = Tokenizer.build(TRAIN, "phoneme")
    ids = tok.encode(TRAIN[0])
    assert all(isinstance(i, int) and i > 0 for i in ids)
    units = tok.decode(ids)
    assert units == "h ə l oʊ | w ɜː l d".split()
    assert tok.units_to_words(units) == ["həloʊ", "wɜːld"]
    assert tok.decode([0, *ids, 0]) == units  # blanks are dropped
    assert tok.encode("ð ə | w ɜː l d") == [tok.vocab.index(u) for u in "ð ə | w ɜː l d".split()]


def test_char_tokenizer():
    tok = Tokenizer.build([utt("Hello   World"), utt("the judge's")], "char")
    assert tok.vocab[0] == BLANK and tok.vocab[1:] == sorted(tok.vocab[1:])
    assert set("abcdefghijklmnopqrstuvwxyz|'") <= set(tok.vocab)  # a-z always present
    units = tok.decode(tok.encode(utt("HELLO  the\tworld")))
    assert units == list("hello|the|world")
    assert tok.units_to_words(units) == ["hello", "the", "world"]
    assert tok.encode(utt("xyz"))  # letters unseen in training are still encodable


def test_units_to_words_ignores_empty_words():
    tok = Tokenizer.build(TRAIN, "phoneme")
    assert tok.units_to_words(["|", "h", "|", "|", "ə", "l", "|"]) == ["h", "əl"]
    assert tok.units_to_words([]) == []


def test_state_dict_round_trip():
    tok = Tokenizer.build(TRAIN, "phoneme")
    state = json.loads(json.dumps(tok.state_dict()))  # plain Python, JSON-able
    back = Tokenizer.from_state_dict(state)
    assert back == tok and back.vocab == tok.vocab and back.kind == "phoneme" and len(back) == len(tok)
    assert back.encode(TRAIN[1]) == tok.encode(TRAIN[1])


def test_unknown_unit_raises_clearly():
    tok = Tokenizer.build(TRAIN, "phoneme")
    with pytest.raises(UnknownUnitError) as err:
        tok.encode(utt("x", "θ ɪ ŋ k", uid="dev-7"))
    msg = str(err.value)
    assert "θ" in msg and "ŋ" in msg and "dev-7" in msg and "not in the vocabulary" in msg


def test_bad_construction():
    with pytest.raises(ValueError, match="phonemes"):
        Tokenizer.build([utt("no phonemes")], "phoneme")
    with pytest.raises(ValueError, match="kind"):
        Tokenizer.build(TRAIN, "bpe")
    with pytest.raises(ValueError, match="blank"):
        Tokenizer("char", ["a", BLANK])
    with pytest.raises(ValueError, match="outside"):
        Tokenizer.build(TRAIN, "phoneme").decode([999])
