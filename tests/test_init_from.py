"""Fine-tuning: ``init_from=CKPT`` starts a run from a checkpoint's weights
(:mod:`fastasr.training.initial_weights`) and ``FreezeLoaded`` holds them for the first updates."""

from __future__ import annotations

import logging

import pytest
import torch
from omegaconf import OmegaConf

from fastasr.data.features import FeatureConfig
from fastasr.data.tokenizer import Tokenizer
from fastasr.recognition.recogniser import Recogniser
from fastasr.training.callbacks.freeze_loaded import FreezeLoaded
from fastasr.training.config_check import ConfigError
from fastasr.training.initial_weights import InitialWeightsError, load_initial_weights
from fastasr.training.lit import ASRLitModule

MODEL = {"_target_": "fastasr.model.CTCModel", "d_model": 32, "heads": 2, "ff_dim": 64, "layers": 2,
         "dropout": 0.0, "subsampling": 4, "conv_kernel": 5, "attention": "full"}
CHARS = Tokenizer("char", ["<blank>", "|", "a", "b", "c", "d"])
PHONEMES = Tokenizer("phoneme", ["<blank>", "AA", "B", "K"])


def bundle(tokenizer: Tokenizer, bins: int = 23, **model) -> Recogniser:
    return Recogniser.from_model_config({**MODEL, **model}, tokenizer, FeatureConfig(num_mel_bins=bins))


def checkpoint(tmp_path, rec: Recogniser, seed: int = 1):
    """A checkpoint as training writes it, with random weights and a CMVN of its corpus."""
    torch.manual_seed(seed)
    lit = ASRLitModule(rec)
    lit.model.set_cmvn(torch.full((rec.feat_in,), 3.0), torch.full((rec.feat_in,), 5.0))
    state = {"state_dict": lit.state_dict(), "global_step": 7}
    lit.on_save_checkpoint(state)
    path = tmp_path / "base.ckpt"
    torch.save(state, path)
    return path, lit.model.state_dict()


def fresh(rec: Recogniser, seed: int = 2):
    torch.manual_seed(seed)
    return ASRLitModule(rec).model


def test_same_units_load_everything_but_the_corpus_statistics(tmp_path):
    path, base = checkpoint(tmp_path, bundle(CHARS))
    model = fresh(bundle(CHARS, attention="clustered-4"))  # another attention: parameter-free, loads
    report = load_initial_weights(model, bundle(CHARS, attention="clustered-4"), path)
    after = model.state_dict()
    for name, tensor in after.items():
        if name.startswith("cmvn."):
            assert torch.equal(tensor, torch.zeros_like(tensor) if name == "cmvn.mean" else torch.ones_like(tensor))
        else:
            assert torch.equal(tensor, base[name]), name
    assert report.head == "loaded" and report.shared_units == len(CHARS.vocab)
    assert set(report.new) == {"cmvn.mean", "cmvn.std"}
    assert len(report.loaded) == len(after) - 2
    lines = report.summary()
    assert lines[0].startswith(f"init_from={path}: loaded {len(after) - 2} tensors: frontend (")
    assert "encoder (" in lines[0] and "head (2 tensors)" in lines[0]
    assert lines[1] == "init_from: new cmvn.mean, cmvn.std: this corpus's feature statistics"


def test_other_units_get_a_new_output_layer(tmp_path):
    path, base = checkpoint(tmp_path, bundle(PHONEMES))
    rec = bundle(CHARS)
    model = fresh(rec)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = load_initial_weights(model, rec, path)
    after = model.state_dict()
    assert report.head == "new"
    assert torch.equal(after["head.weight"], before["head.weight"]) and after["head.weight"].shape[0] == 6
    assert torch.equal(after["encoder.layers.1.ff.0.weight"], base["encoder.layers.1.ff.0.weight"])
    assert report.new["head.weight"] == "other units: the checkpoint's are phoneme (4), this run's char (6)"
    assert any(line.startswith("init_from: new head.weight, head.bias: other units") for line in report.summary())


def test_units_of_one_kind_keep_the_rows_both_vocabularies_have(tmp_path):
    small = Tokenizer("char", ["<blank>", "|", "a", "b"])
    path, base = checkpoint(tmp_path, bundle(small))
    rec = bundle(CHARS)  # adds c, d
    model = fresh(rec)
    before = model.state_dict()["head.weight"].clone()
    report = load_initial_weights(model, rec, path)
    head = model.state_dict()["head.weight"]
    assert report.head == "partial" and report.shared_units == 4
    assert torch.equal(head[:4], base["head.weight"])  # <blank>, |, a, b: the same order in both
    assert torch.equal(head[4:], before[4:])  # c, d: as the run initialised them
    assert torch.equal(model.state_dict()["head.bias"][:4], base["head.bias"])
    assert report.new["head.weight"].startswith("4 of 6 units' rows from the checkpoint")


