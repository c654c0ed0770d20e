"""The recogniser bundle: plain data in the checkpoint, load_recogniser, decoding from a checkpoint alone."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fastasr.data.features import FeatureConfig
from fastasr.data.manifest import read_manifest
from fastasr.data.tokenizer import Tokenizer
from fastasr.decoding.lexicon import lexicon_from_manifests
from fastasr.lit import ASRLitModule
from fastasr.lm import BundledLM, estimate, write_arpa
from fastasr.recogniser import (
    RECOGNISER_KEY,
    Recogniser,
    decode_manifest,
    decoding_loader,
    decoding_options,
    load_recogniser,
    training_manifest,
    with_decoding_data,
)

MODEL = {"_target_": "fastasr.model.CTCModel", "d_model": 32, "heads": 2, "ff_dim": 64, "layers": 2,
         "dropout": 0.0, "shared_qk": False, "subsampling": 2, "norm_first": True,
         "spec_augment": {"freq_masks": 1, "freq_width": 4, "time_masks": 1, "time_width": 5},
         "attention": {"name": "clustered", "clusters": 3, "bits": 31, "iterations": 5, "seed": None}}


@pytest.fixture(scope="module")
def tokenizer(tiny_corpus) -> Tokenizer:
    return Tokenizer.build(read_manifest(tiny_corpus / "train.jsonl"), "phoneme")


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


def test_decoding_uses_the_checkpoints_tokenizer_and_features(tokenizer, tiny_corpus, tmp_path):
    save_checkpoint(recogniser(tokenizer, bins=23), tmp_path / "a.ckpt")
    rec = load_recogniser(tmp_path / "a.ckpt")
    loader = decoding_loader(rec, tiny_corpus / "test.jsonl", max_frames_per_batch=100000)
    (batch,) = list(loader)
    assert batch["features"].shape[0] == 2 and batch["features"].shape[2] == 23
    # only the checkpoint and the manifest: no composed data config
    result = decode_manifest(rec, tiny_corpus / "test.jsonl", accelerator="cpu", seed=3)
    assert set(result) >= {"per", "wer", "utterances", "decode_seconds", "attention", "manifest"}
    # no training manifest, so no lexicon: greedy decoding, WER over phonetic words, no files
    assert result["decoding"]["name"] == "greedy" and result["words"] == "phonetic" and "files" not in result
    assert result["per_breakdown"]["reference"] > 0 and "oov" not in result
    assert result["utterances"] == 2 and result["attention"] == "clustered-3" and result["per"] >= 0
    assert result["manifest"] == str(tiny_corpus / "test.jsonl")
    again = decode_manifest(rec, tiny_corpus / "test.jsonl", accelerator="cpu", seed=3)
    assert (again["per"], again["wer"]) == (result["per"], result["wer"])  # the seed fixes the hashing


def test_greedy_decode_manifest_scores_as_the_training_test_loop(tokenizer, tiny_corpus, tmp_path):
    """decode_manifest (model → greedy decoder → jiwer alignment) gives the numbers of the
    LightningModule's own test loop (batched greedy → ErrorRates) on the same model."""
    import lightning as L

    save_checkpoint(recogniser(tokenizer), tmp_path / "a.ckpt")
    rec = load_recogniser(tmp_path / "a.ckpt", attention="full")  # deterministic
    result = decode_manifest(rec, tiny_corpus / "test.jsonl", accelerator="cpu", out_dir=tmp_path / "run")
    lit = ASRLitModule(rec)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.test(lit, dataloaders=decoding_loader(rec, tiny_corpus / "test.jsonl"), verbose=False)
    assert result["per"] == pytest.approx(lit.test_result["per"]) and result["wer"] == pytest.approx(lit.test_result["wer"])
    assert result["utterances"] == lit.test_result["utterances"] == 2
    # the per-utterance files go to out_dir, tagged by manifest and decoder
    assert (tmp_path / "run" / "errs-test-greedy.txt").read_text().startswith("%WER")
    assert result["files"]["recogs"] == str(tmp_path / "run" / "recogs-test-greedy.txt")


def test_training_manifest_of_a_data_config():
    from omegaconf import OmegaConf

    assert training_manifest({"train_manifest": "/c/train.jsonl"}) == "/c/train.jsonl"
    assert training_manifest({"train_manifest": None}) is None and training_manifest({}) is None
    assert training_manifest(OmegaConf.create({"train_manifest": "???"})) is None  # unset in an evaluation config


