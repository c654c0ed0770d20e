"""Scoring a labelled manifest with a recogniser (fastasr.recognition.scoring): the dataloader of any
manifest, decode_manifest from a checkpoint alone, its DecodeResult and results.json."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import lightning as L
import pytest
from omegaconf import OmegaConf
from recogniser_fixtures import copy_train_manifest, phoneme_tokenizer, recogniser, save_checkpoint

from fastasr.data.lexicon import lexicon_from_manifests
from fastasr.data.tokenizer import Tokenizer
from fastasr.lm import BundledLM, estimate, write_arpa
from fastasr.recognition.loading import load_recogniser, with_decoding_data
from fastasr.recognition.scoring import (
    DecodeResult,
    decode_manifest,
    decoding_loader,
    decoding_options,
    training_manifest,
)
from fastasr.training.lit import ASRLitModule

# What results.json holds for a greedy decoding of a phoneme model without out_dir (no oov, no files).
RESULT_KEYS = {"per", "wer", "wer_breakdown", "per_breakdown", "utterances", "words", "decoding", "forward_seconds",
               "search_seconds", "decode_seconds", "attention", "manifest", "manifest_lines", "skipped_utterances",
               "skipped_lines", "skipped_audio"}


@pytest.fixture(scope="module")
def tokenizer(tiny_corpus) -> Tokenizer:
    return phoneme_tokenizer(tiny_corpus)


def test_decoding_uses_the_checkpoints_tokenizer_and_features(tokenizer, tiny_corpus, tmp_path):
    save_checkpoint(recogniser(tokenizer, bins=23), tmp_path / "a.ckpt")
    rec = load_recogniser(tmp_path / "a.ckpt")
    loader = decoding_loader(rec, tiny_corpus / "test.jsonl", max_frames_per_batch=100000)
    (batch,) = list(loader)
    assert batch["features"].shape[0] == 2 and batch["features"].shape[2] == 23
    # only the checkpoint and the manifest: no composed data config
    result = decode_manifest(rec, tiny_corpus / "test.jsonl", accelerator="cpu", seed=3)
    assert isinstance(result, DecodeResult)
    row = result.to_dict()  # what results.json holds
    assert set(row) >= {"per", "wer", "utterances", "decode_seconds", "attention", "manifest"}
    assert set(row) == RESULT_KEYS and json.loads(json.dumps(row)) == row
    # no training manifest, so no lexicon: greedy decoding, WER over phonetic words, no files
    assert result.decoding["name"] == "greedy" and result.words == "phonetic" and result.files is None
    assert "files" not in row and "oov" not in row and result.oov is None
    assert result.unit_breakdown["reference"] > 0 and row["per_breakdown"] == result.unit_breakdown
    assert result.utterances == 2 and result.attention == "clustered-3" and result.per >= 0
    assert result.unit_metric == "per" and result.cer is None and row["per"] == result.per
    assert result.skipped_utterances == 0 and result.skipped_audio == []
    assert result.manifest == str(tiny_corpus / "test.jsonl")
    again = decode_manifest(rec, tiny_corpus / "test.jsonl", accelerator="cpu", seed=3)
    assert (again.per, again.wer) == (result.per, result.wer)  # the seed fixes the hashing


def test_provenance_is_in_results_json_only_when_set(tokenizer, tiny_corpus, tmp_path):
    """ckpt_path, averaged_checkpoints and tuned_on_dev (set by evaluate.py and training's final
    decoding) join results.json when set; run_dir never does."""
    save_checkpoint(recogniser(tokenizer), tmp_path / "a.ckpt")
    result = decode_manifest(load_recogniser(tmp_path / "a.ckpt"), tiny_corpus / "test.jsonl", accelerator="cpu")
    told = replace(result, ckpt_path="a.ckpt", averaged_checkpoints=[], run_dir=str(tmp_path))
    row = told.to_dict()
    assert set(row) == RESULT_KEYS | {"ckpt_path", "averaged_checkpoints"}
    assert row["ckpt_path"] == "a.ckpt" and row["averaged_checkpoints"] == [] and "run_dir" not in row


def test_greedy_decode_manifest_scores_as_the_training_test_loop(tokenizer, tiny_corpus, tmp_path):
    """decode_manifest (model → greedy decoder → jiwer alignment) gives the numbers of the
    LightningModule's own test loop on the same model: one greedy path (batch_emissions →
    GreedyDecoder → transcribe_one) scored in batches (ErrorRates.add) or over the corpus."""
    save_checkpoint(recogniser(tokenizer), tmp_path / "a.ckpt")
    rec = load_recogniser(tmp_path / "a.ckpt", attention="full")  # deterministic
    result = decode_manifest(rec, tiny_corpus / "test.jsonl", accelerator="cpu", out_dir=tmp_path / "run")
    lit = ASRLitModule(rec)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.test(lit, dataloaders=decoding_loader(rec, tiny_corpus / "test.jsonl"), verbose=False)
    assert result.per == pytest.approx(lit.test_result["per"]) and result.wer == pytest.approx(lit.test_result["wer"])
    assert result.utterances == lit.test_result["utterances"] == 2
    # the per-utterance files go to out_dir, tagged by manifest and decoder
    assert (tmp_path / "run" / "errs-test-greedy.txt").read_text().startswith("%WER")
    assert result.files["recogs"] == str(tmp_path / "run" / "recogs-test-greedy.txt")
    assert result.to_dict()["files"] == result.files


def test_training_manifest_of_a_data_config():
    assert training_manifest({"train_manifest": "/c/train.jsonl"}) == "/c/train.jsonl"
    assert training_manifest({"train_manifest": None}) is None and training_manifest({}) is None
    assert training_manifest(OmegaConf.create({"train_manifest": "???"})) is None  # unset in an evaluation config


def test_decode_needs_a_model_and_options_come_from_a_data_config(tokenizer, tiny_corpus):
    with pytest.raises(ValueError, match="no model"):
        decode_manifest(recogniser(tokenizer), tiny_corpus / "test.jsonl")
    data = {"max_frames_per_batch": 4000, "max_batch_size": None, "num_workers": 0, "tokenizer": "char",
            "on_bad_utterance": "raise", "features": {"num_mel_bins": 80}}
    assert decoding_options(data) == {"max_frames_per_batch": 4000, "num_workers": 0, "on_bad_utterance": "raise"}


def test_decoding_uses_the_recognisers_lexicon_and_lm(tokenizer, tiny_corpus, tmp_path):
    """With no training manifest anywhere, ``auto`` decodes over the recogniser's lexicon and
    LM; a referenced LM that changed since training stops the decoding, naming the file."""
    corpus = copy_train_manifest(tiny_corpus, tmp_path / "corpus")
    rec = with_decoding_data(recogniser(tokenizer), corpus / "train.jsonl")
    save_checkpoint(rec, tmp_path / "a.ckpt")
    shutil.rmtree(corpus)  # the training manifest and the LM beside it are gone
    loaded = load_recogniser(tmp_path / "a.ckpt", attention="full")
    greedy = decode_manifest(loaded, tiny_corpus / "test.jsonl", accelerator="cpu")
    assert greedy.words == "real" and greedy.decoding["lexicon_words"] == len(rec.lexicon)
    beam_lm = {"name": "beam", "beam_size": 4, "lm": {"source": "auto"}}
    beam = decode_manifest(loaded, tiny_corpus / "test.jsonl", accelerator="cpu", decoding=beam_lm)
    assert beam.words == "real" and beam.decoding["lm"] == rec.lm.path
    assert beam.decoding["lm_sha256"] == rec.lm.sha256 and beam.decoding["lm_embedded"]
    assert beam.oov is not None and beam.to_dict()["oov"] == beam.oov  # a lexicon: its reference OOVs
    # too large to embed: the file is read where it was, and must not have changed
    lm_file = tmp_path / "big" / "words.arpa"
    lm_file.parent.mkdir()
    lm_file.write_text(rec.lm.arpa)
    referenced = BundledLM.from_file(lm_file, embed_limit=0)
    save_checkpoint(replace(rec, lm=referenced), tmp_path / "b.ckpt")
    far = load_recogniser(tmp_path / "b.ckpt", attention="full")
    again = decode_manifest(far, tiny_corpus / "test.jsonl", accelerator="cpu", decoding=beam_lm)
    # the same LM read from the file: the same search (equal best scores; a tie may pick other words)
    assert again.search_score == pytest.approx(beam.search_score, rel=1e-6) and not again.decoding["lm_embedded"]
    lm_file.write_text(rec.lm.arpa.replace("\\end\\", "\n\\end\\"))
    with pytest.raises(ValueError, match=rf"word LM {lm_file} has changed since the model was trained"):
        decode_manifest(far, tiny_corpus / "test.jsonl", accelerator="cpu", decoding=beam_lm)
    # explicit settings still win: no LM, or another file
    plain = decode_manifest(far, tiny_corpus / "test.jsonl", accelerator="cpu", decoding=dict(beam_lm, lm={"source": "none"}))
    assert plain.decoding["lm"] is None and plain.search_score != pytest.approx(beam.search_score, rel=1e-6)
    assert greedy.search_score is None and "search_score" not in greedy.to_dict()
    assert beam.to_dict()["search_score"] == beam.search_score < 0  # log-probabilities and LM log-scores
    other = decode_manifest(far, tiny_corpus / "test.jsonl", accelerator="cpu",
                            decoding=dict(beam_lm, lm={"source": "auto", "path": str(lm_file)}))
    assert other.decoding["lm"] == str(lm_file) and "lm_sha256" not in other.decoding


def test_a_recogniser_without_lexicon_or_lm_takes_its_lexicon_from_the_manifest_and_needs_an_lm_path(
        tokenizer, tiny_corpus, tmp_path):
    """A recogniser that carries no lexicon nor LM: loading attaches nothing (only the manifest it
    was trained on); ``lexicon.source=auto`` builds the lexicon from that manifest at decoding; the
    corpus LM beside it is not taken: ``lm.source=auto`` is refused, naming decoding.lm.path."""
    corpus = copy_train_manifest(tiny_corpus, tmp_path / "corpus")
    write_arpa(estimate([["a", "b"]], 2), corpus / "lm" / "words-3gram.arpa")
    save_checkpoint(recogniser(tokenizer), tmp_path / "bare.ckpt")
    loaded = load_recogniser(tmp_path / "bare.ckpt", attention="full", training_manifest=corpus / "train.jsonl")
    assert loaded.lexicon is None and loaded.lm is None and loaded.training_manifest == str(corpus / "train.jsonl")
    lexicon, _ = lexicon_from_manifests([corpus / "train.jsonl"], tokenizer)
    beam = {"name": "beam", "beam_size": 4, "lm": {"source": "none"}}
    result = decode_manifest(loaded, tiny_corpus / "test.jsonl", accelerator="cpu", decoding=beam)
    assert result.words == "real" and result.decoding["lexicon_words"] == len(lexicon)
    with pytest.raises(FileNotFoundError, match="carries no word LM.*decoding.lm.path"):
        decode_manifest(loaded, tiny_corpus / "test.jsonl", accelerator="cpu",
                        decoding={"name": "beam", "beam_size": 4, "lm": {"source": "auto"}})
    given = decode_manifest(loaded, tiny_corpus / "test.jsonl", accelerator="cpu",
                            decoding={"name": "beam", "beam_size": 4, "lm": {"path": str(corpus / "lm" / "words-3gram.arpa")}})
    assert given.decoding["lm"] == str(corpus / "lm" / "words-3gram.arpa")
