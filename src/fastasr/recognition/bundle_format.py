"""The plain-data format of the recogniser entry a checkpoint carries (``checkpoint["recogniser"]``,
written by :meth:`fastasr.recognition.recogniser.Recogniser.to_dict`): its version, the check a
loaded entry passes, and the model config's attention taken apart from the rest.

Plain data in, plain data out: this module imports no other fastasr module, so the config check
(``fastasr.training.config_check``) reads it without loading torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The version of the entry's layout; a checkpoint of another version is refused (:func:`check_format`).
FORMAT = 2
_DERIVED = ("vocab_size", "feat_in")  # come from the tokenizer and the features, never from the model config
#: How a checkpoint of an older layout is replaced: training again with this fastasr (its run's
#: overrides are in config.yaml beside its checkpoints).
RETRAIN = "re-train it with this fastasr (python train.py with the overrides of its run's config.yaml)"


def check_format(state: Mapping[str, Any], source: str) -> None:
    """``ValueError`` in one line, naming ``source``, for an entry of another layout than
    :data:`FORMAT`: an older one (1: the model config named no class) says how to replace it."""
    version = state.get("format")
    if version == FORMAT:
        return
    if isinstance(version, int) and version > FORMAT:
        raise ValueError(f"{source}: recogniser format {version}; this fastasr reads format {FORMAT}: "
                         "decode it with the fastasr that wrote it, or a newer one")
    raise ValueError(f"{source}: recogniser format {version}, written by an older fastasr; this one reads "
                     f"format {FORMAT}: {RETRAIN}")


def check_checkpoint_entry(checkpoint: Mapping[str, Any], key: str, source: str) -> Mapping[str, Any]:
    """The recogniser entry ``checkpoint[key]`` (its keys and format are checked where it is
    read); a checkpoint without one gets a one-line ``ValueError``: written by fastasr before
    checkpoints carried the entry (its hyper-parameters hold the model config and the tokenizer:
    format 0), or not by fastasr training."""
    state = checkpoint.get(key)
    if state is None:
        hparams = checkpoint.get("hyper_parameters") or {}
        if {"model", "tokenizer", "feat_in"} <= set(hparams):
            raise ValueError(f"{source}: recogniser format 0 (no '{key}' entry), written by an older fastasr; "
                             f"this one reads format {FORMAT}: {RETRAIN}")
        raise ValueError(f"{source}: no '{key}' entry; expected a checkpoint written by fastasr training")
    return state


def split_attention(model: dict[str, Any]) -> Any:
    """Check a model config and take its ``attention`` out of it (in place); returns the
    attention spec. ``ValueError`` when it sets ``vocab_size`` / ``feat_in`` or has no
    ``attention``."""
    given = sorted(set(_DERIVED) & set(model))
    if given:
        raise ValueError(f"model config sets {given}; they come from the tokenizer and the features")
    if "attention" not in model:
        raise ValueError("model config has no 'attention'; expected a spec string or mapping")
    return model.pop("attention")
