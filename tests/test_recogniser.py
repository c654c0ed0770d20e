"""The recogniser bundle: plain data in the checkpoint, load_recogniser, the lexicon and LM it carries.
(Scoring a manifest with it: test_scoring.py; the layout's version and older checkpoints refused: test_bundle_format.py.)"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from recogniser_fixtures import (
    MODEL,
    copy_train_manifest,
    phoneme_tokenizer,
    recogniser,
    save_checkpoint,
)

from fastasr.data.features import FeatureConfig
from fastasr.data.lexicon import lexicon_from_manifests
from fastasr.data.manifest import read_manifest
from fastasr.data.tokenizer import Tokenizer
from fastasr.lm import BundledLM, estimate, write_arpa
from fastasr.recognition.loading import load_recogniser, with_decoding_data
from fastasr.recognition.recogniser import RECOGNISER_KEY, Recogniser


@pytest.fixture(scope="module")
def tokenizer(tiny_corpus) -> Tokenizer:
    return phoneme_tokenizer(tiny_corpus)


def test_bundle_is_plain_data_and_round_trips(tokenizer):
    rec = recogniser(tokenizer)
    assert rec.subsampling == 2 and rec.feat_in == 23 and rec.vocab_size == len(tokenizer.vocab)
    assert "attention" not in rec.model_config and "_target_" not in rec.model_config
    state = rec.to_dict()
    assert json.loads(json.dumps(state)) == state  # str/int/float/bool/None/list/dict only
    back = Recogniser.from_dict(state)
    assert back == rec and back.tokenizer == tokenizer and back.features == FeatureConfig(num_mel_bins=23, dither=0.5)
    model = back.build_model()
    assert model.attention_spec == "clustered-3" and model.subsampling_factor == 2
    assert model.head.out_features == len(tokenizer.vocab) and model.cmvn.mean.shape == (23,)


@pytest.mark.parametrize("change,message", [
    ({"vocab_size": 5}, "come from the tokenizer"),
    ({"_target_": "os.system"}, "builds fastasr.model.CTCModel"),
    ({"attention": None}, "no 'attention'"),
])
def test_bad_model_configs_are_refused(tokenizer, change, message):
    config = {**MODEL, **change}
    if change.get("attention", 1) is None:
        del config["attention"]
    with pytest.raises(ValueError, match=message):
        Recogniser.from_model_config(config, tokenizer, {})


def test_load_recogniser_restores_the_trained_model(tokenizer, tmp_path):
    rec = recogniser(tokenizer)
    lit = save_checkpoint(rec, tmp_path / "a.ckpt")
    loaded = load_recogniser(tmp_path / "a.ckpt")
    assert loaded == rec and not loaded.model.training
    trained = lit.model.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in loaded.model.state_dict().items())
    assert torch.equal(loaded.model.cmvn.mean, torch.linspace(-1, 1, 23))
    swapped = load_recogniser(tmp_path / "a.ckpt", attention="topk-4")
    assert swapped.model.attention_spec == "topk-4" and swapped.attention == MODEL["attention"]


def test_load_recogniser_errors_name_the_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such checkpoint"):
        load_recogniser(tmp_path / "missing.ckpt")
    torch.save({"state_dict": {}}, tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match="other.ckpt: no 'recogniser' entry"):
        load_recogniser(tmp_path / "other.ckpt")
    torch.save({RECOGNISER_KEY: {"model": {}}}, tmp_path / "torn.ckpt")
    with pytest.raises(ValueError, match="torn.ckpt: recogniser entry lacks"):
        load_recogniser(tmp_path / "torn.ckpt")


def test_lexicon_and_lm_travel_in_the_bundle(tokenizer, tiny_corpus, tmp_path):
    """The lexicon and the word LM are plain data in the bundle: they round-trip through
    to_dict/from_dict and a weights_only checkpoint; an entry written before they existed
    loads without them."""
    lexicon, _ = lexicon_from_manifests([tiny_corpus / "train.jsonl"], tokenizer)
    lm = BundledLM.from_file(write_arpa(estimate([["a", "b"], ["b"]], 2), tmp_path / "w.arpa"))
    rec = Recogniser.from_model_config(MODEL, tokenizer, {"num_mel_bins": 23})
    rec = replace(rec, lexicon=lexicon, lexicon_source="train: t.jsonl", lm=lm)
    state = rec.to_dict()
    assert json.loads(json.dumps(state)) == state
    assert state["lexicon"]["source"] == "train: t.jsonl" and state["lm"]["arpa"] == lm.arpa
    back = Recogniser.from_dict(state)
    assert back == rec and back.lexicon == lexicon and back.lm == lm
    save_checkpoint(rec, tmp_path / "a.ckpt")
    loaded = load_recogniser(tmp_path / "a.ckpt")
    assert loaded.lexicon == lexicon and loaded.lexicon_source == "train: t.jsonl" and loaded.lm == lm
    older = {k: v for k, v in state.items() if k not in ("lexicon", "lm")}
    assert Recogniser.from_dict(older).lexicon is None and Recogniser.from_dict(older).lm is None
    with pytest.raises(ValueError, match="b.ckpt: bad recogniser lexicon entry"):
        Recogniser.from_dict(dict(state, lexicon=["a a"]), source="b.ckpt")


def test_with_decoding_data_builds_the_lexicon_and_the_corpus_lm(tokenizer, tiny_corpus, tmp_path):
    """What training adds at its start: the auto lexicon of the training manifest and the corpus
    LM beside it (built when missing), embedded; a subword model gets neither."""
    corpus = copy_train_manifest(tiny_corpus, tmp_path / "corpus")
    rec = with_decoding_data(recogniser(tokenizer), corpus / "train.jsonl")
    assert rec.lexicon == lexicon_from_manifests([corpus / "train.jsonl"], tokenizer)[0]
    assert rec.lexicon_source == f"train: {corpus / 'train.jsonl'}"
    assert rec.lm.embedded and rec.lm.path == str(corpus / "lm" / "words-3gram.arpa")
    assert rec.lm.arpa == (corpus / "lm" / "words-3gram.arpa").read_text()
    given = write_arpa(estimate([["a", "b"]], 2), tmp_path / "given.arpa")
    assert with_decoding_data(recogniser(tokenizer), corpus / "train.jsonl", lm_path=given).lm.path == str(given)
    assert with_decoding_data(recogniser(tokenizer), None).lexicon is None
    bpe = Tokenizer.build(read_manifest(tiny_corpus / "train.jsonl"), "bpe", vocab_size=40)
    bare = with_decoding_data(Recogniser.from_model_config(MODEL, bpe, {}), corpus / "train.jsonl")
    assert bare.lexicon is None and bare.lm is None
