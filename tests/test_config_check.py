"""Config mistakes fail at start-up, naming the key, before any audio is read."""

from __future__ import annotations

import json
import re

import pytest
import soundfile
from omegaconf import OmegaConf
from test_train_eval import compose_train as compose_raw

from fastasr.training.config_check import LIGHTNING_PRECISIONS, ConfigError, check_train_config
from fastasr.training.derived_config import resolve_train_config
from fastasr.training.fit import train


def compose_train(corpus, out, *overrides):
    """A training config as train() checks it: composed, then resolved."""
    return resolve_train_config(compose_raw(corpus, out, *overrides))


@pytest.fixture
def no_audio_reads(monkeypatch):
    """Any audio access fails the test: the check must not need it."""

    def forbidden(*args, **kwargs):
        raise AssertionError("audio was read before the config was checked")

    monkeypatch.setattr(soundfile, "read", forbidden)
    monkeypatch.setattr(soundfile, "info", forbidden)


def test_the_default_config_passes(tiny_corpus, tmp_path, no_audio_reads):
    check_train_config(compose_train(tiny_corpus, tmp_path))
    check_train_config(compose_train(tiny_corpus, tmp_path, "attention=i_clustered", "trainer=ddp"))


@pytest.mark.parametrize("overrides, key, expected", [
    (["attention.name=clusterd"], "attention.name='clusterd'", "unknown attention spec"),
    (["attention=clustered", "attention.clusters=0"], "attention.clusters=0", "expected an integer >= 1"),
    (["attention=i_clustered", "attention.clusters=-3"], "attention.clusters=-3", "out of range"),
    (["attention=clustered", "attention.bits=64"], "attention.bits=64", r"\[1, 63\]"),
    (["attention=i_clustered", "+attention.cluster=8"], "attention.cluster=8", "unknown parameter 'cluster'"),
    (["attention=lsh"], "model:", "set model.shared_qk=true"),
    (["model.heads=5"], "model.heads=5", "expected a divisor of model.d_model=32"),
    (["model.subsampling=3"], "model.subsampling=3", "expected one of 1, 2, 4, 8"),
    (["model.layers=-1"], "model.layers=-1", "expected an integer ≥ 1"),
    (["model.layers=0"], "model.layers=0", "expected an integer ≥ 1"),
    (["model.layers=four"], "model.layers='four'", "expected an integer ≥ 1"),
    (["model.d_model=0"], "model.d_model=0", "expected an integer ≥ 1"),
    (["model.dropout=1.5"], "model.dropout=1.5", r"expected a number in \[0, 1\)"),
    (["features.channels=0"], "features.channels=0", "expected ≥ 1"),
    (["data.max_frames_per_batch=0"], "data.max_frames_per_batch=0", "expected > 0"),
    (["data.sortagrad_epochs=-1"], "data.sortagrad_epochs=-1", "expected ≥ 0"),
    (["trainer.precision=fp8"], "trainer.precision='fp8'", "expected one of"),
    (["callbacks.nonfinite_loss.max_consecutive=0"], "callbacks.nonfinite_loss.max_consecutive=0", "≥ 1"),
    (["++callbacks.budget_dropout.p=1.0"], "callbacks.budget_dropout.p=1.0", r"a number in \[0, 1\)"),
    (["++callbacks.budget_dropout.epochs=[40,20]"], "callbacks.budget_dropout.epochs=[40, 20]",
     "expected \\[none_below, full_from\\]"),
    (["tokenizer=wordpiece"], "tokenizer='wordpiece'", "expected one of phoneme, char, bpe, unigram"),
    (["data.phone_folding=cmu"], "data.phone_folding", "expected one of"),
    (["data.cache.mode=sometimes"], "data.cache.mode 'sometimes'", "expected one of off, auto, build"),
    (["data.augment.noise_prob=2"], "data.augment.noise_prob 2", r"expected within \[0, 1\]"),
    (["final_tuning={lm_weight:[1.0],word_score:[0.0],frequent_words:[0,-5]}"], "final_tuning.frequent_words",
     "expected a list of word counts ≥ 0"),
    (["final_tuning={lm_weight:[1.0],word_score:[0.0],frequent_words:[0,100],language:xx}"],
     "final_tuning.language='xx'", "wordfreq has no list for it"),
    (["final_tuning={lm_weight:[],word_score:[0.0]}"], "final_tuning.lm_weight", "non-empty list"),
    (["final_tuning={lm_weight:[1.0],word_score:[0.0],beam_size:0}"], "final_tuning.beam_size=0", "beam width ≥ 1"),
    (["final_tuning={lm_weight:[1.0],word_score:[0.0],extend_edges:-1}"], "final_tuning.extend_edges=-1",
     "integer ≥ 0"),
])
def test_a_bad_value_names_its_key(tiny_corpus, tmp_path, no_audio_reads, overrides, key, expected):
    with pytest.raises(ConfigError) as err:
        check_train_config(compose_train(tiny_corpus, tmp_path, *overrides))
    line = next(ln for ln in str(err.value).splitlines() if key in ln)
    assert re.search(expected, line), line


