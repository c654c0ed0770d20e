"""Every config group option composes, and the composed objects instantiate."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from fastasr.attention import build_attention
from fastasr.config import CONFIG_DIR

GROUPS = ["data", "features", "model", "attention", "optim", "scheduler", "trainer", "logger", "recipe",
          "callbacks", "experiment", "debug"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def compose_train(*overrides: str):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=False)


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
                     "i_clustered": "i-clustered-100", "oracle_top": "topk-32", "topk": "topk-32", "auto": "auto-384"}


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
    model = instantiate(OmegaConf.to_container(cfg.model, resolve=True), vocab_size=7, feat_in=40)
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
