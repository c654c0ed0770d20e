"""The run directory's guard: what a training command would do to the run it writes into,
checked before anything is written.

:func:`check_run_dir` returns the checkpoint a training resumes, or refuses in one line
(:class:`RunRefused`) a command that would resume a checkpoint of another model, attention,
output units, features or training manifest, or re-test a finished run it does not train
further. ``train()`` and ``train.py``'s preflight (:mod:`fastasr.cli.preflight`) call it after
the config check (:mod:`fastasr.training.config_check`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from fastasr.attention import build_attention
from fastasr.config import max_time_seconds
from fastasr.data.features import FeatureConfig
from fastasr.recognition.bundle_format import split_attention
from fastasr.recognition.recogniser import DEFAULT_MODEL_TARGET, model_class
from fastasr.rundir import RunDir
from fastasr.training.config_check import ConfigError, plain


class RunRefused(ConfigError):
    """The command would resume or overwrite a run it does not belong to; nothing was written."""


_NEW_NAME = "name=<new name>"


def _describe(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_describe(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _diff(there: Any, here: Any, key: str, skip_none_here: bool = False) -> list[str]:
    """``key: <there> in the run, <here> now`` for every leaf that differs."""
    if isinstance(there, Mapping) and isinstance(here, Mapping):
        out: list[str] = []
        for k in sorted(set(there) | set(here), key=str):
            out += _diff(there.get(k), here.get(k), f"{key}.{k}", skip_none_here)
        return out
    if there == here or (skip_none_here and here is None):
        return []
    return [f"{key}={_describe(here)} (the run has {_describe(there)})"]


def _attention_diff(there: Any, here: Any) -> list[str]:
    """``attention=<spec> (the run has <spec>)``, or the settings that differ under one spec."""
    try:
        a, b = build_attention(there), build_attention(here)
    except (ValueError, TypeError):
        return [] if there == here else [f"attention={_describe(here)} (the run has {_describe(there)})"]
    if a.spec != b.spec or type(a) is not type(b):
        return [f"attention={b.spec} (the run has {a.spec})"]
    return _diff(dict(a.hparams), dict(b.hparams), "attention")


def resume_differences(cfg: DictConfig, ckpt: Mapping[str, Any], saved: Mapping[str, Any] | None) -> list[str]:
    """What the command's (derived) config ``cfg`` asks for that the checkpoint ``ckpt`` (its
    ``recogniser`` entry: model, attention, output units, features) and the run's saved
    ``config.yaml`` (``saved``: the training manifest) were not trained with, one
    ``key=<here> (the run has <there>)`` each. A model key the checkpoint lacks counts only when
    its value here is not the model class's default (a checkpoint older than the option)."""
    import inspect

    state = ckpt.get("recogniser") or {}
    diffs: list[str] = []
    if state.get("model") is not None:
        there = dict(state["model"])
        there.pop("_partial_", None)
        here = dict(plain(cfg.model))
        here.pop("_partial_", None)
        attention_here = split_attention(here) if "attention" in here else None
        there.setdefault("_target_", DEFAULT_MODEL_TARGET)
        here.setdefault("_target_", DEFAULT_MODEL_TARGET)
        try:
            defaults = {name: p.default for name, p in
                        inspect.signature(model_class(str(here["_target_"]))).parameters.items()
                        if p.default is not inspect.Parameter.empty}
        except (ValueError, TypeError):
            defaults = {}
        for key in [k for k in here if k not in there and k in defaults]:
            if here[key] == defaults[key] or (isinstance(defaults[key], tuple) and here[key] == list(defaults[key])):
                here.pop(key)
        diffs += _diff(there, here, "model")
        if "attention" in state and attention_here is not None:
            diffs += _attention_diff(state["attention"], attention_here)
    tokenizer = state.get("tokenizer") or {}
    if tokenizer.get("kind") and cfg.data.get("tokenizer") and tokenizer["kind"] != cfg.data.tokenizer:
        diffs.append(f"tokenizer={cfg.data.tokenizer} (the run has {tokenizer['kind']})")
    if state.get("features") is not None and cfg.data.get("features") is not None:
        try:
            from dataclasses import asdict

            here_features = asdict(FeatureConfig.from_dict(plain(cfg.data.features)))
            there_features = {**asdict(FeatureConfig()), **dict(state["features"])}  # keys added since at their defaults
            diffs += _diff(there_features, here_features, "features", skip_none_here=True)
        except (ValueError, TypeError):
            pass  # the config check names a bad features value
    train_there = OmegaConf.select(OmegaConf.create(dict(saved)), "data.train_manifest", default=None) \
        if saved else None
    train_here = cfg.data.get("train_manifest") if "train_manifest" in cfg.data and \
        not OmegaConf.is_missing(cfg.data, "train_manifest") else None
    if train_there and train_here and Path(str(train_there)).resolve() != Path(str(train_here)).resolve():
        diffs.append(f"data.train_manifest={train_here} (the run has {train_there})")
    return diffs


