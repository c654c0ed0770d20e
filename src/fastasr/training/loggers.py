"""The experiment loggers of a run (CSV, TensorBoard, wandb): building them and closing wandb.

``conf/logger/*.yaml`` lists the loggers as Hydra ``_target_`` entries; :func:`build_loggers`
puts each in the run directory, gives wandb the run's persistent id (so a resumed run
continues the same wandb run) and the whole resolved config. :func:`finish_wandb` closes the
process's wandb run, so that the next run in the same process starts its own, and says in one
line where it went (wandb's own banner and 30-line summary are off: ``settings.silent`` in
``conf/logger/default.yaml``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

from hydra.utils import instantiate
from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger
from omegaconf import DictConfig, OmegaConf

from fastasr.rundir import RunDir

log = logging.getLogger(__name__)


class WandbLogger(LightningWandbLogger):
    """Lightning's ``WandbLogger`` without the ``anonymous=None`` it always hands to ``wandb.init``,
    which wandb 0.2x answers on every run with "The anonymous setting has no effect and will be
    removed" (even with ``settings.silent``). ``anonymous=True`` is still passed on. ``settings``
    may be a mapping (the YAML's), made into ``wandb.Settings``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        settings = kwargs.get("settings")
        if isinstance(settings, Mapping):  # a DictConfig from instantiate: wandb.init ignores what is not Settings
            import wandb

            plain = OmegaConf.to_container(settings, resolve=True) if isinstance(settings, DictConfig) else settings
            kwargs["settings"] = wandb.Settings(**plain)
        super().__init__(*args, **kwargs)
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)


def build_loggers(cfg: DictConfig, run_dir: RunDir) -> list[Any]:
    """The Lightning loggers of ``cfg.logger`` (each entry with a ``_target_``), saving under
    ``run_dir``; an empty list when there are none."""
    loggers = []
    for lcfg in (cfg.get("logger") or {}).values():
        if lcfg is None or "_target_" not in lcfg:
            continue
        extra: dict[str, Any] = {"save_dir": str(run_dir.path)}
        if "Wandb" in lcfg._target_:
            extra["id"] = run_dir.wandb_run_id()
            extra["resume"] = "allow"
            extra["config"] = OmegaConf.to_container(cfg, resolve=True)
        # `config` cannot go through instantiate(**kwargs) (it is instantiate's own first
        # parameter), so build a partial and call it with the keyword arguments.
        loggers.append(instantiate(lcfg, _partial_=True)(**extra))
    return loggers


def finish_wandb() -> None:
    """Finish the process's current wandb run, if there is one (a no-op when wandb was never
    imported), and log one line saying where it is: ``wandb: offline run in <dir>; `wandb sync
    <dir>` uploads it`` (or the online run's URL). A ``WandbLogger``'s experiment is that run, so
    this closes it too."""
    wandb = sys.modules.get("wandb")
    run = getattr(wandb, "run", None) if wandb is not None else None
    if run is None:
        return
    offline = bool(getattr(run, "offline", False))
    where = getattr(run, "sync_dir" if offline else "url", None)
    wandb.finish()
    if offline:
        log.info("wandb: offline run in %s; `wandb sync %s` uploads it", where, where)
    elif where:
        log.info("wandb: run at %s", where)
