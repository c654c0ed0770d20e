"""Helpers that make a small recogniser and write its checkpoint as training does
(shared by test_recogniser.py, test_scoring.py, test_bundle_format.py, test_export.py and
test_streaming.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from fastasr.data.features import FeatureConfig
from fastasr.data.manifest import read_manifest
from fastasr.data.tokenizer import Tokenizer
from fastasr.recognition.loading import with_decoding_data
from fastasr.recognition.recogniser import Recogniser
from fastasr.training.lit import ASRLitModule

MODEL = {"_target_": "fastasr.model.CTCModel", "d_model": 32, "heads": 2, "ff_dim": 64, "layers": 2,
         "dropout": 0.0, "shared_qk": False, "subsampling": 2, "norm_first": True,
         "spec_augment": {"freq_masks": 1, "freq_width": 4, "time_masks": 1, "time_width": 5},
         "attention": {"name": "clustered", "clusters": 3, "bits": 31, "iterations": 5, "seed": None}}


def phoneme_tokenizer(corpus: Path) -> Tokenizer:
    """The phoneme tokenizer of ``corpus``'s training manifest."""
    return Tokenizer.build(read_manifest(corpus / "train.jsonl"), "phoneme")


def recogniser(tokenizer: Tokenizer, bins: int = 23) -> Recogniser:
    return Recogniser.from_model_config(MODEL, tokenizer, {"num_mel_bins": bins, "dither": 0.5})


def copy_train_manifest(corpus: Path, to: Path) -> Path:
    """A corpus directory holding only a copy of ``corpus``'s training manifest."""
    to.mkdir(parents=True)
    shutil.copy(corpus / "train.jsonl", to / "train.jsonl")
    return to


def save_checkpoint(rec: Recogniser, path, seed: int = 0):
    """A checkpoint as training writes it: the LightningModule's weights plus its on_save_checkpoint entry."""
    torch.manual_seed(seed)
    lit = ASRLitModule(rec)
    lit.model.set_cmvn(torch.linspace(-1, 1, rec.feat_in), torch.linspace(1, 2, rec.feat_in))
    checkpoint = {"state_dict": lit.state_dict(), "global_step": 3}
    lit.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, path)
    return lit


TINY = {"d_model": 32, "heads": 2, "ff_dim": 64, "layers": 2, "subsampling": 4, "conv_kernel": 5}


def tiny_recogniser(corpus: Path, kind: str = "phoneme", attention: str = "full", seed: int = 0,
                    features: FeatureConfig | None = None, **model) -> Recogniser:
    """An untrained model (random weights, a CMVN near the corpus's filterbanks) with the units,
    lexicon and LM of ``corpus``: its argmax path is arbitrary but fixed, which is all a
    comparison of two runtimes needs. ``features``: 40 Kaldi filterbanks unless given."""
    utterances = read_manifest(corpus / "train.jsonl")
    tokenizer = Tokenizer.build(utterances, kind)
    recogniser = Recogniser.from_model_config({**TINY, **model, "attention": attention}, tokenizer,
                                              features or FeatureConfig(num_mel_bins=40))
    recogniser = with_decoding_data(recogniser, corpus / "train.jsonl", lm_dir=corpus)
    torch.manual_seed(seed)
    network = recogniser.build_model().eval()
    network.set_cmvn(torch.full((40,), 9.0), torch.full((40,), 3.5))
    return recogniser.with_model(network)
