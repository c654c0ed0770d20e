"""Evaluation entry: decode a manifest with a trained checkpoint, optionally with another attention.

``python evaluate.py ckpt_path=PATH [attention=...] [data.test_manifest=...]`` calls
:func:`evaluate`, prints ``PER=<x> WER=<y>`` as its last line and writes ``results.json``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

import fastasr.config  # noqa: F401  (registers resolvers)
from fastasr.callbacks.bad_audio import BadAudioReport
from fastasr.lit import ASRLitModule

log = logging.getLogger(__name__)


def load_model(ckpt_path: str | Path, attention: str | Mapping[str, Any] | None = None) -> ASRLitModule:
    """Load a checkpoint on the CPU; swap its attention when ``attention`` is given."""
    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"ckpt_path={ckpt_path}: no such checkpoint file")
    lit = ASRLitModule.load_from_checkpoint(str(path), map_location="cpu")
    if attention is not None:
        lit.model.set_attention(attention)
    lit.eval()
    return lit


def decode_manifest(
    lit: ASRLitModule,
    data_cfg: DictConfig | Mapping[str, Any],
    manifest: str | Path,
    accelerator: str = "auto",
    seed: int = 1234,
) -> dict[str, Any]:
    """Score ``lit`` on ``manifest``; returns per/cer, wer, utterances, decode_seconds, attention and
    ``skipped_audio`` (``{"id", "path", "reason", "stage"}`` of each utterance left out for unusable audio)."""
    L.seed_everything(seed, workers=True)
    model_cfg = lit.hparams.model
    datamodule = instantiate(
        data_cfg,
        vocab=dict(lit.hparams.tokenizer),
        subsampling_factor=model_cfg.get("subsampling", 1),
        _convert_="all",
    )
    loader = datamodule.dataloader_for(str(manifest))
    bad_audio = BadAudioReport(summary_file=None)  # unusable audio: skipped, logged, listed in the result
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[bad_audio],
    )
    trainer.test(lit, dataloaders=loader, verbose=False)
    return dict(lit.test_result, manifest=str(manifest), skipped_audio=sorted(bad_audio.skipped.values(),
                                                                             key=lambda r: r["id"]))


def format_result_line(result: Mapping[str, Any]) -> str:
    """The final line evaluate.py prints: ``PER=<x> WER=<y>`` (CER=<x> added for char models)."""
    line = f"PER={result.get('per', float('nan')):.2f} WER={result['wer']:.2f}"
    if "cer" in result:
        line += f" CER={result['cer']:.2f}"
    return line


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Decode ``cfg.data.test_manifest`` with ``cfg.ckpt_path``; write results.json in the run dir."""
    attention = OmegaConf.to_container(cfg.attention, resolve=True) if cfg.get("attention") else None
    lit = load_model(cfg.ckpt_path, attention)
    # The checkpoint's own feature settings win over the composed defaults.
    data_cfg = OmegaConf.to_container(cfg.data, resolve=True)
    for split in ("train_manifest", "dev_manifest"):  # not needed to decode: the vocabulary is the checkpoint's
        if OmegaConf.is_missing(cfg.data, split):
            data_cfg[split] = None
    data_cfg["features"] = dict(lit.hparams.get("features") or data_cfg["features"])
    result = decode_manifest(lit, data_cfg, cfg.data.test_manifest, cfg.accelerator, cfg.seed)
    result["ckpt_path"] = str(cfg.ckpt_path)
    run_dir = Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path(cfg.paths.output_dir) / "eval"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    result["run_dir"] = str(run_dir)
    return result
