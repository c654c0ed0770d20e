"""Config sections → dataclasses, without OmegaConf: :func:`dataclass_from_mapping`.

A module of the bottom layer that imports nothing but the standard library, so that the
PyTorch-free runtime (:mod:`fastasr.onnx`, the ``fastasr-runtime`` distribution) reads its
``long_form`` settings by the same rule as training reads ``features`` or ``data.augment``
(:mod:`fastasr.config`, the Hydra glue, imports OmegaConf).
"""

from __future__ import annotations

from dataclasses import fields


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
