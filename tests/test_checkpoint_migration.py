"""Checkpoints written before the recogniser bundle existed still load (fastasr.recognition.checkpoint_migration)."""

from __future__ import annotations

import pytest
import torch
from recogniser_fixtures import MODEL, phoneme_tokenizer, recogniser, save_checkpoint

from fastasr.data.tokenizer import Tokenizer
from fastasr.recognition.checkpoint_migration import legacy_recogniser_state
from fastasr.recognition.recogniser import Recogniser, load_recogniser


@pytest.fixture(scope="module")
def tokenizer(tiny_corpus) -> Tokenizer:
    return phoneme_tokenizer(tiny_corpus)


def test_checkpoints_of_earlier_versions_still_load(tokenizer, tmp_path):
    """Before the bundle existed, the LightningModule's hyper-parameters held model, tokenizer,
    feat_in and features; such a checkpoint gives the same recogniser."""
    rec = recogniser(tokenizer)
    lit = save_checkpoint(rec, tmp_path / "new.ckpt")
    legacy = {"state_dict": lit.state_dict(), "hyper_parameters": {
        "model": MODEL, "tokenizer": tokenizer.state_dict(), "feat_in": 23,
        "features": {"num_mel_bins": 23, "dither": 0.5}, "optimizer": None}}
    torch.save(legacy, tmp_path / "old.ckpt")
    old = load_recogniser(tmp_path / "old.ckpt")
    assert old == rec
    assert torch.equal(old.model.cmvn.std, torch.linspace(1, 2, 23))


def test_legacy_hyper_parameters_become_a_recogniser_entry(tokenizer):
    """The migration is plain data in, plain data out; what is not an old checkpoint gives None."""
    assert legacy_recogniser_state(None) is None
    assert legacy_recogniser_state({"optimizer": None}) is None
    hparams = {"model": MODEL, "tokenizer": tokenizer.state_dict(), "feat_in": 23}
    state = legacy_recogniser_state(hparams)
    assert state["features"] == {"num_mel_bins": 23} and state["lexicon"] is None and state["lm"] is None
    assert Recogniser.from_dict(state) == Recogniser.from_model_config(MODEL, tokenizer, {"num_mel_bins": 23})
    with pytest.raises(ValueError, match="come from the tokenizer"):
        legacy_recogniser_state(dict(hparams, model={**MODEL, "vocab_size": 5}))
    with pytest.raises(ValueError, match="no 'attention'"):
        legacy_recogniser_state(dict(hparams, model={k: v for k, v in MODEL.items() if k != "attention"}))
