"""Start-up check of a training config: every mistake found at once, before any audio is read.

``train()`` calls :func:`check_train_config` first, so a typo in an attention name, a
parameter out of range, a missing manifest or a phoneme model over a manifest without
``phonemes`` fails in a second with a message naming the config key, not minutes later
(after the manifest's audio headers and the CMVN pass) or hours later (at the first
validation). Manifests are read as JSON lines only.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from fastasr.attention import build_attention
from fastasr.config import max_time_seconds
from fastasr.data.augment import AugmentConfig
from fastasr.data.feature_cache import CacheConfig
from fastasr.data.features import FeatureConfig
from fastasr.data.phone_sets import folding
from fastasr.data.tokenizer import KINDS
from fastasr.recognition.bundle_format import split_attention
from fastasr.recognition.recogniser import DEFAULT_MODEL_TARGET, model_class
from fastasr.rundir import RunDir
from fastasr.training.derived_config import AUTO_WORKERS, DERIVED_PRECISIONS, derive_train_config


class ConfigError(ValueError):
    """One or more config values are unusable; the message lists each with its key."""


#: The ``trainer.precision`` strings Lightning's ``Trainer`` takes (``lightning.fabric.connector``'s
#: ``_PRECISION_INPUT_STR`` and ``_PRECISION_INPUT_STR_ALIAS``; a test holds the two equal), written
#: out so that checking a config does not import Lightning: ``train.py``'s preflight refuses a
#: config with torch alone loaded (:mod:`fastasr.cli.preflight`).
LIGHTNING_PRECISIONS = frozenset({
    "16", "16-mixed", "16-true", "32", "32-true", "64", "64-true", "bf16", "bf16-mixed", "bf16-true",
    "transformer-engine", "transformer-engine-float16",
})


def _container(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def _check_attention(cfg: DictConfig, errors: list[str]) -> None:
    spec = _container(cfg.model.get("attention"))
    if isinstance(spec, Mapping):
        # first the name alone, then each parameter, so the message names the faulty key
        try:
            build_attention({"name": spec.get("name")})
        except ValueError as err:
            errors.append(f"attention.name={spec.get('name')!r}: {err}")
            return
        for key, value in spec.items():
            if key == "name":
                continue
            try:
                build_attention({"name": spec["name"], key: value})
            except ValueError as err:
                errors.append(f"attention.{key}={value!r}: {err}")
    else:
        try:
            build_attention(spec)
        except ValueError as err:
            errors.append(f"model.attention={spec!r}: {err}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_model_values(cfg: DictConfig, errors: list[str]) -> None:
    """The sizes every encoder has, judged one by one so that each error names its key (the
    model's own checks, run by :func:`_check_model`, see only what it was built with)."""
    model = _container(cfg.model)
    for key, minimum in (("layers", 1), ("d_model", 1), ("heads", 1), ("ff_dim", 1)):
        if key not in model:
            continue
        value = model[key]
        if not _is_int(value) or value < minimum:
            errors.append(f"model.{key}={value!r}; expected an integer ≥ {minimum}")
    d_model, heads = model.get("d_model"), model.get("heads")
    if _is_int(d_model) and _is_int(heads) and d_model >= 1 and heads >= 1 and d_model % heads:
        errors.append(f"model.heads={heads}; expected a divisor of model.d_model={d_model} (each head gets "
                      "d_model / heads dimensions)")
    dropout = model.get("dropout")
    if dropout is not None and not (_is_number(dropout) and 0 <= dropout < 1):
        errors.append(f"model.dropout={dropout!r}; expected a number in [0, 1)")
    subsampling = model.get("subsampling")
    if subsampling is not None and subsampling not in (1, 2, 4, 8):
        errors.append(f"model.subsampling={subsampling!r}; expected one of 1, 2, 4, 8")


def _check_model(cfg: DictConfig, errors: list[str]) -> None:
    """Build the model the config names on the meta device (no memory, no weights), as the
    recogniser will (:meth:`fastasr.recognition.recogniser.Recogniser.build_model`: the class ``_target_``
    names, a CTCModel subclass, as a partial completed with the data's sizes): its own checks run.
    ``feat_in`` is ``data.features.num_mel_bins`` when that is a positive integer, else the default
    (:func:`_check_components` names a bad one)."""
    bins = OmegaConf.select(cfg, "data.features.num_mel_bins", default=None)
    feat_in = bins if _is_int(bins) and bins > 0 else FeatureConfig.num_mel_bins
    config = _container(cfg.model)
    try:
        model_class(config.get("_target_") or DEFAULT_MODEL_TARGET)
        with torch.device("meta"):
            build = instantiate(config, _partial_=True, _recursive_=False, _convert_="all")
            build(vocab_size=2, feat_in=feat_in)
    except (InstantiationException, ValueError, TypeError) as err:
        errors.append(f"model: {err.__cause__ or err}")  # the model's own message, not Hydra's wrapper


def _check_components(cfg: DictConfig, model: bool, errors: list[str]) -> None:
    """Each section that a class reads, given to that class: the model (``model``: when its
    values passed), the phone folding, the feature cache, the augmentation and the features."""
    data = cfg.data
    if model:
        _check_model(cfg, errors)
    if data.get("phone_folding") is not None:
        try:
            folding(str(data.phone_folding))
        except ValueError as err:
            errors.append(f"data.phone_folding: {err}")
    for key, section in (("cache", CacheConfig), ("augment", AugmentConfig)):
        try:
            section.from_dict(_container(data.get(key)))
        except (ValueError, TypeError) as err:  # their messages mostly name the key already
            errors.append(str(err) if f"data.{key}" in str(err) else f"data.{key}: {err}")
    try:
        fc = FeatureConfig.from_dict(_container(cfg.data.features))
    except (ValueError, TypeError) as err:
        errors.append(f"data.features: {err}")
        return
    if fc.sample_rate is not None and not fc.sample_rate > 0:
        errors.append(f"features.sample_rate={fc.sample_rate}; expected > 0, or null for the training audio's own rate")
    for key in ("num_mel_bins", "frame_length_ms", "frame_shift_ms"):
        if not getattr(fc, key) > 0:
            errors.append(f"features.{key}={getattr(fc, key)}; expected > 0")
    if fc.channels is not None and fc.channels < 1:
        errors.append(f"features.channels={fc.channels}; expected ≥ 1, or null for any")


def _manifest_path(cfg: DictConfig, split: str, errors: list[str]) -> Path | None:
    key = f"{split}_manifest"
    if OmegaConf.is_missing(cfg.data, key) or cfg.data.get(key) in (None, ""):
        errors.append(f"data.{key} is not set; expected the path of a JSON-lines manifest")
        return None
    path = Path(str(cfg.data.get(key)))
    if not path.is_file():
        errors.append(f"data.{key}={path}: no such file")
        return None
    return path


def _check_phonemes(path: Path, key: str, errors: list[str]) -> None:
    """Every line of a phoneme model's manifest needs ``phonemes`` (JSON only, no audio)."""
    lines = missing = 0
    first = None
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            lines += 1
            try:
                record = json.loads(raw)
            except json.JSONDecodeError:
                continue  # the manifest reader reports and skips it
            if not isinstance(record, dict) or not record.get("phonemes"):
                missing += 1
                first = first or lineno
    if missing:
        errors.append(
            f"tokenizer=phoneme (data.tokenizer) needs a 'phonemes' field, but data.{key}={path} has none on "
            f"{missing} of {lines} lines (first: line {first}); add phonemes or use tokenizer=char"
        )


def _check_data(cfg: DictConfig, errors: list[str]) -> None:
    data = cfg.data
    splits = ["train", "dev"] + (["test"] if cfg.get("test") else [])
    paths = {split: _manifest_path(cfg, split, errors) for split in splits}
    if data.get("tokenizer") not in KINDS:
        errors.append(f"tokenizer={data.get('tokenizer')!r} (data.tokenizer); expected one of {', '.join(KINDS)}")
    elif data.get("tokenizer") == "phoneme" and data.get("vocab") is None:
        for split, path in paths.items():
            if path is not None:
                _check_phonemes(path, f"{split}_manifest", errors)
    if not int(data.get("max_frames_per_batch", 1)) > 0:
        errors.append(f"data.max_frames_per_batch={data.max_frames_per_batch}; expected > 0")
    if data.get("max_batch_size") is not None and not int(data.max_batch_size) > 0:
        errors.append(f"data.max_batch_size={data.max_batch_size}; expected > 0 or null")
    if int(data.get("sortagrad_epochs", 0)) < 0:
        errors.append(f"data.sortagrad_epochs={data.sortagrad_epochs}; expected ≥ 0")
    workers = data.get("num_workers", 0)
    if workers != AUTO_WORKERS and not (isinstance(workers, int) and workers >= 0):
        errors.append(f"data.num_workers={workers!r}; expected an integer ≥ 0 or {AUTO_WORKERS!r}")
    if data.get("on_bad_utterance", "skip") not in ("skip", "raise"):
        errors.append(f"data.on_bad_utterance={data.on_bad_utterance!r}; expected 'skip' or 'raise'")


def _check_trainer(cfg: DictConfig, errors: list[str]) -> None:
    trainer = cfg.get("trainer") or {}
    precision = str(trainer.get("precision", "32-true"))
    if precision not in LIGHTNING_PRECISIONS | set(DERIVED_PRECISIONS):
        errors.append(f"trainer.precision={precision!r}; expected one of {sorted(LIGHTNING_PRECISIONS | set(DERIVED_PRECISIONS))}")
    if int(trainer.get("num_nodes", 1)) < 1:
        errors.append(f"trainer.num_nodes={trainer.num_nodes}; expected ≥ 1")


def _check_callbacks(cfg: DictConfig, errors: list[str]) -> None:
    callbacks = cfg.get("callbacks") or {}
    guard = callbacks.get("nonfinite_loss") or {}
    if guard and int(guard.get("max_consecutive", 1)) < 1:
        errors.append(f"callbacks.nonfinite_loss.max_consecutive={guard.max_consecutive}; expected ≥ 1")
    step_ckpt = callbacks.get("step_checkpoint") or {}
    if step_ckpt and step_ckpt.get("every_n_train_steps") is not None and int(step_ckpt.every_n_train_steps) < 1:
        errors.append(f"callbacks.step_checkpoint.every_n_train_steps={step_ckpt.every_n_train_steps}; expected ≥ 1")
    dropout = callbacks.get("budget_dropout") or {}
    rate, epochs = dropout.get("p"), _container(dropout.get("epochs"))
    if rate is not None and not (_is_number(rate) and 0 <= rate < 1):
        errors.append(f"callbacks.budget_dropout.p={rate!r}; expected the dropout rate of a run with many epochs, "
                      "a number in [0, 1)")
    if epochs is not None and not (isinstance(epochs, list) and len(epochs) == 2 and all(map(_is_number, epochs))
                                   and 0 < epochs[0] <= epochs[1]):
        errors.append(f"callbacks.budget_dropout.epochs={epochs!r}; expected [none_below, full_from]: no dropout "
                      "below the first number of epochs, p from the second, 0 < none_below ≤ full_from")


def _check_final_tuning(cfg: DictConfig, errors: list[str]) -> None:
    tuning = cfg.get("final_tuning")
    if not tuning:
        return
    for key in ("lm_weight", "word_score"):
        if not list(tuning.get(key) or []):
            errors.append(f"final_tuning.{key}={_container(tuning.get(key))}; expected a non-empty list of numbers")
    extend = tuning.get("extend_edges")
    if extend is not None and not (isinstance(extend, int) and not isinstance(extend, bool) and extend >= 0):
        errors.append(f"final_tuning.extend_edges={extend!r}; expected how many values each axis may grow past "
                      "an edge its best point sits on: an integer ≥ 0 (0: the grid as given)")
    beam = tuning.get("beam_size")
    if beam is not None and not (isinstance(beam, int) and beam >= 1):
        errors.append(f"final_tuning.beam_size={beam!r}; expected a beam width ≥ 1 for the dev grid, or null (the "
                      "final decoding's own)")
    sizes = _container(tuning.get("frequent_words")) or []
    if not isinstance(sizes, list) or not all(isinstance(n, int) and n >= 0 for n in sizes):
        errors.append(f"final_tuning.frequent_words={sizes}; expected a list of word counts ≥ 0 (0: the training "
                      "words alone)")
    elif any(sizes):
        import wordfreq

        language = tuning.get("language") or "en"
        if language not in wordfreq.available_languages():
            errors.append(f"final_tuning.language={language!r}: wordfreq has no list for it; expected one of "
                          f"{', '.join(sorted(wordfreq.available_languages()))}")


def check_train_config(cfg: DictConfig) -> DictConfig:
    """Check a composed training config without reading audio: the config training runs, i.e.
    with its derived values (:func:`fastasr.training.derived_config.derive_train_config`, on a copy:
    ``cfg`` is not changed). Returns that derived copy, checked.

    The values are judged first, then each section is given to the class that reads it
    (:func:`_check_components`).

    Raises:
        ConfigError: listing every problem found, each with its config key, the value and
            what was expected.
    """
    try:
        cfg = derive_train_config(copy.deepcopy(cfg))
    except ValueError as err:  # a matrix member that is no train spec: nothing else can be derived
        raise ConfigError(f"invalid config:\n  {err}") from None
    errors: list[str] = []
    _check_attention(cfg, errors)
    if not errors:
        _check_model_values(cfg, errors)
    model = not errors  # the model check repeats attention and size errors less clearly
    _check_data(cfg, errors)
    _check_trainer(cfg, errors)
    _check_callbacks(cfg, errors)
    _check_final_tuning(cfg, errors)
    _check_components(cfg, model, errors)
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
    return cfg


# ---------------------------------------------------------------------- the run directory
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
        here = dict(_container(cfg.model))
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

            here_features = asdict(FeatureConfig.from_dict(_container(cfg.data.features)))
            diffs += _diff(dict(state["features"]), here_features, "features", skip_none_here=True)
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
    before, now = _trained_for(saved), _trained_for(_container(cfg))

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
            saved = _container(OmegaConf.load(run_dir.config_file))
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
