"""Checkpoints of earlier versions: the recogniser entry of a checkpoint written before
``checkpoint["recogniser"]`` existed.

Then the LightningModule's hyper-parameters held the model config (with its ``attention``),
the tokenizer's state, ``feat_in`` and the filterbank settings. :func:`legacy_recogniser_state`
turns them into the plain-data entry :meth:`fastasr.recognition.recogniser.Recogniser.from_dict` reads
(format 1: the model config names its class, or none: ``fastasr.model.CTCModel``), so
:func:`fastasr.recognition.recogniser.load_recogniser` loads old and new checkpoints alike. Plain data in,
plain data out: this module imports no other fastasr module (``fastasr.recognition.recogniser`` imports it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LEGACY_FORMAT = 1  # a recogniser entry whose model config may name no class
_LEGACY_KEYS = {"model", "tokenizer", "feat_in"}  # what the hyper-parameters held before the bundle
_DERIVED = ("vocab_size", "feat_in")  # come from the tokenizer and the features, never from the model config


def split_attention(model: dict[str, Any]) -> Any:
    """Check a model config (current or legacy) and take its ``attention`` out of it (in place);
    returns the attention spec. ``ValueError`` when it sets ``vocab_size`` / ``feat_in`` or has
    no ``attention``."""
    given = sorted(set(_DERIVED) & set(model))
    if given:
        raise ValueError(f"model config sets {given}; they come from the tokenizer and the features")
    if "attention" not in model:
        raise ValueError("model config has no 'attention'; expected a spec string or mapping")
    return model.pop("attention")


def legacy_recogniser_state(hparams: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The recogniser entry (``Recogniser.to_dict()`` layout, no lexicon nor LM) of a checkpoint
    whose ``hyper_parameters`` hold ``model``, ``tokenizer``, ``feat_in`` (and ``features``);
    None when they do not (not such a checkpoint). The filterbank settings default to
    ``{"num_mel_bins": feat_in}`` when the hyper-parameters have none. Raises ``ValueError`` for a
    model config that sets ``vocab_size`` / ``feat_in`` or has no ``attention``."""
    if not hparams or not _LEGACY_KEYS <= set(hparams):
        return None
    model = dict(hparams["model"])
    model.pop("_partial_", None)
    attention = split_attention(model)
    features = dict(hparams.get("features") or {"num_mel_bins": int(hparams["feat_in"])})
    return {"format": LEGACY_FORMAT, "model": model, "attention": attention,
            "tokenizer": dict(hparams["tokenizer"]), "features": features, "lexicon": None, "lm": None}
