"""Hydra/OmegaConf glue: custom resolvers, the config directory, config sections → dataclasses."""

from __future__ import annotations

import os
from dataclasses import fields
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


def matrix_attention(member: str) -> str:
    """The attention spec of the matrix member trained for train spec ``member``
    (``shared-full`` → ``full``); the rule is :func:`fastasr.matrix.rules.member_attention`."""
    from fastasr.matrix.rules import member_attention

    return member_attention(member)


def matrix_shared_qk(member: str) -> bool:
    """Whether the matrix member trained for train spec ``member`` shares Q/K (``shared-full``
    and LSH); the rule is :func:`fastasr.matrix.rules.member_shared_qk`."""
    from fastasr.matrix.rules import member_shared_qk

    return member_shared_qk(member)


def corpus_lm(train_manifest: str | None) -> str | None:
    """The word 3-gram LM of the corpus whose training manifest is ``train_manifest``:
    ``lm/words-3gram.arpa`` beside it (:func:`fastasr.lm.corpus_lm_path`; ``make lm`` builds it);
    None without a training manifest."""
    from fastasr.lm.arpa import corpus_lm_path

    return None if train_manifest in (None, "???") else str(corpus_lm_path(train_manifest))


def fallback(value, default):
    """``value`` unless it is null, else ``default`` (``${fallback:${oc.select:tokenizer,null},char}``:
    the top-level choice, else the data config's own default)."""
    return default if value is None else value


def dataclass_from_mapping(cls: type, cfg, section: str):
    """An instance of the dataclass ``cls`` from a config section: a mapping (or DictConfig)
    → ``cls(**cfg)``; None → ``cls()``; an instance → itself. Unknown keys raise
    ``ValueError`` naming ``section`` (e.g. ``data.augment``) and the accepted keys."""
    if cfg is None:
        return cls()
    if isinstance(cfg, cls):
        return cfg
    known = {f.name for f in fields(cls)}
    cfg = dict(cfg)
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ValueError(f"{section}: unknown key(s) {unknown}; expected some of {sorted(known)}")
    return cls(**cfg)


def attention_length_cost(attention) -> str:
    """``quadratic`` or ``linear``: how the cost of an attention config (mapping, spec string,
    or None: linear) grows with the sequence length."""
    from fastasr.attention import length_cost

    return length_cost(attention)


_RESOLVERS = {
    "unit_metric": unit_metric,            # ${unit_metric:${data.tokenizer}} -> per | cer
    "matrix_attention": matrix_attention,  # ${matrix_attention:${member}} -> attention spec
    "matrix_shared_qk": matrix_shared_qk,  # ${matrix_shared_qk:${member}} -> model.shared_qk
    "fallback": fallback,                  # ${fallback:a,b} -> a unless null, else b
    "corpus_lm": corpus_lm,                # ${corpus_lm:<train manifest>} -> <its dir>/lm/words-3gram.arpa
    "attention_length_cost": attention_length_cost,  # ${attention_length_cost:${attention}} -> quadratic | linear
}


def register_resolvers() -> None:
    """Register fastasr's OmegaConf resolvers once (``unit_metric``, ``matrix_attention``,
    ``matrix_shared_qk``, ``fallback``, ``corpus_lm``, ``attention_length_cost``)."""
    for name, resolver in _RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)
    os.environ.setdefault("PROJECT_ROOT", str(PROJECT_ROOT))


register_resolvers()
