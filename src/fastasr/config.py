"""Hydra/OmegaConf glue: custom resolvers and the config directory."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf

CONFIG_DIR = Path(__file__).resolve().parents[2] / "conf"
PROJECT_ROOT = CONFIG_DIR.parent


def unit_metric(tokenizer_kind: str) -> str:
    """Name of the unit error rate for a tokenizer kind: ``per`` (phonemes) or ``cer`` (chars)."""
    if tokenizer_kind not in ("phoneme", "char"):
        raise ValueError(f"data.tokenizer: '{tokenizer_kind}'; expected 'phoneme' or 'char'")
    return "per" if tokenizer_kind == "phoneme" else "cer"


def register_resolvers() -> None:
    """Register fastasr's resolvers once (``${unit_metric:${data.tokenizer}}``)."""
    if not OmegaConf.has_resolver("unit_metric"):
        OmegaConf.register_new_resolver("unit_metric", unit_metric)
    os.environ.setdefault("PROJECT_ROOT", str(PROJECT_ROOT))


register_resolvers()
