"""The run's identity on every dashboard: attention variant, its parameters, the full config."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn

from fastasr.rundir import RunDir

_SCALARS = (bool, int, float, str)


def attention_info(model: nn.Module) -> dict[str, Any]:
    """``{"spec": ..., "shared_qk": ..., <the inner attention's scalar settings>}`` of a
    :class:`fastasr.model.CTCModel` (read from its first attention layer; all layers share it);
    ``{"spec": None}`` for a model without attention layers."""
    layers = model.attention_layers()
    if not layers:
        return {"spec": None}
    layer = layers[0]
    inner = layer.inner
    info: dict[str, Any] = {"spec": getattr(inner, "spec", type(inner).__name__), "shared_qk": layer.shared_qk}
    config = getattr(inner, "config", None)
    if callable(config):
        config = config()
    items = dict(config) if isinstance(config, dict) else vars(inner)
    for key, value in items.items():
        if not key.startswith("_") and key not in ("training", "spec") and isinstance(value, _SCALARS):
            info.setdefault(key, value)
    return info


class RunInfoLogger(L.Callback):
    """At the start of fit, logs to every logger ``attention`` = :func:`attention_info` as
    hyper-parameters (wandb config, TensorBoard/CSV hparams), and to TensorBoard the resolved
    run config (``<run dir>/config.yaml``, written by ``fastasr.training.fit.train``) as text."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        info = attention_info(pl_module.model)
        config_file = RunDir(trainer.default_root_dir).config_file
        config_text = config_file.read_text() if config_file.is_file() else None
        for logger in trainer.loggers:
            logger.log_hyperparams({"attention": info})
            if isinstance(logger, TensorBoardLogger):
                summary = "\n".join(f"    {k}: {v}" for k, v in info.items())
                logger.experiment.add_text("attention", summary, global_step=trainer.global_step)
                if config_text is not None:
                    indented = "\n".join("    " + line for line in config_text.splitlines())
                    logger.experiment.add_text("config", indented, global_step=trainer.global_step)
