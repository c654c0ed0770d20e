"""A NaN/inf loss skips that batch's update (warning + count); several in a row stop the run."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import lightning as L
import pytest
import torch
from test_train_eval import compose_train

import fastasr.training.fit
from fastasr.training.callbacks.nonfinite_loss import NonFiniteLossError
from fastasr.training.fit import train
from fastasr.training.lit import ASRLitModule


def poison(monkeypatch, ids: set[str] | None, value: float = float("nan")) -> None:
    """Make the loss of every training batch holding one of ``ids`` (all: None) non-finite,
    with non-finite gradients too."""
    loss_fn = ASRLitModule._loss

    def poisoned(self, batch):
        loss, log_probs, lengths = loss_fn(self, batch)
        if self.training and (ids is None or ids & set(batch["ids"])):
            loss = loss * value
        return loss, log_probs, lengths

    monkeypatch.setattr(ASRLitModule, "_loss", poisoned)


class WeightWatch(L.Callback):
    """Whether the weights changed over each training step, by the batch's utterance ids."""

    def __init__(self) -> None:
        self.changed: dict[str, bool] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._before = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        after = pl_module.state_dict()
        self.changed[" ".join(batch["ids"])] = any(not torch.equal(after[k], v) for k, v in self._before.items())


def add_callback(monkeypatch, callback: L.Callback) -> None:
    build = fastasr.training.fit.build_callbacks
    monkeypatch.setattr(fastasr.training.fit, "build_callbacks", lambda cfg, run_dir: [*build(cfg, run_dir), callback])


def test_a_nan_loss_skips_that_update_and_training_goes_on(tiny_corpus, tmp_path, monkeypatch, caplog):
    poison(monkeypatch, {"train_00003"})
    watch = WeightWatch()
    add_callback(monkeypatch, watch)
    with caplog.at_level(logging.WARNING):
        result = train(compose_train(tiny_corpus, tmp_path, "name=nan", "trainer.max_epochs=1", "test=false",
                                     "data.max_batch_size=1", "model.subsampling=2"))
    assert watch.changed.pop("train_00003") is False  # the poisoned batch changed nothing
    assert watch.changed and all(watch.changed.values())  # every other batch did
    assert "non-finite loss" in caplog.text and "update skipped" in caplog.text and "train_00003" in caplog.text
    ckpt = torch.load(result.last_ckpt, map_location="cpu", weights_only=True)
    assert ckpt["callbacks"]["NonFiniteLossGuard"] == {"skipped": 1}
    assert json.loads((Path(result.run_dir) / "fit_done.json").read_text())["global_step"] == 10
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())


def test_several_nonfinite_losses_in_a_row_stop_the_run_naming_the_utterances(tiny_corpus, tmp_path, monkeypatch):
    poison(monkeypatch, None, float("inf"))
    with pytest.raises(NonFiniteLossError, match="3 consecutive batches.*max_consecutive=3") as err:
        train(compose_train(tiny_corpus, tmp_path, "name=diverged", "trainer.max_epochs=1", "test=false",
                            "data.max_batch_size=1", "model.subsampling=2",
                            "callbacks.nonfinite_loss.max_consecutive=3"))
    message = str(err.value)
    assert message.count("train_000") == 3 and "step 0:" in message and "step 2:" in message
