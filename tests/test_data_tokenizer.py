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
        Tokenizer.build(TRAIN, "wordpiece")
    with pytest.raises(ValueError, match="vocab_size"):
        Tokenizer.build(TRAIN, "bpe")
    with pytest.raises(ValueError, match="blank"):
        Tokenizer("char", ["a", BLANK])
    with pytest.raises(ValueError, match="outside"):
        Tokenizer.build(TRAIN, "phoneme").decode([999])


# ------------------------------------------------------------------ subwords (sentencepiece)

SENTENCES = [
    "the cat sat on the mat", "the dog sat on the log", "a cat and a dog", "the mat is on the log",
    "Dogs and cats sat", "the cat's mat", "on and on and on", "a log is a log",
]


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_subword_round_trip_and_words(kind):
    train = [utt(t, uid=f"s{i}") for i, t in enumerate(SENTENCES)]
    tok = Tokenizer.build(train, kind, vocab_size=40)
    assert tok.kind == kind and tok.vocab[0] == BLANK and tok.vocab[1] == "<unk>"
    assert len(tok) <= 40 and len(tok) > 20
    # merges happened: some piece is longer than one character plus the word mark
    assert any(len(p.lstrip("\u2581")) > 1 for p in tok.vocab[2:])
    ids = tok.encode(utt("The  CAT sat\ton the log"))
    assert all(0 < i < len(tok) for i in ids)
    units = tok.decode([0, *ids, 0])
    assert tok.units_to_words(units) == ["the", "cat", "sat", "on", "the", "log"]
    # unit error rate is scored on characters without spaces (a CER)
    assert tok.scored_units(units) == list("thecatsatonthelog")
    # a sentence of unseen word order still encodes (characters are covered)
    assert tok.units_to_words(tok.decode(tok.encode("log cat dogs"))) == ["log", "cat", "dogs"]


def test_subword_state_is_plain_data_and_self_contained():
    train = [utt(t, uid=f"s{i}") for i, t in enumerate(SENTENCES)]
    tok = Tokenizer.build(train, "bpe", vocab_size=40)
    state = json.loads(json.dumps(tok.state_dict()))  # JSON-able: the model is a base64 string
    assert isinstance(state["model"], str)
    back = Tokenizer.from_state_dict(state)
    assert back == tok and back.encode("the dog sat") == tok.encode("the dog sat")
    # the same training text gives the same model (deterministic)
    assert Tokenizer.build(train, "bpe", vocab_size=40) == tok
    with pytest.raises(ValueError, match="pieces"):
        Tokenizer("bpe", [BLANK, "x"], model=tok.model)


def test_subword_errors():
    train = [utt(t, uid=f"s{i}") for i, t in enumerate(SENTENCES)]
    tok = Tokenizer.build(train, "unigram", vocab_size=40)
    with pytest.raises(UnknownUnitError, match="'z'"):
        tok.encode(utt("zoo", uid="dev-1"))
    with pytest.raises(ValueError, match="vocab_size 10; expected more than"):
        Tokenizer.build(train, "bpe", vocab_size=10)


# ------------------------------------------------------------------ phone foldings


def test_timit_folding_trains_on_48_and_scores_on_39():
    from fastasr.data.phone_sets import TIMIT_39, TIMIT_48

    train = [utt("she had", "h# sh ix | hv ae dcl d | pau | q ao zh h#", "t1")]
    tok = Tokenizer.build(train, "phoneme", phone_folding="timit")
    assert set(tok.vocab[1:]) <= set(TIMIT_48) | {"|"}
    units = tok.decode(tok.encode(train[0]))
    # 61 → 48: h#/pau → sil, hv → hh, dcl → vcl, q deleted; boundaries kept once
    assert units == "sil sh ix | hh ae vcl d | sil | ao zh sil".split()
    # 48 → 39 for scoring: ix → ih, vcl → sil, ao → aa, zh → sh; boundaries dropped
    assert tok.scored_units(units) == "sil sh ih hh ae sil d sil aa sh sil".split()
    assert set(tok.scored_units(units)) <= set(TIMIT_39)
    back = Tokenizer.from_state_dict(json.loads(json.dumps(tok.state_dict())))
    assert back == tok and back.scored_units(units) == tok.scored_units(units)
    with pytest.raises(ValueError, match="phone_folding 'wsj'"):
        Tokenizer.build(train, "phoneme", phone_folding="wsj")
    with pytest.raises(ValueError, match="tokenizer=phoneme"):
        Tokenizer.build(train, "char", phone_folding="timit")


def test_tokenizer_options_reach_the_datamodule_through_the_config(tiny_corpus):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from fastasr.config import CONFIG_DIR
    from fastasr.training.derived_config import resolve_train_config

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        default = resolve_train_config(compose("train"))
        cfg = resolve_train_config(compose("train", overrides=["tokenizer=unigram", "data.vocab_size=48",
                                                              f"data.train_manifest={tiny_corpus / 'train.jsonl'}",
                                                              f"data.dev_manifest={tiny_corpus / 'dev.jsonl'}"]))
    assert default.data.tokenizer == "phoneme"  # top-level null: the data config's own default
    assert cfg.data.tokenizer == "unigram" and cfg.callbacks.model_checkpoint.monitor == "val/cer"
    dm = instantiate(cfg.data, features={"num_mel_bins": 40}, num_workers=0)
    dm.setup("validate")
    assert dm.tokenizer.kind == "unigram" and 30 < len(dm.tokenizer) <= 48
    ref = dm.datasets["dev"].references[0]
    assert ref == " ".join(dm._read("dev")[0].text.lower().split())
