"""Every config group option composes, and the composed objects instantiate; the values a config
derives from others are ``auto`` until one step fills them in (fastasr.training.derived_config)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from fastasr.attention import build_attention
from fastasr.config import CONFIG_DIR
from fastasr.data.features import FeatureConfig
from fastasr.data.tokenizer import Tokenizer
from fastasr.model import CTCModel
from fastasr.recognition.recogniser import DEFAULT_MODEL_TARGET, Recogniser
from fastasr.training.derived_config import resolve_train_config

GROUPS = ["data", "features", "model", "attention", "optim", "scheduler", "trainer", "logger", "recipe",
          "callbacks", "experiment", "debug"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def compose_raw(*overrides: str):
    """train.yaml as Hydra composes it: the derived values still ``auto``."""
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=False)


def compose_train(*overrides: str):
    """train.yaml as training runs it: composed, then its derived values filled in."""
    return resolve_train_config(compose_raw(*overrides))


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_of_every_group_composes(group):
    opts = options(group)
    assert opts, f"conf/{group} is empty"
    for opt in opts:
        cfg = compose_train(f"{group}={opt}")
        # every interpolation resolves (paths, attention, unit metric, …)
        OmegaConf.to_container(cfg, resolve=True)


def test_default_config_values():
    cfg = compose_train()
    assert cfg.model.attention.name == "full"
    assert cfg.model.heads * 32 == cfg.model.d_model == 192
    assert cfg.model.ff_dim == 768
    assert cfg.trainer.gradient_clip_val == 10.0
    assert cfg.optim._target_ == "torch.optim.RAdam" and cfg.optim.weight_decay == 0.01
    assert cfg.callbacks.model_checkpoint.monitor == "val/per"
    assert compose_train("data.tokenizer=char").callbacks.model_checkpoint.monitor == "val/cer"


# conf/attention option -> the spec its defaults stand for (the paper's defaults)
ATTENTION_OPTIONS = {"full": "full", "lsh": "lsh-1", "clustered": "clustered-100",
                     "i_clustered": "i-clustered-100", "oracle_top": "topk-32", "topk": "topk-32", "auto": "auto-512"}


def test_every_attention_option_is_listed():
    assert options("attention") == sorted(ATTENTION_OPTIONS)


@pytest.mark.parametrize("opt", sorted(ATTENTION_OPTIONS))
def test_attention_configs_build(opt):
    """Each conf/attention option builds its variant with every value of the file (none
    dropped or defaulted), and only LSH asks for shared Q/K."""
    cfg = compose_train(f"attention={opt}")
    given = OmegaConf.to_container(cfg.attention, resolve=True)
    attn = build_attention(given)
    assert attn.spec == ATTENTION_OPTIONS[opt]
    given.pop("name")
    assert {key: attn.hparams.get(key, "missing") for key in given} == given
    assert attn.requires_shared_qk is (opt == "lsh")


def test_attention_override_from_command_line():
    cfg = compose_train("attention=i_clustered", "attention.clusters=200", "model.layers=9")
    assert cfg.model.attention.clusters == 200 and cfg.model.layers == 9
    assert build_attention(OmegaConf.to_container(cfg.model.attention)).spec == "i-clustered-200"


def test_model_instantiates_from_config():
    cfg = compose_train("attention=clustered", "model.layers=1")
    model = instantiate(OmegaConf.to_container(cfg.model, resolve=True))(vocab_size=7, feat_in=40)  # a partial
    assert model.attention_spec == "clustered-100"
    assert len(model.encoder.layers) == 1


def test_optimizer_and_scheduler_are_partials():
    import torch

    cfg = compose_train()
    param = torch.nn.Parameter(torch.zeros(1))
    opt = instantiate(cfg.optim)([param])
    assert isinstance(opt, torch.optim.RAdam) and opt.defaults["decoupled_weight_decay"]
    sched_cfg = OmegaConf.to_container(cfg.scheduler)
    for key in ("monitor", "interval"):
        sched_cfg.pop(key)
    assert isinstance(instantiate(sched_cfg)(optimizer=opt), torch.optim.lr_scheduler.ReduceLROnPlateau)


def test_evaluate_config_composes():
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("evaluate", overrides=["ckpt_path=x.ckpt"])
        assert cfg.get("attention") is None
        cfg = compose("evaluate", overrides=["ckpt_path=x.ckpt", "attention=i_clustered"])
        assert cfg.attention.name == "i-clustered"
    assert Path(OmegaConf.to_container(cfg, resolve=True)["data"]["test_manifest"]).name == "test.jsonl"


# ----------------------------------------------------------------------------- derived values
def test_one_resolver_chooses_the_recipe_and_config_imports_nothing_above_it():
    """config.py is the bottom layer: it imports no other fastasr module and registers one resolver,
    the recipe of a corpus, which only train.yaml's defaults list uses; values are derived by
    fastasr.training.derived_config, and the YAML uses otherwise only OmegaConf's (oc.*) and Hydra's (now)."""
    code = ("import sys; from omegaconf import OmegaConf; import fastasr.config; "
            "mods = sorted(m for m in sys.modules if m.startswith('fastasr') and m not in ('fastasr', 'fastasr.config')); "
            "names = [n for n in ('unit_metric', 'matrix_attention', 'matrix_shared_qk', 'fallback', 'corpus_lm', "
            "'attention_length_cost') if OmegaConf.has_resolver(n)]; "
            "names += [] if OmegaConf.has_resolver('fastasr.recipe_of_data') else ['no recipe resolver']; "
            "sys.exit(f'{mods} {names}' if mods or names else 0)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    used = {(path.relative_to(CONFIG_DIR).as_posix(), m.group(1)) for path in CONFIG_DIR.rglob("*.yaml")
            for m in re.finditer(r"\$\{([\w.]+):", path.read_text())}
    assert {name for _, name in used} <= {"oc.select", "oc.env", "now", "fastasr.recipe_of_data"}, used
    assert {where for where, name in used if name == "fastasr.recipe_of_data"} == {"train.yaml"}


def test_the_recipe_is_the_datas_unless_named_and_no_data_config_selects_one():
    """Unless the command names a recipe, the built-in corpora (data=synthetic*) train with builtin and
    every other corpus with real_speech (fastasr.config.recipe_of_data); conf/data/*.yaml choose no
    recipe, model, trainer or scheduler setting; the composed config names its recipe."""
    from fastasr.config import recipe_of_data

    assert [recipe_of_data(d) for d in ("synthetic", "synthetic_long", "manifest", "digits", "my_corpus")] == [
        "builtin", "builtin", "real_speech", "real_speech", "real_speech"]
    for data in options("data"):
        text = (CONFIG_DIR / "data" / f"{data}.yaml").read_text()
        assert not re.search(r"^\s*-\s*override\s", text, re.M), data  # no other group chosen
        assert not re.search(r"^(model|trainer|scheduler|optim|recipe|callbacks|final_\w+):", text, re.M), data
        assert compose_raw(f"data={data}").recipe == recipe_of_data(data), data
    assert compose_raw("data=manifest", "recipe=builtin").recipe == "builtin"  # named, it wins
    assert compose_raw("data=synthetic", "recipe=real_speech").model.layers == 6


def test_the_tokenizer_a_top_level_choice_or_the_data_configs_own():
    assert compose_raw().data.tokenizer == "phoneme"  # a plain value in the data config
    assert compose_train().data.tokenizer == "phoneme"
    assert compose_train("data=digits").data.tokenizer == "char"
    assert compose_train("tokenizer=char").data.tokenizer == "char"
    assert compose_train("data=digits", "tokenizer=phoneme").data.tokenizer == "phoneme"
    cfg = compose_train("data=librispeech", "tokenizer=bpe")
    assert cfg.data.tokenizer == "bpe" and cfg.callbacks.model_checkpoint.monitor == "val/cer"
    assert compose_train("data.tokenizer=char").data.tokenizer == "char"


def test_batch_price_and_monitor_follow_the_config_unless_given():
    raw = compose_raw()
    assert raw.data.length_cost == "auto" and raw.callbacks.model_checkpoint.monitor == "auto"
    cfg = compose_train()
    assert cfg.data.length_cost == "quadratic" and cfg.callbacks.model_checkpoint.monitor == "val/per"
    assert cfg.callbacks.epoch_checkpoint.filename == "epoch{epoch:03d}-score{val/per:.4f}"
    assert compose_train("attention=clustered").data.length_cost == "linear"
    assert compose_train("data=manifest", "attention=lsh").data.length_cost == "linear"
    given = compose_train("attention=clustered", "data.length_cost=quadratic", "callbacks.model_checkpoint.monitor=val/loss")
    assert given.data.length_cost == "quadratic" and given.callbacks.model_checkpoint.monitor == "val/loss"
    assert given.callbacks.epoch_checkpoint.filename == "epoch{epoch:03d}-score{val/loss:.4f}"
    char = compose_train("tokenizer=char")
    assert char.callbacks.epoch_checkpoint.filename == "epoch{epoch:03d}-score{val/cer:.4f}"
    assert resolve_train_config(char.copy()) == char  # idempotent


def test_the_builtin_corpus_is_a_manifest_corpus_with_its_own_recipe():
    """conf/data/synthetic.yaml inherits data=manifest's keys but not its recipe (real_speech)."""
    synthetic, manifest = (OmegaConf.to_container(compose_train(*o).data, resolve=True)
                           for o in ([], ["data=manifest"]))
    differ = {k for k in synthetic.keys() | manifest.keys() if synthetic.get(k) != manifest.get(k)}
    assert differ == {"train_manifest", "dev_manifest", "test_manifest", "max_frames_per_batch",
                      "min_batches_per_epoch", "augment", "cache"}
    assert synthetic["augment"] == {**manifest["augment"], "speed_perturb": False}
    assert synthetic["cache"] == {**manifest["cache"], "mode": "auto"}  # recorded corpora build theirs
    assert compose_train().scheduler._target_.endswith("ReduceLROnPlateau")


class WideCTC(CTCModel):
    """Stands in for a new encoder: a CTCModel subclass a config names."""


def test_the_model_is_the_class_the_config_names():
    """conf/model is a Hydra partial of its _target_; the recogniser stores it as plain data and
    builds it again from a checkpoint's entry; a training model config that names no class builds
    CTCModel, a checkpoint entry must name one."""
    cfg = compose_train(f"model._target_={__name__}.WideCTC", "model.layers=1")
    tokenizer = Tokenizer("char", ["<blank>", "a", "b", "|"])
    rec = Recogniser.from_model_config(OmegaConf.to_container(cfg.model, resolve=True), tokenizer,
                                       FeatureConfig(num_mel_bins=40))
    assert type(rec.build_model()) is WideCTC and rec.build_model().head.out_features == 4
    state = rec.to_dict()
    assert state["model"]["_target_"] == f"{__name__}.WideCTC" and "_partial_" not in state["model"]
    assert type(Recogniser.from_dict(state).build_model()) is WideCTC
    with pytest.raises(ValueError, match="names no class"):
        Recogniser.from_dict({**state, "model": {k: v for k, v in state["model"].items() if k != "_target_"}})
    training = Recogniser.from_model_config({k: v for k, v in OmegaConf.to_container(cfg.model, resolve=True).items()
                                             if k != "_target_"}, tokenizer, FeatureConfig(num_mel_bins=40))
    assert training.model_target == DEFAULT_MODEL_TARGET and type(training.build_model()) is CTCModel
    with pytest.raises(ValueError, match="is not a fastasr.model.CTCModel subclass"):
        Recogniser.from_dict({**state, "model": {**state["model"], "_target_": "torch.nn.Linear"}}, source="x.ckpt")


def test_num_workers_auto_is_the_cores_less_one_between_2_and_8():
    """data.num_workers=auto (conf/data/manifest.yaml): a 2-core machine keeps 2 feature workers,
    a 16-core GPU machine gets 8, and the derived config holds the number."""
    from fastasr.training.derived_config import auto_workers

    assert [auto_workers(c) for c in (1, 2, 3, 5, 9, 16, 64)] == [2, 2, 2, 4, 8, 8, 8]
    assert auto_workers() == max(2, min(8, len(os.sched_getaffinity(0)) - 1))


def test_the_progress_bar_is_drawn_on_a_terminal_only(monkeypatch):
    """trainer.enable_progress_bar=auto: Lightning's bar when stdout (its stream) is a terminal,
    none in a file or a pipe (the epoch summary's lines stand in); true and false are kept. The
    trainer decides it as it is built; the run's config keeps ``auto``."""
    import io

    from fastasr.training.fit import progress_bar

    assert compose_raw().trainer.enable_progress_bar == "auto"
    assert compose_train().trainer.enable_progress_bar == "auto"

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert progress_bar(compose_train()) is False
    monkeypatch.setattr(sys, "stdout", Terminal())
    assert progress_bar(compose_train()) is True
    assert progress_bar(compose_train("trainer.enable_progress_bar=false")) is False
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert progress_bar(compose_train("trainer.enable_progress_bar=true")) is True


def test_the_progress_bar_refreshes_every_few_batches_and_only_where_drawn(tmp_path):
    """``callbacks.progress_bar``: Lightning's bar with its refresh every 10 batches (each
    refresh reads the step's metrics back, on a GPU a wait for the device); without a bar no
    bar callback, which Lightning would refuse beside ``enable_progress_bar=False``."""
    import lightning as L
    from lightning.pytorch.callbacks import TQDMProgressBar

    from fastasr.rundir import RunDir
    from fastasr.training.fit import build_callbacks

    def bars(*overrides):
        cfg = compose_train(*overrides)
        callbacks = build_callbacks(cfg, RunDir(tmp_path))
        L.Trainer(callbacks=callbacks, enable_progress_bar=cfg.trainer.enable_progress_bar is True, logger=False,
                  default_root_dir=str(tmp_path))  # Lightning accepts the pair
        return [c for c in callbacks if isinstance(c, TQDMProgressBar)]

    (bar,) = bars("trainer.enable_progress_bar=true")
    assert bar.refresh_rate == 10
    assert bars("trainer.enable_progress_bar=false") == []


def test_the_final_decoding_draws_its_bar_by_the_same_setting(monkeypatch):
    """The final decoding's bar (on stderr) follows trainer.enable_progress_bar as training's
    does: auto on a terminal, true and false as given (an explicit true draws it in a log too)."""
    import io

    from fastasr.training.fit import final_decoding_request

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert final_decoding_request(compose_train()).progress is False
    assert final_decoding_request(compose_train("trainer.enable_progress_bar=true")).progress is True
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert final_decoding_request(compose_train()).progress is True
    assert final_decoding_request(compose_train("trainer.enable_progress_bar=false")).progress is False


def test_num_workers_auto_is_derived_into_the_training_config():
    assert compose_raw().data.num_workers == "auto"
    cfg = compose_train()
    assert isinstance(cfg.data.num_workers, int) and cfg.data.num_workers >= 2


def test_a_runs_first_lines_show_its_input_losses_and_dropout():
    """The run summary names what a command changes beyond the model's size: the features,
    subsampling, input scaling, CMVN, SpecAugment, intermediate CTC and the budget's dropout."""
    from fastasr.training.derived_config import run_summary

    lines = run_summary(compose_train("data=manifest", "tokenizer=char", "model.dropout=0.1",
                                      "model.inter_ctc_layers=[3]", "model.inter_ctc_weight=0.3")).splitlines()
    model_line = next(line for line in lines if line.startswith("model:"))
    assert "dropout 0.1 (raised up to 0.1 by the epochs the budget affords: callbacks.budget_dropout)" in model_line
    assert ("input: 40 filterbanks at the audio rate, subsampling 4x, input x sqrt(d_model), per-utterance CMVN, "
            "SpecAugment 2 x 8 bins, 2 x 20 frames; loss CTC + intermediate CTC on layers [3] (weight 0.3)") in lines

    partial = compose_train()
    OmegaConf.update(partial, "model.spec_augment", {"time_masks": 3}, merge=False)
    assert ("SpecAugment 2 x 27 bins, 3 x 40 frames" in run_summary(partial)), \
        "keys a config leaves out are SpecAugment's defaults, as the model builds it"

    builtin = run_summary(compose_train("model.spec_augment=null", "features=fbank80_8k")).splitlines()
    assert "input: 80 filterbanks at 8000 Hz, subsampling 4x, no SpecAugment; loss CTC" in builtin
    assert any(line.startswith("model:") and "dropout 0.1, attention full" in line for line in builtin)
