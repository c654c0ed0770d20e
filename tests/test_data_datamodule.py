"""ASRDataModule on the tiny corpus: batches, filtering, vocab reuse, configs, Lightning."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import torchaudio.compliance.kaldi as kaldi
from omegaconf import OmegaConf

from fastasr.data.audio import load_audio
from fastasr.data.datamodule import ASRDataModule
from fastasr.data.tokenizer import Tokenizer, ctc_min_frames

CONF = Path(__file__).resolve().parents[1] / "conf"


def make_dm(corpus, **kw):
    args = dict(train_manifest=str(corpus / "train.jsonl"), dev_manifest=str(corpus / "dev.jsonl"),
                test_manifest=str(corpus / "test.jsonl"), features={"num_mel_bins": 40, "dither": 1.0},
                max_frames_per_batch=2000)
    args.update(kw)
    return ASRDataModule(**args)


def check_batch(batch, feat_dim, tok):
    B, T, F = batch["features"].shape
    assert F == feat_dim and batch["features"].dtype == torch.float32
    assert batch["feature_lengths"].shape == (B,) and int(batch["feature_lengths"].max()) == T
    assert batch["targets"].dtype == torch.long and batch["targets"].shape[0] == B
    assert int(batch["target_lengths"].max()) == batch["targets"].shape[1]
    assert len(batch["ids"]) == len(batch["texts"]) == B
    assert B * T <= 2000 or B == 1
    for b in range(B):
        n, s = int(batch["feature_lengths"][b]), int(batch["target_lengths"][b])
        assert torch.all(batch["features"][b, n:] == 0) and torch.all(batch["targets"][b, s:] == 0)
        assert torch.all(batch["targets"][b, :s] > 0)
        units = tok.decode(batch["targets"][b, :s].tolist())
        assert " ".join(tok.units_to_words(units)) == batch["texts"][b]


def test_batches_on_tiny_corpus(tiny_corpus):
    dm = make_dm(tiny_corpus)
    dm.setup("fit")
    tok = dm.tokenizer
    assert tok.kind == "phoneme" and tok.vocab[0] == "<blank>" and "|" in tok.vocab
    assert dm.feature_dim == 40
    mean, std = dm.cmvn_stats
    assert mean.shape == std.shape == (40,) and torch.all(std > 0)
    seen = []
    for batch in dm.train_dataloader():
        check_batch(batch, 40, tok)
        seen += batch["ids"]
    assert sorted(seen) == sorted(u.id for u in dm.datasets["train"].utterances)
    dev = {u.id: u for u in dm.datasets["dev"].utterances}
    for batch in dm.val_dataloader():
        check_batch(batch, 40, tok)
        for b, utt_id in enumerate(batch["ids"]):  # the numbers: Kaldi's fbank of the file, undithered
            wav = load_audio(dev[utt_id].audio_filepath, 16000)
            ref = kaldi.fbank(wav[None] * 32768, num_mel_bins=40, dither=0.0, energy_floor=0.0)
            torch.testing.assert_close(batch["features"][b, : ref.shape[0]], ref)
            assert int(batch["feature_lengths"][b]) == ref.shape[0]
    dm.setup("test")
    assert sum(len(b["ids"]) for b in dm.test_dataloader()) == 2
    # the CMVN statistics were cached next to the manifest and are reused
    assert list(tiny_corpus.glob("train.cmvn-*.json"))
    dm2 = make_dm(tiny_corpus)
    dm2.setup("fit")
    torch.testing.assert_close(dm2.cmvn_stats[0], mean)


def test_char_tokenizer_texts(tiny_corpus):
    dm = make_dm(tiny_corpus, tokenizer="char")
    dm.setup("validate")
    batch = next(iter(dm.val_dataloader()))
    utt = {u.id: u for u in dm.datasets["dev"].utterances}[batch["ids"][0]]
    assert batch["texts"][0] == " ".join(utt.text.lower().split())


def test_label_longer_than_frames_is_dropped(tiny_corpus, tmp_path, caplog):
    lines = (tiny_corpus / "train.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    for r in recs:
        r["audio_filepath"] = str(tiny_corpus / r["audio_filepath"])
    recs[0]["phonemes"] += " | t ə" * 600  # 1200 more labels, far more than its frames
    recs[1]["duration"] = 0.1  # 8 frames: fewer than its labels
    manifest = tmp_path / "train.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in recs))
    dm = make_dm(tiny_corpus, train_manifest=str(manifest))
    with caplog.at_level(logging.INFO, logger="fastasr.data.datamodule"):
        dm.setup("fit")
    assert len(dm.datasets["train"]) == len(recs) - 2
    msgs = [r.getMessage() for r in caplog.records]
    assert any(f"train: dropped 2 of {len(recs)} utterances whose labels are longer than their frames" in m
               for m in msgs), msgs
    # with a larger subsampling factor, more utterances are dropped
    dm8 = make_dm(tiny_corpus, train_manifest=str(manifest), dev_manifest=None, subsampling_factor=8)
    dm8.setup("fit")
    assert len(dm8.datasets["train"]) < len(dm.datasets["train"])
    assert ctc_min_frames([1, 1, 2, 2, 2, 3]) == 9


def test_given_vocab_and_dataloader_for(tiny_corpus):
    built = make_dm(tiny_corpus)
    built.setup("fit")
    dm = ASRDataModule(test_manifest=str(tiny_corpus / "test.jsonl"), vocab=built.tokenizer.state_dict(),
                       features={"num_mel_bins": 40}, cmvn_stats={"mean": [0.0] * 40, "std": [1.0] * 40})
    dm.setup("test")  # no train manifest needed
    assert dm.tokenizer == built.tokenizer and dm.cmvn_stats[1].shape == (40,)
    n = sum(len(b["ids"]) for b in dm.dataloader_for(tiny_corpus / "dev.jsonl"))
    assert n == 2
    with pytest.raises(ValueError, match="train_manifest is not set"):
        ASRDataModule(dev_manifest=str(tiny_corpus / "dev.jsonl")).setup("validate")


def test_unknown_units_in_eval_are_dropped_or_raise(tiny_corpus, caplog):
    tiny_vocab = Tokenizer("phoneme", ["<blank>", "|", "ə"])
    dm = make_dm(tiny_corpus, vocab=tiny_vocab, test_manifest=str(tiny_corpus / "dev.jsonl"))
    with pytest.raises(ValueError, match="no utterance left"), caplog.at_level(logging.WARNING):
        dm.setup("test")
    assert any("cannot encode" in r.getMessage() for r in caplog.records)
    strict = make_dm(tiny_corpus, vocab=tiny_vocab, on_bad_utterance="raise")
    with pytest.raises(ValueError, match="not in the vocabulary"):
        strict.setup("test")


def test_hydra_configs_instantiate(tiny_corpus):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from fastasr.training.derived_config import resolve_train_config

    # the data options are composed (they inherit conf/data/manifest.yaml through their defaults)
    overrides = [f"paths.data_dir={tiny_corpus.parent}", "features=fbank40", "data.num_workers=0",
                 *(f"data.{split}_manifest={tiny_corpus / f'{split}.jsonl'}" for split in ("train", "dev", "test"))]
    for name in ("synthetic", "manifest"):
        with initialize_config_dir(str(CONF), version_base="1.3"):
            cfg = resolve_train_config(compose("train", overrides=[f"data={name}", *overrides]))
        dm = instantiate(cfg.data)
        assert isinstance(dm, ASRDataModule)
        assert dm.feature_dim == 40 and dm.subsampling_factor == 1 and dm.tokenizer_kind == "phoneme"
    assert OmegaConf.load(CONF / "features" / "fbank80.yaml").num_mel_bins == 80
    synth = OmegaConf.load(CONF / "data" / "synthetic.yaml")
    assert OmegaConf.to_container(synth)["train_manifest"] == "${paths.data_dir}/synthetic/train.jsonl"


class _Consumer(pl.LightningModule):
    """Stands in for the real module: checks the batches Lightning hands over."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.epochs_seen = []

    def training_step(self, batch, _):
        assert batch["features"].dim() == 3
        return (self.w * batch["features"].mean()).sum()

    def on_train_epoch_start(self):
        self.epochs_seen.append(self.trainer.train_dataloader.batch_sampler.epoch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_sets_sampler_epoch(tiny_corpus):
    dm = make_dm(tiny_corpus)
    model = _Consumer()
    trainer = pl.Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=0, accelerator="cpu",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, datamodule=dm)
    assert model.epochs_seen == [0, 1]


