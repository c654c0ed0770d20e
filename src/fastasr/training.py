"""Training entry: compose config → instantiate data, model, trainer → fit → test.

``python train.py`` (Hydra) calls :func:`train`; tests call it with a composed config.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

import fastasr.config  # noqa: F401  (registers resolvers)
from fastasr.lit import ASRLitModule

log = logging.getLogger(__name__)

SIGTERM_EXIT_STATUS = 143  # 128 + SIGTERM: what a shell reports for a job terminated by SIGTERM

_RESUME_NAMES = ("last.ckpt", "step-last.ckpt")


def run_dir_of(cfg: DictConfig) -> Path:
    """The run directory: Hydra's output dir when running under Hydra, else ``paths.run_dir``."""
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path(cfg.paths.run_dir)


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """Newest of ``last.ckpt`` (end of validation) and ``step-last.ckpt`` (every N steps)."""
    found = [ckpt_dir / n for n in _RESUME_NAMES if (ckpt_dir / n).is_file()]
    if not found:
        return None
    return max(found, key=lambda p: torch.load(p, map_location="cpu", weights_only=False)["global_step"])


def resolve_ckpt_path(ckpt_path: str | None, run_dir: Path) -> str | None:
    """Turn ``ckpt_path`` (null | auto | last | PATH) into a checkpoint file or None."""
    ckpt_dir = run_dir / "checkpoints"
    if ckpt_path in (None, "null", "none"):
        if latest_checkpoint(ckpt_dir) is not None:
            raise FileExistsError(
                f"{ckpt_dir} already holds checkpoints of run '{run_dir.name}'; "
                "pass ckpt_path=last to resume it or name=<new name> for a fresh run"
            )
        return None
    if ckpt_path in ("auto", "last"):
        found = latest_checkpoint(ckpt_dir)
        if found is None and ckpt_path == "last":
            raise FileNotFoundError(f"ckpt_path=last: no last.ckpt or step-last.ckpt in {ckpt_dir}")
        if found is not None:
            log.info("resuming from %s", found)
        return None if found is None else str(found)
    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"ckpt_path={ckpt_path}: no such checkpoint file")
    return str(path)


def _wandb_run_id(run_dir: Path) -> str:
    """A wandb run id kept in the run directory, so a resumed run continues the same wandb run."""
    id_file = run_dir / "wandb_run_id.txt"
    if id_file.is_file():
        return id_file.read_text().strip()
    run_id = uuid.uuid4().hex[:12]
    id_file.write_text(run_id + "\n")
    return run_id


def build_loggers(cfg: DictConfig, run_dir: Path) -> list[Any]:
    loggers = []
    for lcfg in (cfg.get("logger") or {}).values():
        if lcfg is None or "_target_" not in lcfg:
            continue
        extra: dict[str, Any] = {"save_dir": str(run_dir)}
        if "Wandb" in lcfg._target_:
            extra["id"] = _wandb_run_id(run_dir)
            extra["resume"] = "allow"
            extra["config"] = OmegaConf.to_container(cfg, resolve=True)
        # `config` cannot go through instantiate(**kwargs) (it is instantiate's own first
        # parameter), so build a partial and call it with the keyword arguments.
        loggers.append(instantiate(lcfg, _partial_=True)(**extra))
    return loggers


def build_callbacks(cfg: DictConfig, run_dir: Path) -> list[L.Callback]:
    callbacks = []
    for ccfg in (cfg.get("callbacks") or {}).values():
        if ccfg is None or "_target_" not in ccfg:
            continue
        extra = {"dirpath": str(run_dir / "checkpoints")} if "ModelCheckpoint" in ccfg._target_ else {}
        callbacks.append(instantiate(ccfg, **extra))
    return callbacks


def build_module(cfg: DictConfig, datamodule) -> ASRLitModule:
    """The LightningModule for ``cfg.model`` with the data's vocabulary, dims and CMVN stats."""
    lit = ASRLitModule(
        model=OmegaConf.to_container(cfg.model, resolve=True),
        tokenizer=datamodule.tokenizer.state_dict(),
        feat_in=datamodule.feature_dim,
        features=OmegaConf.to_container(cfg.data.features, resolve=True),
        optimizer=OmegaConf.to_container(cfg.optim, resolve=True),
        scheduler=OmegaConf.to_container(cfg.scheduler, resolve=True) if cfg.get("scheduler") else None,
    )
    mean, std = datamodule.cmvn_stats
    lit.model.set_cmvn(mean, std)
    return lit


def train(cfg: DictConfig, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Fit (or resume) a model, then score the best checkpoint on the test split.

    ``run_dir``: where the run lives (checkpoints, logs, config.yaml); None: the running
    Hydra job's output directory, else ``cfg.paths.run_dir`` (:func:`run_dir_of`).
    Returns ``{"run_dir", "best_ckpt", "last_ckpt", "val": {...}, "test": {...}}``.
    """
    L.seed_everything(cfg.seed, workers=True)
    run_dir = Path(run_dir) if run_dir is not None else run_dir_of(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = resolve_ckpt_path(cfg.get("ckpt_path"), run_dir)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)

    datamodule = instantiate(cfg.data, subsampling_factor=cfg.model.subsampling, _convert_="all")
    datamodule.setup("fit")
    lit = build_module(cfg, datamodule)

    trainer: L.Trainer = instantiate(
        cfg.trainer,
        callbacks=build_callbacks(cfg, run_dir),
        logger=build_loggers(cfg, run_dir) or False,
        default_root_dir=str(run_dir),
    )
    try:
        trainer.fit(lit, datamodule=datamodule, ckpt_path=ckpt_path)
    except SIGTERMException:
        # Lightning stops after the batch it is in and raises SystemExit *without* a code,
        # i.e. exit status 0: a cluster job script could not tell a preempted run from a
        # finished one. Say where to resume and exit as a terminated process does.
        last = latest_checkpoint(run_dir / "checkpoints")
        log.warning("SIGTERM: training stopped at step %d; rerun the same command to resume from %s",
                    trainer.global_step, last or "the start (no checkpoint was written yet)")
        raise SystemExit(SIGTERM_EXIT_STATUS) from None

    result: dict[str, Any] = {
        "run_dir": str(run_dir),
        "val": {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")},
    }
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    result["best_ckpt"] = best or None
    last = latest_checkpoint(run_dir / "checkpoints")
    result["last_ckpt"] = str(last) if last else None
    if cfg.get("test") and not trainer.fast_dev_run:
        trainer.test(lit, datamodule=datamodule, ckpt_path=best or None)
        result["test"] = lit.test_result
        log.info("test: %s", lit.test_result)
    _finish_wandb(trainer)
    return result


def _finish_wandb(trainer: L.Trainer) -> None:
    """Close this run's wandb run, so the next ``train()`` in the same process (tests, the
    matrix) starts its own instead of silently logging into this one."""
    from lightning.pytorch.loggers import WandbLogger

    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger) and trainer.is_global_zero:
            logger.experiment.finish()