def test_the_precisions_are_lightnings():
    """``trainer.precision`` takes what Lightning's ``Trainer`` takes: the check's list, written out
    so that it need not import Lightning, is Lightning's own."""
    import typing

    from lightning.fabric.connector import _PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS

    lightnings = set(typing.get_args(_PRECISION_INPUT_STR)) | set(typing.get_args(_PRECISION_INPUT_STR_ALIAS))
    assert LIGHTNING_PRECISIONS == lightnings


def test_missing_manifests_and_every_problem_at_once(tiny_corpus, tmp_path, no_audio_reads):
    cfg = compose_train(tiny_corpus, tmp_path, "attention=clustered", "attention.bits=99",
                        f"data.dev_manifest={tmp_path / 'nope.jsonl'}")
    with pytest.raises(ConfigError) as err:
        check_train_config(cfg)
    message = str(err.value)
    assert "attention.bits=99" in message and f"data.dev_manifest={tmp_path / 'nope.jsonl'}: no such file" in message
    # the test manifest is checked only when the run tests
    cfg = compose_train(tiny_corpus, tmp_path, f"data.test_manifest={tmp_path / 'nope.jsonl'}", "test=false")
    check_train_config(cfg)


def test_a_phoneme_model_needs_phonemes_in_the_manifest(tiny_corpus, tmp_path, no_audio_reads):
    lines = [json.loads(ln) for ln in (tiny_corpus / "train.jsonl").read_text().splitlines()]
    for r in lines:
        r.pop("phonemes")
        r["audio_filepath"] = str(tiny_corpus / r["audio_filepath"])
    manifest = tmp_path / "chars_only.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(ConfigError, match=r"tokenizer=phoneme.*data.train_manifest=.*chars_only.jsonl has none "
                                          r"on 10 of 10 lines \(first: line 1\); add phonemes or use tokenizer=char"):
        check_train_config(compose_train(tiny_corpus, tmp_path, f"data.train_manifest={manifest}"))
    check_train_config(compose_train(tiny_corpus, tmp_path, f"data.train_manifest={manifest}", "tokenizer=char"))


def test_the_check_reports_and_changes_nothing(tiny_corpus, tmp_path, no_audio_reads):
    """The check judges a resolved config (fastasr.training.derived_config) and leaves it as it is;
    an unresolved one is refused where a derived value is still auto; a matrix member that is no
    train spec is refused by the resolving."""
    resolved = compose_train(tiny_corpus, tmp_path)
    before = OmegaConf.to_container(resolved)
    assert check_train_config(resolved) is None and OmegaConf.to_container(resolved) == before
    assert resolved.data.length_cost == "quadratic"  # full attention's batch price
    with pytest.raises(ConfigError, match=r"data.length_cost='auto'; expected quadratic or linear"):
        check_train_config(compose_raw(tiny_corpus, tmp_path))
    with pytest.raises(ConfigError, match=r"member='fulll': unknown attention spec 'fulll'"):
        compose_train(tiny_corpus, tmp_path, "experiment=matrix_member", "member=fulll")
    with pytest.raises(ConfigError, match=r"model: model._target_ 'torch.nn.Linear' is not a fastasr.model.CTCModel "):
        check_train_config(compose_train(tiny_corpus, tmp_path, "model._target_=torch.nn.Linear"))


def test_train_checks_the_config_first(tiny_corpus, tmp_path, no_audio_reads):
    with pytest.raises(ConfigError, match="attention.clusters=0"):
        train(compose_raw(tiny_corpus, tmp_path, "name=cfg", "attention=clustered", "attention.clusters=0"))
    assert not (tmp_path / "runs" / "cfg").exists()


def test_the_preflight_resolves_and_checks_once_and_refuses_in_one_line(tiny_corpus, tmp_path, monkeypatch, capsys):
    """train.py's preflight (a Hydra callback, before the run directory exists) resolves the config
    once and checks it once; a refused config is one line on stderr and exit status 2."""
    from hydra import compose, initialize_config_dir
    from test_train_eval import TINY_MODEL, data_overrides

    import fastasr.training.config_check
    import fastasr.training.derived_config
    from fastasr.cli.preflight import TrainPreflight
    from fastasr.config import CONFIG_DIR

    calls = []
    for module, name in ((fastasr.training.derived_config, "resolve_train_config"),
                         (fastasr.training.config_check, "check_train_config")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda cfg, real=real, name=name: (calls.append(name), real(cfg))[1])

    def compose_with_hydra(*overrides):
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            return compose("train", overrides=[*data_overrides(tiny_corpus), *TINY_MODEL, f"paths.output_dir={tmp_path}",
                                               *overrides], return_hydra_config=True)

    TrainPreflight().on_run_start(compose_with_hydra())
    assert calls == ["resolve_train_config", "check_train_config"]
    with pytest.raises(SystemExit) as refused:
        TrainPreflight().on_run_start(compose_with_hydra("attention=clustered", "attention.clusters=0"))
    assert refused.value.code == 2
    assert capsys.readouterr().err.startswith("train.py: invalid config:")
    assert not (tmp_path / "runs").exists()