@pytest.mark.parametrize(("theirs", "ours", "expected"), [
    ({"layers": 3}, {}, "model.layers is 3, this run's 2"),
    ({"d_model": 64}, {}, "model.d_model is 64, this run's 32"),
    ({}, {"bins": 40}, "features.num_mel_bins is 23, this run's 40"),
])
def test_a_shape_that_cannot_load_is_refused_in_one_line(tmp_path, theirs, ours, expected):
    path, _ = checkpoint(tmp_path, bundle(CHARS, **theirs))
    bins = ours.pop("bins", 23)
    rec = bundle(CHARS, bins=bins, **ours)
    model = fresh(rec)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(InitialWeightsError) as err:
        load_initial_weights(model, rec, path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"init_from={path}: cannot load: the checkpoint's ")
    assert expected in message
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # nothing half-loaded


def test_a_missing_checkpoint_is_a_config_error(tmp_path):
    cfg = OmegaConf.create({"init_from": str(tmp_path / "nope.ckpt")})
    from fastasr.training.config_check import _check_init_from

    errors: list[str] = []
    _check_init_from(cfg, errors)
    assert errors == [f"init_from='{tmp_path / 'nope.ckpt'}': no such checkpoint file; expected the path of a "
                      "fastasr checkpoint (.ckpt) whose weights start this run, or null"]
    assert issubclass(InitialWeightsError, ConfigError)


def test_freeze_loaded_drops_the_loaded_parts_gradients_for_its_updates():
    model = fresh(bundle(CHARS))
    for parameter in model.parameters():
        parameter.grad = torch.ones_like(parameter)
    trainer = type("Trainer", (), {"global_step": 2})()
    module = type("Module", (), {"model": model})()
    callback = FreezeLoaded(updates=3)
    callback.on_before_optimizer_step(trainer, module, None)
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert all(g is None for n, g in grads.items() if n.startswith(("frontend.", "encoder.")))
    assert grads["head.weight"] is not None and grads["head.bias"] is not None
    for parameter in model.parameters():
        parameter.grad = torch.ones_like(parameter)
    trainer.global_step = 3  # the fourth update: everything trains
    callback.on_before_optimizer_step(trainer, module, None)
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(ValueError, match="updates=-1"):
        FreezeLoaded(updates=-1)


@pytest.mark.slow
def test_a_run_starts_from_a_checkpoint_and_says_what_it_loaded(tiny_corpus, tmp_path, caplog):
    """End to end: a one-step run writes a checkpoint; a second run with char units starts from it
    (encoder loaded, new output layer, the report in its first lines) and its one update, with
    FreezeLoaded, leaves the loaded part as the checkpoint has it; a run of another depth is
    refused in one line before training."""
    from test_train_eval import compose_train

    from fastasr.training.fit import train

    base = train(compose_train(tiny_corpus, tmp_path, "debug=fast", "name=base"), run_dir=tmp_path / "base")
    weights = torch.load(base.last_ckpt, map_location="cpu", weights_only=True)["state_dict"]
    cfg = compose_train(tiny_corpus, tmp_path, "debug=fast", "tokenizer=char", f"init_from={base.last_ckpt}",
                        "+callbacks.freeze_loaded._target_=fastasr.training.callbacks.FreezeLoaded",
                        "+callbacks.freeze_loaded.updates=5")
    with caplog.at_level(logging.INFO, logger="fastasr.training.fit"):
        tuned = train(cfg, run_dir=tmp_path / "tuned")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("init_from")]
    assert lines[0].startswith(f"init_from={base.last_ckpt}: loaded ")
    assert any("head.weight, head.bias: other units: the checkpoint's are phoneme" in line for line in lines)
    state = torch.load(tuned.last_ckpt, map_location="cpu", weights_only=True)["state_dict"]
    frozen = [k for k in weights if k.startswith(("model.frontend.", "model.encoder."))]
    assert frozen and all(torch.equal(state[k], weights[k]) for k in frozen)  # loaded, then held by FreezeLoaded
    assert state["model.head.weight"].shape[0] != weights["model.head.weight"].shape[0]
    deeper = compose_train(tiny_corpus, tmp_path, "debug=fast", f"init_from={base.last_ckpt}", "model.layers=2")
    with pytest.raises(InitialWeightsError, match="model.layers is 1, this run's 2"):
        train(deeper, run_dir=tmp_path / "deeper")
