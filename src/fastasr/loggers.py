"""The experiment loggers of a run (CSV, TensorBoard, wandb): building them and closing wandb.

``conf/logger/*.yaml`` lists the loggers as Hydra ``_target_`` entries; :func:`build_loggers`
puts each in the run directory, gives wandb the run's persistent id (so a resumed run
continues the same wandb run) and the whole resolved config. :func:`finish_wandb` closes the
process's wandb run, so that the next run in the same process starts its own.
"""

from __future__ import annotations

import sys
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from fastasr.rundir import RunDir


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
    imported). A ``WandbLogger``'s experiment is that run, so this closes it too."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()
