"""Hydra/OmegaConf glue: custom resolvers and the config directory."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf

CONFIG_DIR = Path(__file__).resolve().parents[2] / "conf"
PROJECT_ROOT = CONFIG_DIR.parent


def unit_metric(tokenizer_kind: str) -> str:
    """Name of the unit error rate for a tokenizer kind: ``per`` (phonemes) or ``cer``
    (chars, and subwords, which are scored on their characters)."""
    kinds = ("phoneme", "char", "bpe", "unigram")
    if tokenizer_kind not in kinds:
        raise ValueError(f"data.tokenizer: '{tokenizer_kind}'; expected one of {', '.join(kinds)}")
    return "per" if tokenizer_kind == "phoneme" else "cer"


def fallback(value, default):
    """``value`` unless it is null, else ``default`` (``${fallback:${oc.select:tokenizer,null},char}``:
    the top-level choice, else the data config's own default)."""
    return default if value is None else value


def register_resolvers() -> None:
    """Register fastasr's resolvers once (``${unit_metric:${data.tokenizer}}``, ``${fallback:a,b}``)."""
    if not OmegaConf.has_resolver("unit_metric"):
        OmegaConf.register_new_resolver("unit_metric", unit_metric)
    if not OmegaConf.has_resolver("fallback"):
        OmegaConf.register_new_resolver("fallback", fallback)
    os.environ.setdefault("PROJECT_ROOT", str(PROJECT_ROOT))


register_resolvers()
