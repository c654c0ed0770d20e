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
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

import fastasr.config  # noqa: F401  (registers resolvers)
from fastasr.checkpoint_averaging import average_into
from fastasr.decoding.builder import build_decoder
from fastasr.decoding.transcribe import decode_and_score
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


def manifest_loader(lit: ASRLitModule, data_cfg: DictConfig | Mapping[str, Any], manifest: str | Path):
    """An evaluation dataloader for ``manifest`` with the checkpoint's vocabulary and features."""
    datamodule = instantiate(
        data_cfg,
        vocab=dict(lit.hparams.tokenizer),
        subsampling_factor=lit.hparams.model.get("subsampling", 1),
        _convert_="all",
    )
    return datamodule.dataloader_for(str(manifest))


def decode_manifest(
    lit: ASRLitModule,
    data_cfg: DictConfig | Mapping[str, Any],
    manifest: str | Path,
    accelerator: str = "auto",
    seed: int = 1234,
    decoding: Mapping[str, Any] | None = None,
    out_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Score ``lit`` on ``manifest`` with the ``decoding`` config (None: greedy); returns
    per/cer, wer (+ breakdowns), utterances, decode_seconds, attention. With ``out_dir``, the
    per-utterance recogs/errs files are written there."""
    L.seed_everything(seed, workers=True)
    loader = manifest_loader(lit, data_cfg, manifest)
    device = "cuda" if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available() else "cpu"
    decoder, _ = build_decoder(decoding, lit.tokenizer, data_cfg.get("train_manifest"))
    result = decode_and_score(lit.model, loader, lit.tokenizer, decoder, device, out_dir,
                              f"{Path(manifest).stem}-{decoder.describe()['name']}")
    return dict(result, attention=lit.model.attention_spec, manifest=str(manifest))


def format_result_line(result: Mapping[str, Any]) -> str:
    """The final line evaluate.py prints: ``PER=<x> WER=<y>`` (CER=<x> added for char models)."""
    line = f"PER={result.get('per', float('nan')):.2f} WER={result['wer']:.2f}"
    if "cer" in result:
        line += f" CER={result['cer']:.2f}"
    return line


def data_config_for(cfg: DictConfig, lit: ASRLitModule) -> dict[str, Any]:
    """``cfg.data`` as a dict, with the checkpoint's own feature settings (they win over the
    composed defaults) and unset train/dev manifests as None (the vocabulary is the checkpoint's)."""
    data_cfg = OmegaConf.to_container(cfg.data, resolve=True)
    for split in ("train_manifest", "dev_manifest"):
        if OmegaConf.is_missing(cfg.data, split):
            data_cfg[split] = None
    data_cfg["features"] = dict(lit.hparams.get("features") or data_cfg["features"])
    return data_cfg


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Decode ``cfg.data.test_manifest`` with ``cfg.ckpt_path``; write results.json in the run dir."""
    attention = OmegaConf.to_container(cfg.attention, resolve=True) if cfg.get("attention") else None
    lit = load_model(cfg.ckpt_path, attention)
    averaged = average_into(lit, cfg.ckpt_path, **(cfg.get("average") or {}))
    data_cfg = data_config_for(cfg, lit)
    run_dir = Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path(cfg.paths.output_dir) / "eval"
    run_dir.mkdir(parents=True, exist_ok=True)
    decoding = OmegaConf.to_container(cfg.decoding, resolve=True) if cfg.get("decoding") else None
    result = decode_manifest(lit, data_cfg, cfg.data.test_manifest, cfg.accelerator, cfg.seed, decoding, run_dir)
    result["ckpt_path"] = str(cfg.ckpt_path)
    result["averaged_checkpoints"] = [str(p) for p in averaged]
    (run_dir / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    result["run_dir"] = str(run_dir)
    return result
