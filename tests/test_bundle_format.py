"""A checkpoint of an older recogniser layout is refused in one line that names its version and
says how to replace it (fastasr.recognition.bundle_format); the current one loads."""

from __future__ import annotations

import pytest
import torch
from recogniser_fixtures import MODEL, phoneme_tokenizer, recogniser, save_checkpoint

from fastasr.data.tokenizer import Tokenizer
from fastasr.recognition.bundle_format import FORMAT
from fastasr.recognition.loading import load_recogniser
from fastasr.recognition.recogniser import RECOGNISER_KEY, Recogniser


@pytest.fixture(scope="module")
def tokenizer(tiny_corpus) -> Tokenizer:
    return phoneme_tokenizer(tiny_corpus)


def _one_line_refusal(path, version: str) -> None:
    with pytest.raises(ValueError) as refused:
        load_recogniser(path)
    message = str(refused.value)
    assert "\n" not in message and str(path) in message, message
    assert f"recogniser format {version}" in message and "re-train it with this fastasr" in message, message


def test_checkpoints_of_older_layouts_are_refused_in_one_line(tokenizer, tmp_path):
    rec = recogniser(tokenizer)
    lit = save_checkpoint(rec, tmp_path / "new.ckpt")
    assert load_recogniser(tmp_path / "new.ckpt") == rec  # the current layout loads
    current = torch.load(tmp_path / "new.ckpt", weights_only=True)
    assert current[RECOGNISER_KEY]["format"] == FORMAT == 2
    # format 0: the bundle in the LightningModule's hyper-parameters, no recogniser entry
    torch.save({"state_dict": lit.state_dict(), "hyper_parameters": {
        "model": MODEL, "tokenizer": tokenizer.state_dict(), "feat_in": 23}}, tmp_path / "v0.ckpt")
    _one_line_refusal(tmp_path / "v0.ckpt", "0")
    # format 1: the model config names no class
    entry = dict(current[RECOGNISER_KEY], format=1, model={k: v for k, v in current[RECOGNISER_KEY]["model"].items()
                                                           if k != "_target_"})
    torch.save({**current, RECOGNISER_KEY: entry}, tmp_path / "v1.ckpt")
    _one_line_refusal(tmp_path / "v1.ckpt", "1")
    # not a fastasr checkpoint; a newer layout
    torch.save({"state_dict": {}}, tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match="no 'recogniser' entry; expected a checkpoint written by fastasr training"):
        load_recogniser(tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match="recogniser format 3; this fastasr reads format 2"):
        Recogniser.from_dict({**current[RECOGNISER_KEY], "format": 3}, source="x.ckpt")
