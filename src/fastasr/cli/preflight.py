"""Hydra callbacks that refuse a command before its run directory is made.

``train.py`` and ``evaluate.py`` name them in their Hydra configs (``conf/hydra/default.yaml``,
``conf/hydra/evaluate.yaml``). Hydra calls :meth:`~hydra.experimental.callback.Callback.on_run_start`
after composing the config and before it creates the run directory and writes its ``.hydra/``
and log, so a refused command leaves no trace in any run directory. A refusal prints one line,
without a traceback, and exits with status 2.

This module imports neither torch nor Lightning, and the commands import their training and
decoding modules inside ``main``: a mistyped override, group or key (Hydra's own composition
error) is refused in about half a second, a config that :mod:`fastasr.training.config_check`
refuses in about two (torch, not Lightning, loaded), where importing the training stack first
took five to six.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue

from fastasr.distributed import is_rank_zero_process
from fastasr.rundir import RunDir

__all__ = ["TrainPreflight", "EvaluatePreflight"]


class TrainPreflight(Callback):
    """``train.py``'s check of the config (:func:`fastasr.training.config_check.check_train_config`)
    and of what it would do to the run directory (:func:`fastasr.training.config_check.check_run_dir`).
    :func:`fastasr.training.fit.train` checks again (it is also called without Hydra)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not is_rank_zero_process():
            return
        from fastasr.training.config_check import (  # loads torch: here, after Hydra's own checks
            ConfigError,
            check_run_dir,
            check_train_config,
        )

        cfg = copy.deepcopy(config)
        with open_dict(cfg):
            run_dir = Path(str(cfg.hydra.run.dir))
            del cfg["hydra"]
        try:
            check_run_dir(check_train_config(cfg), RunDir(run_dir))
        except (ConfigError, FileExistsError, FileNotFoundError) as err:
            print(f"train.py: {err}", file=sys.stderr)
            raise SystemExit(2) from None


class EvaluatePreflight(Callback):
    """``evaluate.py``'s check that ``ckpt_path`` and ``data.test_manifest`` are files; else it
    prints what is missing."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        problems = []
        for key, what in (("ckpt_path", "a checkpoint (.ckpt)"), ("data.test_manifest", "a manifest (.jsonl)")):
            try:
                value = OmegaConf.select(config, key, throw_on_missing=True)
            except MissingMandatoryValue:
                value = None
            if value in (None, ""):
                problems.append(f"{key} is not set; expected {what}")
            elif not Path(str(value)).is_file():
                problems.append(f"{key}={value}: no such file; expected {what}")
        if problems:
            print("evaluate.py: " + "; ".join(problems), file=sys.stderr)
            raise SystemExit(2)