def test_min_batches_per_epoch_lowers_the_training_budget_only(tiny_corpus, caplog):
    dm = make_dm(tiny_corpus, max_frames_per_batch=100_000, min_batches_per_epoch=5)
    dm.setup("fit")
    lengths = dm.datasets["train"].frame_lengths()
    with caplog.at_level(logging.INFO, logger="fastasr.data.datamodule"):
        train = list(dm.train_dataloader())
    assert dm.train_frames_per_batch == max(sum(lengths) // 5, max(lengths)) < 100_000
    assert len(train) >= 5 and "data.min_batches_per_epoch=5" in caplog.text
    assert len(list(dm.val_dataloader())) == 1  # evaluation keeps the large budget: one batch of 2
    assert len(list(make_dm(tiny_corpus, max_frames_per_batch=100_000).train_dataloader())) == 1
    # data.min_frames_per_batch: the lowered budget stops at the floor (fewer, larger batches)
    floored = make_dm(tiny_corpus, max_frames_per_batch=100_000, min_batches_per_epoch=5,
                      min_frames_per_batch=sum(lengths) // 2)
    floored.setup("fit")
    assert floored.train_frames_per_batch == sum(lengths) // 2
    assert 2 <= len(list(floored.train_dataloader())) < len(train)


def test_sortagrad_orders_the_first_training_epochs_only(tiny_corpus):
    dm = make_dm(tiny_corpus, max_frames_per_batch=300, sortagrad_epochs=1)
    dm.setup("fit")
    train = dm.train_dataloader().batch_sampler
    assert train.sortagrad_epochs == 1 and dm.val_dataloader().batch_sampler.sortagrad_epochs == 0
    lengths = dm.datasets["train"].frame_lengths()
    longest = [max(lengths[i] for i in b) for b in train]
    assert len(longest) > 2 and longest == sorted(longest)
    with pytest.raises(ValueError, match="sortagrad_epochs -2"):
        make_dm(tiny_corpus, sortagrad_epochs=-2)


def test_null_sample_rate_is_the_training_audio_rate(tiny_corpus, tmp_path):
    from fastasr.data.audio import write_wav
    from fastasr.data.manifest import read_manifest, write_manifest

    # the tiny corpus down-sampled to 8 kHz: features at 8 kHz, not up-sampled to 16
    (tmp_path / "wav").mkdir()
    for split in ("train", "dev", "test"):
        rows = []
        for u in read_manifest(tiny_corpus / f"{split}.jsonl"):
            path = tmp_path / "wav" / f"{u.id}.wav"
            write_wav(path, load_audio(u.audio_filepath, 8000).numpy(), 8000)
            rows.append({"audio_filepath": str(path), "duration": u.duration, "text": u.text,
                         "phonemes": u.phonemes})
        write_manifest(tmp_path / f"{split}.jsonl", rows)
    dm = make_dm(tmp_path, features={"num_mel_bins": 40, "sample_rate": None})
    dm.setup("fit")
    assert dm.feature_config.sample_rate == 8000
    batch = next(iter(dm.val_dataloader()))
    utt = dm.datasets["dev"].utterances[[u.id for u in dm.datasets["dev"].utterances].index(batch["ids"][0])]
    ref = kaldi.fbank(load_audio(utt.audio_filepath)[None] * 32768, num_mel_bins=40, dither=0.0,
                      energy_floor=0.0, sample_frequency=8000)
    torch.testing.assert_close(batch["features"][0, : ref.shape[0]], ref)
    # 16 kHz audio stays at 16 kHz
    dm16 = make_dm(tiny_corpus, features={"num_mel_bins": 40, "sample_rate": None})
    dm16.setup("fit")
    assert dm16.feature_config.sample_rate == 16000


def test_duration_bounds_warn_when_they_drop_much_of_the_audio(tiny_corpus, caplog):
    """A bound that drops over 5 % of the training audio is a warning naming the keys; a few
    outliers are an info line. The manifest config keeps utterances up to 40 s (LibriSpeech's)."""
    durations = sorted(json.loads(line)["duration"] for line in open(tiny_corpus / "train.jsonl"))
    with caplog.at_level(logging.INFO, logger="fastasr.data.datamodule"):
        make_dm(tiny_corpus, max_duration=durations[len(durations) // 2]).setup("fit")
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "outside" in r.getMessage()]
    assert len(warned) == 1 and "data.max_duration" in warned[0].getMessage()
    assert "% of the audio" in warned[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fastasr.data.datamodule"):
        make_dm(tiny_corpus, max_duration=durations[-1] - 1e-3).setup("fit")  # the longest one only
    dropped = [r for r in caplog.records if "outside" in r.getMessage()]
    share = durations[-1] / sum(durations)
    assert len(dropped) == 1 and dropped[0].levelno == (logging.WARNING if share > 0.05 else logging.INFO)
    assert OmegaConf.load(CONF / "data" / "manifest.yaml").max_duration == 40.0
