"""Hydra/OmegaConf glue at the bottom of the stack: the config directory, and config sections →
dataclasses.

It registers no resolvers and imports nothing of fastasr (it also parses wall-clock budgets, :func:`max_time_seconds`): the YAML under ``conf/`` holds plain
values and ``${}`` references (OmegaConf's own ``oc.*`` resolvers included); the values that follow
from others by a rule (the tokenizer a top-level ``tokenizer=`` chooses, the batch price of the
attention, the checkpoint monitor, a matrix member's attention and Q/K sharing) are worked out in
Python where training starts (:mod:`fastasr.training.derived_config`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

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


def max_time_seconds(value: Any, where: str = "trainer.max_time") -> float:
    """Seconds of a Lightning ``max_time``: ``"DD:HH:MM:SS"`` or a mapping of days, hours,
    minutes, seconds. Raises ``ValueError`` naming ``where`` for anything else."""
    if isinstance(value, Mapping):
        units = {"days": 86400, "hours": 3600, "minutes": 60, "seconds": 1}
        if not set(value) - set(units):
            return float(sum(units[k] * float(v) for k, v in value.items()))
    elif isinstance(value, str) and re.fullmatch(r"\d+:\d+:\d+:\d+(\.\d+)?", value.strip()):
        d, h, m, s = value.strip().split(":")
        seconds = int(d) * 86400 + int(h) * 3600 + int(m) * 60 + float(s)
        if seconds > 0:
            return seconds
    raise ValueError(f"{where}: {value!r}; expected a positive wall-clock budget \"DD:HH:MM:SS\" "
                     "(e.g. \"00:00:20:00\") or {days, hours, minutes, seconds}")
