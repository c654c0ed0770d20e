"""callbacks.budget_dropout: dropout where the training budget affords many epochs, the model's
own rate where it affords few; the decision survives a resume and reaches the results."""

from __future__ import annotations

import logging

import lightning as L
import pytest
import torch
from torch import nn

from fastasr.kernels.layers.dropout import Dropout
from fastasr.training.callbacks.budget_dropout import (
    BudgetDropout,
    dropout_decision,
    max_dropout,
    raise_dropout,
)


def _model(p: float = 0.0) -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), Dropout(p), nn.Sequential(nn.Linear(4, 4), nn.Dropout(p)))


def _rates(model: nn.Module) -> list[float]:
    return [m.p for m in model.modules() if isinstance(m, nn.Dropout)]


def test_a_budget_of_many_epochs_sets_the_rate_on_every_dropout_module(caplog):
    model = _model(0.0)
    cb = BudgetDropout(p=0.1, epochs=[20, 40])
    with caplog.at_level(logging.INFO, logger="fastasr.training.callbacks.budget_dropout"):
        decision = cb.decide(1 / 50, 86, model)
    assert _rates(model) == [0.1, 0.1]
    assert decision == {"epochs": 50.0, "dropout": 0.1, "update": 86}
    assert "the budget affords about 50 epochs (dropout 0 below 20, 0.1 from 40): dropout 0.100 from update 86" \
        in caplog.text


def test_a_budget_of_few_epochs_keeps_the_models_rate(caplog):
    model = _model(0.0)
    with caplog.at_level(logging.INFO, logger="fastasr.training.callbacks.budget_dropout"):
        decision = BudgetDropout(p=0.1, epochs=[20, 40]).decide(1 / 12, 400, model)
    assert _rates(model) == [0.0, 0.0]
    assert decision == {"epochs": 12.0, "dropout": None, "update": 400}
    assert "about 12 epochs" in caplog.text and "dropout 0.000 from update 400" in caplog.text


@pytest.mark.parametrize("epochs, rate", [(None, 0.0), (5, 0.0), (19.9, 0.0), (20, 0.0), (25, 0.025), (30, 0.05),
                                          (39, 0.095), (40, 0.1), (400, 0.1)])
def test_the_rate_rises_linearly_between_the_bounds(epochs, rate):
    assert BudgetDropout(p=0.1, epochs=[20, 40]).rate(epochs) == pytest.approx(rate)
    assert BudgetDropout(p=0.2, epochs=[30, 30]).rate(epochs) == (0.2 if epochs is not None and epochs >= 30 else 0.0)


def test_a_run_resumed_without_a_decision_estimates_from_the_epochs_it_has_done():
    """A checkpoint of a run without the callback: at the end of its 10th epoch half the budget is spent."""
    model = _model(0.0)
    decision = BudgetDropout(p=0.1, epochs=[20, 40]).decide(0.5, 900, model, epochs_done=10)
    assert decision == {"epochs": 20.0, "dropout": None, "update": 900} and _rates(model) == [0.0, 0.0]


def test_no_budget_keeps_the_models_rate():
    model = _model(0.0)
    decision = BudgetDropout().decide(0.0, 10, model)
    assert decision == {"epochs": None, "dropout": None, "update": 10} and _rates(model) == [0.0, 0.0]


def test_a_model_with_more_dropout_keeps_its_own():
    model = _model(0.2)
    BudgetDropout(p=0.1, epochs=[2, 2]).decide(1 / 40, 10, model)
    assert _rates(model) == [0.2, 0.2]
    raise_dropout(model, 0.3)
    assert _rates(model) == [0.3, 0.3] and max_dropout(model) == 0.3 and max_dropout(nn.Linear(2, 2)) == 0.0


