"""Hydra callbacks that refuse a command before its run directory is made.

``train.py``, ``evaluate.py`` and ``fastasr-transcribe`` name them in their Hydra configs
(``conf/hydra/default.yaml``, ``evaluate.yaml``, ``transcribe.yaml``). Hydra calls :meth:`~hydra.experimental.callback.Callback.on_run_start`
after composing the config and before it creates the run directory and writes its ``.hydra/``
and log, so a refused command leaves no trace in any run directory (and no empty one). A
refusal prints one line, without a traceback, and exits with status 2.

This module imports neither torch nor Lightning, and the commands import their training and
decoding modules inside ``main``: on a 2-core CPU a mistyped override, group or key (Hydra's own
composition error) and a missing checkpoint are refused in 0.6 s, a config that
:mod:`fastasr.training.config_check` refuses in 3.7 s (torch loaded for the check, not
Lightning; docs/CONFIGURATION.md).
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

__all__ = ["TrainPreflight", "EvaluatePreflight", "TranscribePreflight"]


class TrainPreflight(Callback):
    """``train.py``'s check of the resolved config (:func:`fastasr.training.derived_config.resolve_train_config`,
    then :func:`fastasr.training.config_check.check_train_config`, once each) and of what it would do
    to the run directory (:func:`fastasr.training.run_guard.check_run_dir`).
    :func:`fastasr.training.fit.train` resolves and checks once more, in the training process (it is
    also called without Hydra)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not is_rank_zero_process():
            return
        from fastasr.training.config_check import ConfigError, check_train_config  # loads torch
        from fastasr.training.derived_config import resolve_train_config  # loads torch
        from fastasr.training.run_guard import check_run_dir  # loads torch

        cfg = copy.deepcopy(config)
        with open_dict(cfg):
            run_dir = Path(str(cfg.hydra.run.dir))
            del cfg["hydra"]
        try:
            resolve_train_config(cfg)
            check_train_config(cfg)
            check_run_dir(cfg, RunDir(run_dir))
        except (ConfigError, FileExistsError, FileNotFoundError) as err:
            print(f"train.py: {err}", file=sys.stderr)
            raise SystemExit(2) from None


def _problems(config: DictConfig, wanted: tuple[tuple[str, str, bool], ...]) -> list[str]:
    """What is wrong with each ``(key, what is expected, whether it names a file)`` of ``config``:
    unset, empty, or a file that does not exist."""
    problems = []
    for key, what, is_file in wanted:
        try:
            value = OmegaConf.select(config, key, throw_on_missing=True)
        except MissingMandatoryValue:
            value = None
        if value is None or (OmegaConf.is_list(value) and len(value) == 0) or str(value) == "":
            problems.append(f"{key} is not set; expected {what}")
        elif is_file and not Path(str(value)).is_file():
            problems.append(f"{key}={value}: no such file; expected {what}")
    return problems


def _refuse(command: str, problems: list[str]) -> None:
    if problems:
        print(f"{command}: " + "; ".join(problems), file=sys.stderr)
        raise SystemExit(2)


_CHECKPOINT = ("ckpt_path", "a checkpoint (.ckpt)", True)


class EvaluatePreflight(Callback):
    """``evaluate.py``'s check that ``ckpt_path`` and ``data.test_manifest`` are files."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _refuse("evaluate.py", _problems(config, (_CHECKPOINT, ("data.test_manifest", "a manifest (.jsonl)", True))))


class TranscribePreflight(Callback):
    """``fastasr-transcribe``'s check that ``ckpt_path`` is a file and ``audio`` is set.
    The audio inputs themselves are checked one by one as they are read: one that is missing or
    unreadable is reported and skipped (:mod:`fastasr.recognition.transcription_job`)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        audio = ("audio", "an audio file, a directory, a manifest (.jsonl), a list [a.wav,b.wav] or - (paths on stdin)",
                 False)
        _refuse("transcribe", _problems(config, (_CHECKPOINT, audio)))
