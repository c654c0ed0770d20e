"""Hydra/OmegaConf glue at the bottom of the stack: the config directory and the default recipe of a
corpus (config sections → dataclasses: :mod:`fastasr.sections`, which needs no OmegaConf).

It imports nothing of fastasr (it also parses wall-clock budgets, :func:`max_time_seconds`). The
YAML under ``conf/`` holds plain values and ``${}`` references (OmegaConf's own ``oc.*`` resolvers
included) and one resolver of this module's, ``fastasr.recipe_of_data``, which ``conf/train.yaml``'s
defaults list uses to choose the recipe a corpus trains with (:func:`recipe_of_data`), registered
when this module is imported. The values that follow from others by a rule (``auto`` values: the
batch price of the attention, the checkpoint monitor, the precision, the workers; the tokenizer a
top-level ``tokenizer=`` chooses; a matrix member's attention and Q/K sharing) are filled in by one
step where training starts (:func:`fastasr.training.derived_config.resolve_train_config`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

CONFIG_DIR = Path(__file__).resolve().parents[2] / "conf"
PROJECT_ROOT = CONFIG_DIR.parent

# conf/paths/default.yaml: root_dir: ${oc.env:PROJECT_ROOT,.} — the checkout, from wherever a command runs
os.environ.setdefault("PROJECT_ROOT", str(PROJECT_ROOT))

#: The recipe of the built-in corpora (``conf/recipe/builtin.yaml``: ``make train``'s).
BUILTIN_RECIPE = "builtin"
#: The recipe of every other corpus (``conf/recipe/real_speech.yaml``: recorded speech).
REAL_SPEECH_RECIPE = "real_speech"
#: The ``data`` choices of the built-in corpora start with this (``synthetic``, ``synthetic_long``, ``synthetic_joined``).
BUILTIN_DATA_PREFIX = "synthetic"


def recipe_of_data(data_choice: str) -> str:
    """The recipe a ``train.yaml`` run trains with unless the command names one (``recipe=...``):
    :data:`BUILTIN_RECIPE` for the built-in synthesised corpora (a ``data`` choice starting with
    ``synthetic``), :data:`REAL_SPEECH_RECIPE` for every other corpus (``data=manifest``, ``digits``,
    ``librispeech``, ... and a user's own data config). ``conf/train.yaml`` calls it as the resolver
    ``${fastasr.recipe_of_data:${data}}`` in its defaults list; the run's first lines say which was chosen."""
    return BUILTIN_RECIPE if str(data_choice).startswith(BUILTIN_DATA_PREFIX) else REAL_SPEECH_RECIPE


OmegaConf.register_new_resolver("fastasr.recipe_of_data", recipe_of_data, replace=True)


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
