"""Hydra/OmegaConf glue at the bottom of the stack: the config directory, and config sections →
dataclasses.

It registers no resolvers and imports nothing of fastasr: the YAML under ``conf/`` holds plain
values and ``${}`` references (OmegaConf's own ``oc.*`` resolvers included); the values that follow
from others by a rule (the tokenizer a top-level ``tokenizer=`` chooses, the batch price of the
attention, the checkpoint monitor, a matrix member's attention and Q/K sharing) are worked out in
Python where training starts (:mod:`fastasr.derived_config`).
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[2] / "conf"
PROJECT_ROOT = CONFIG_DIR.parent

# conf/paths/default.yaml: root_dir: ${oc.env:PROJECT_ROOT,.} — the checkout, from wherever a command runs
os.environ.setdefault("PROJECT_ROOT", str(PROJECT_ROOT))


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