def test_the_rate_changes_what_the_module_computes():
    """Setting ``p`` on the module is what training reads: the forward drops elements."""
    model = _model(0.0).train()
    x = torch.ones(64, 4)
    layer = model[1]
    assert torch.equal(layer(x), x)
    raise_dropout(model, 0.5)
    out = layer(x)
    assert 0 < int((out == 0).sum()) < out.numel() and torch.allclose(out[out != 0], torch.tensor(2.0))


def test_the_decision_is_taken_once_and_survives_a_resume():
    model = _model(0.0)
    cb = BudgetDropout(p=0.1, epochs=[20, 40])
    cb.decide(1 / 60, 50, model)
    state = cb.state_dict()

    resumed_model, resumed = _model(0.0), BudgetDropout(p=0.1, epochs=[20, 40])
    resumed.load_state_dict(state)
    assert resumed.decision == cb.decision
    resumed.on_train_start(None, resumed_model)
    assert _rates(resumed_model) == [0.1, 0.1]

    # an older checkpoint without a decision (restored for the test) does not erase it
    resumed.load_state_dict({"decision": None})
    assert resumed.decision == cb.decision


def test_dropout_decision_reads_the_trainers_callback():
    cb = BudgetDropout()
    trainer = type("T", (), {"callbacks": [cb]})()
    assert dropout_decision(trainer) is None
    cb.decide(1 / 45, 30, _model())
    assert dropout_decision(trainer) == cb.decision
    assert dropout_decision(type("T", (), {"callbacks": []})()) is None


@pytest.mark.parametrize("bad, message", [
    ({"p": 1.0}, r"p=1.0; expected a dropout rate in \[0, 1\)"),
    ({"p": -0.1}, r"p=-0.1"),
    ({"epochs": [0, 10]}, r"epochs=\[0, 10\]; expected \[none_below, full_from\] with 0 < none_below ≤ full_from"),
    ({"epochs": [40, 20]}, r"epochs=\[40, 20\]"),
    ({"epochs": [30]}, r"epochs=\[30\]"),
])
def test_bad_settings_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        BudgetDropout(**bad)


class _Tiny(L.LightningModule):
    """A linear model with one dropout module, trained on 4 batches an epoch."""

    def __init__(self):
        super().__init__()
        self.net = _model(0.0)
        self.rates: list[float] = []  # the dropout rate of every training step

    def training_step(self, batch, batch_idx):
        self.rates.append(self.net[1].p)
        return self.net(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4)


def _fit(max_epochs: int, callback: BudgetDropout, tmp_path, ckpt_path=None) -> tuple[L.Trainer, _Tiny]:
    module = _Tiny()
    trainer = L.Trainer(max_epochs=max_epochs, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path, callbacks=[callback],
                        enable_checkpointing=False)
    trainer.fit(module, ckpt_path=ckpt_path)
    return trainer, module


@pytest.mark.parametrize("bounds, after", [([1, 2], 0.1), ([2, 4], 0.05), ([4, 8], 0.0)])
def test_in_a_real_fit_the_first_epoch_decides_and_the_second_trains_with_it(tmp_path, bounds, after):
    """max_epochs=3 is the budget: the first epoch spent a third of it."""
    trainer, module = _fit(3, BudgetDropout(p=0.1, epochs=bounds), tmp_path)
    assert module.rates == pytest.approx([0.0] * 4 + [after] * 8)  # the first epoch at the model's rate, then
    assert dropout_decision(trainer) == {"epochs": 3.0, "dropout": after or None, "update": 4}
    assert float(trainer.callback_metrics["train/dropout"]) == pytest.approx(after)


def test_a_resumed_fit_trains_with_the_decision_of_the_first(tmp_path):
    trainer, _ = _fit(2, BudgetDropout(p=0.1, epochs=[2, 2]), tmp_path)
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    _, module = _fit(3, BudgetDropout(p=0.1, epochs=[2, 2]), tmp_path, ckpt_path=tmp_path / "last.ckpt")
    assert module.rates == [0.1] * 4  # the third epoch, from a fresh model built at the rate 0.0
