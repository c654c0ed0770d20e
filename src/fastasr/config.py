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


def attention_length_cost(attention) -> str:
    """``quadratic`` or ``linear``: how the cost of an attention config (mapping, spec string,
    or None: linear) grows with the sequence length."""
    from fastasr.attention import length_cost

    return length_cost(attention)


def register_resolvers() -> None:
    """Register fastasr's resolvers once (``${unit_metric:${data.tokenizer}}``,
    ``${attention_length_cost:${attention}}``)."""
    if not OmegaConf.has_resolver("unit_metric"):
        OmegaConf.register_new_resolver("unit_metric", unit_metric)
    if not OmegaConf.has_resolver("attention_length_cost"):
        OmegaConf.register_new_resolver("attention_length_cost", attention_length_cost)
    os.environ.setdefault("PROJECT_ROOT", str(PROJECT_ROOT))


register_resolvers()