def _trained_for(saved: Mapping[str, Any] | None) -> dict[str, Any]:
    trainer = (saved or {}).get("trainer") or {}
    return {key: trainer.get(key) for key in ("max_epochs", "max_steps", "max_time")}


def _asks_for_more(cfg: DictConfig, saved: Mapping[str, Any] | None) -> bool:
    """Whether ``cfg`` trains longer than the run's saved config did: a larger
    ``trainer.max_epochs``, ``max_steps`` or ``max_time``."""
    before, now = _trained_for(saved), _trained_for(plain(cfg))

    def seconds(value: Any) -> float | None:
        try:
            return None if value is None else max_time_seconds(value)
        except ValueError:  # not a wall-clock budget this can compare
            return None

    for key in ("max_epochs", "max_steps"):
        if now[key] is not None and before[key] is not None and int(now[key]) > int(before[key]) >= 0:
            return True
    after, earlier = seconds(now["max_time"]), seconds(before["max_time"])
    return after is not None and earlier is not None and after > earlier


def check_run_dir(cfg: DictConfig, run_dir: Any) -> str | None:
    """The checkpoint this training resumes (``cfg.ckpt_path``: null | auto | last | PATH, see
    :meth:`fastasr.rundir.RunDir.resolve_ckpt_path`, whose errors it passes on), or None for a fresh start, after making
    sure that the command does not damage the run it would write into; reads, writes nothing.

    ``cfg``: the derived training config. Refused (:class:`RunRefused`, one line saying what
    differs and what to type instead):

    * resuming a checkpoint whose model, attention, output units or features, or whose run's
      training manifest, differ from the command's (the weights could not be loaded, or the run
      would silently become another experiment);
    * ``ckpt_path=auto`` in a finished run (``fit_done.json``) when the command does not train
      longer than the run did (a larger ``trainer.max_epochs``, ``max_steps`` or ``max_time``):
      it would only re-test the old model and overwrite its results. ``ckpt_path=last`` continues
      a finished run explicitly.
    """
    import torch

    run_dir = RunDir(run_dir)
    requested = cfg.get("ckpt_path")
    ckpt_path = run_dir.resolve_ckpt_path(requested)  # FileExistsError, FileNotFoundError: their own messages
    if ckpt_path is None:
        return None
    saved = None
    if run_dir.config_file.is_file():
        try:
            saved = plain(OmegaConf.load(run_dir.config_file))
        except Exception:  # a torn config.yaml: the checkpoint still says what the model is
            saved = None
    state = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
    diffs = resume_differences(cfg, state, saved)
    own = requested in ("auto", "last")
    if diffs:
        fresh = _NEW_NAME if own else f"ckpt_path=null (or {_NEW_NAME})"
        shown = "; ".join(diffs[:4]) + (f"; and {len(diffs) - 4} more" if len(diffs) > 4 else "")
        raise RunRefused(f"this command differs from the run it would resume ({ckpt_path}): {shown}. Nothing was "
                         f"written; for a new run with these settings add {fresh}")
    done = run_dir.read_fit_done()
    if done is not None and requested == "auto" and not _asks_for_more(cfg, saved):
        raise RunRefused(
            f"run '{run_dir.name}' has finished training ({run_dir.fit_done_file}: epoch {done.get('epochs')}, "
            f"step {done.get('global_step')}); nothing was written. For a new run add {_NEW_NAME}; to train this one "
            "further raise trainer.max_epochs or trainer.max_time, or add ckpt_path=last")
    return ckpt_path
