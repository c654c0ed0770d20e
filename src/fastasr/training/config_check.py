"""Start-up check of a training config: every mistake found at once, before any audio is read.

``train()`` calls :func:`check_train_config` on the resolved config
(:func:`fastasr.training.derived_config.resolve_train_config`) before anything else, so a typo in an attention name, a
parameter out of range, a missing manifest or a phoneme model over a manifest without
``phonemes`` fails in a second with a message naming the config key, not minutes later
(after the manifest's audio headers and the CMVN pass) or hours later (at the first
validation). Manifests are read as JSON lines only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from fastasr.attention import build_attention
from fastasr.data.augment import AugmentConfig
from fastasr.data.feature_cache import CacheConfig
from fastasr.data.features import FeatureConfig
from fastasr.data.phone_sets import folding
from fastasr.data.tokenizer import KINDS
from fastasr.recognition.recogniser import DEFAULT_MODEL_TARGET, model_class
from fastasr.training.derived_config import AUTO, AUTO_WORKERS, DERIVED_PRECISIONS, ConfigError

__all__ = ["ConfigError", "LIGHTNING_PRECISIONS", "check_train_config", "plain"]

#: The batch prices ``data.length_cost`` takes (:func:`fastasr.attention.length_cost`'s).
LENGTH_COSTS = ("quadratic", "linear")


#: The ``trainer.precision`` strings Lightning's ``Trainer`` takes (``lightning.fabric.connector``'s
#: ``_PRECISION_INPUT_STR`` and ``_PRECISION_INPUT_STR_ALIAS``; a test holds the two equal), written
#: out so that checking a config does not import Lightning: ``train.py``'s preflight refuses a
#: config with torch alone loaded (:mod:`fastasr.cli.preflight`).
LIGHTNING_PRECISIONS = frozenset({
    "16", "16-mixed", "16-true", "32", "32-true", "64", "64-true", "bf16", "bf16-mixed", "bf16-true",
    "transformer-engine", "transformer-engine-float16",
})


def plain(node: Any) -> Any:
    """A config node as plain containers (resolved); anything else as it is."""
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def _check_attention(cfg: DictConfig, errors: list[str]) -> None:
    spec = plain(cfg.model.get("attention"))
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
    model = plain(cfg.model)
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
    config = plain(cfg.model)
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
            section.from_dict(plain(data.get(key)))
        except (ValueError, TypeError) as err:  # their messages mostly name the key already
            errors.append(str(err) if f"data.{key}" in str(err) else f"data.{key}: {err}")
    try:
        fc = FeatureConfig.from_dict(plain(cfg.data.features))
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
    rate, epochs = dropout.get("p"), plain(dropout.get("epochs"))
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
            errors.append(f"final_tuning.{key}={plain(tuning.get(key))}; expected a non-empty list of numbers")
    extend = tuning.get("extend_edges")
    if extend is not None and not (isinstance(extend, int) and not isinstance(extend, bool) and extend >= 0):
        errors.append(f"final_tuning.extend_edges={extend!r}; expected how many values each axis may grow past "
                      "an edge its best point sits on: an integer ≥ 0 (0: the grid as given)")
    beam = tuning.get("beam_size")
    if beam is not None and not (isinstance(beam, int) and beam >= 1):
        errors.append(f"final_tuning.beam_size={beam!r}; expected a beam width ≥ 1 for the dev grid, or null (the "
                      "final decoding's own)")
    sizes = plain(tuning.get("frequent_words")) or []
    if not isinstance(sizes, list) or not all(isinstance(n, int) and n >= 0 for n in sizes):
        errors.append(f"final_tuning.frequent_words={sizes}; expected a list of word counts ≥ 0 (0: the training "
                      "words alone)")
    elif any(sizes):
        import wordfreq

        language = tuning.get("language") or "en"
        if language not in wordfreq.available_languages():
            errors.append(f"final_tuning.language={language!r}: wordfreq has no list for it; expected one of "
                          f"{', '.join(sorted(wordfreq.available_languages()))}")


def _check_init_from(cfg: DictConfig, errors: list[str]) -> None:
    """``init_from``: null, or a checkpoint file (its contents are judged when it is loaded,
    :func:`fastasr.training.initial_weights.load_initial_weights`)."""
    source = cfg.get("init_from")
    if source is None:
        return
    if not isinstance(source, str) or not source or not Path(source).is_file():
        errors.append(f"init_from={source!r}: no such checkpoint file; expected the path of a fastasr "
                      "checkpoint (.ckpt) whose weights start this run, or null")


def check_train_config(cfg: DictConfig) -> None:
    """Check a resolved training config (:func:`fastasr.training.derived_config.resolve_train_config`)
    without reading audio or changing it: it only reports.

    The values are judged first, then each section is given to the class that reads it
    (:func:`_check_components`).

    Raises:
        ConfigError: listing every problem found, each with its config key, the value and
            what was expected.
    """
    errors: list[str] = []
    _check_attention(cfg, errors)
    if not errors:
        _check_model_values(cfg, errors)
        length_cost = cfg.data.get("length_cost")
        if length_cost not in LENGTH_COSTS:  # auto stays only where the attention is unknown
            errors.append(f"data.length_cost={length_cost!r}; expected {' or '.join(LENGTH_COSTS)}, or {AUTO!r} "
                          "(the attention's) before the config is resolved")
    model = not errors  # the model check repeats attention and size errors less clearly
    _check_data(cfg, errors)
    _check_trainer(cfg, errors)
    _check_callbacks(cfg, errors)
    _check_final_tuning(cfg, errors)
    _check_init_from(cfg, errors)
    _check_components(cfg, model, errors)
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