def test_decode_needs_a_model_and_options_come_from_a_data_config(tokenizer, tiny_corpus):
    with pytest.raises(ValueError, match="no model"):
        decode_manifest(recogniser(tokenizer), tiny_corpus / "test.jsonl")
    data = {"max_frames_per_batch": 4000, "max_batch_size": None, "num_workers": 0, "tokenizer": "char",
            "on_bad_utterance": "raise", "features": {"num_mel_bins": 80}}
    assert decoding_options(data) == {"max_frames_per_batch": 4000, "num_workers": 0, "on_bad_utterance": "raise"}


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


def test_decoding_uses_the_recognisers_lexicon_and_lm(tokenizer, tiny_corpus, tmp_path):
    """With no training manifest anywhere, ``auto`` decodes over the recogniser's lexicon and
    LM; a referenced LM that changed since training stops the decoding, naming the file."""
    corpus = copy_train_manifest(tiny_corpus, tmp_path / "corpus")
    rec = with_decoding_data(recogniser(tokenizer), corpus / "train.jsonl")
    save_checkpoint(rec, tmp_path / "a.ckpt")
    shutil.rmtree(corpus)  # the training manifest and the LM beside it are gone
    loaded = load_recogniser(tmp_path / "a.ckpt", attention="full")
    greedy = decode_manifest(loaded, tiny_corpus / "test.jsonl", accelerator="cpu")
    assert greedy["words"] == "real" and greedy["decoding"]["lexicon_words"] == len(rec.lexicon)
    beam_lm = {"name": "beam", "beam_size": 4, "lm": {"source": "auto"}}
    beam = decode_manifest(loaded, tiny_corpus / "test.jsonl", accelerator="cpu", decoding=beam_lm)
    assert beam["words"] == "real" and beam["decoding"]["lm"] == rec.lm.path
    assert beam["decoding"]["lm_sha256"] == rec.lm.sha256 and beam["decoding"]["lm_embedded"]
    # too large to embed: the file is read where it was, and must not have changed
    lm_file = tmp_path / "big" / "words.arpa"
    lm_file.parent.mkdir()
    lm_file.write_text(rec.lm.arpa)
    referenced = BundledLM.from_file(lm_file, embed_limit=0)
    save_checkpoint(replace(rec, lm=referenced), tmp_path / "b.ckpt")
    far = load_recogniser(tmp_path / "b.ckpt", attention="full")
    again = decode_manifest(far, tiny_corpus / "test.jsonl", accelerator="cpu", decoding=beam_lm)
    assert (again["wer"], again["per"]) == (beam["wer"], beam["per"]) and not again["decoding"]["lm_embedded"]
    lm_file.write_text(rec.lm.arpa.replace("\\end\\", "\n\\end\\"))
    with pytest.raises(ValueError, match=rf"word LM {lm_file} has changed since the model was trained"):
        decode_manifest(far, tiny_corpus / "test.jsonl", accelerator="cpu", decoding=beam_lm)
    # explicit settings still win: no LM, or another file
    plain = decode_manifest(far, tiny_corpus / "test.jsonl", accelerator="cpu", decoding=dict(beam_lm, lm={"source": "none"}))
    assert plain["decoding"]["lm"] is None
    other = decode_manifest(far, tiny_corpus / "test.jsonl", accelerator="cpu",
                            decoding=dict(beam_lm, lm={"source": "auto", "path": str(lm_file)}))
    assert other["decoding"]["lm"] == str(lm_file) and "lm_sha256" not in other["decoding"]


def test_a_recogniser_without_lexicon_or_lm_decodes_as_before(tokenizer, tiny_corpus, tmp_path):
    """Checkpoints written before the lexicon and LM travelled with the model: ``auto`` builds
    the lexicon from the training manifest and takes the corpus LM beside it, when given."""
    corpus = copy_train_manifest(tiny_corpus, tmp_path / "corpus")
    write_arpa(estimate([["a", "b"]], 2), corpus / "lm" / "words-3gram.arpa")
    save_checkpoint(recogniser(tokenizer), tmp_path / "old.ckpt")
    old = load_recogniser(tmp_path / "old.ckpt", attention="full")
    assert old.lexicon is None and old.lm is None
    beam_lm = {"name": "beam", "beam_size": 4, "lm": {"source": "auto"}}
    result = decode_manifest(old, tiny_corpus / "test.jsonl", accelerator="cpu", decoding=beam_lm,
                             train_manifest=corpus / "train.jsonl")
    lexicon, _ = lexicon_from_manifests([corpus / "train.jsonl"], tokenizer)
    assert result["words"] == "real" and result["decoding"]["lexicon_words"] == len(lexicon)
    assert result["decoding"]["lm"] == str(corpus / "lm" / "words-3gram.arpa")
    with pytest.raises(FileNotFoundError, match="carries no word LM"):
        decode_manifest(old, tiny_corpus / "test.jsonl", accelerator="cpu", decoding=beam_lm)
