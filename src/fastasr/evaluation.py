"""Evaluation entry: decode a manifest with a trained checkpoint, optionally with another attention.

``python evaluate.py ckpt_path=PATH [attention=...] [data.test_manifest=...]`` calls
:func:`evaluate`, prints ``PER=<x> WER=<y>`` as its last line and writes ``results.json``.
The checkpoint carries the tokenizer, features, CMVN and model config
(:func:`fastasr.recogniser.load_recogniser`); the data config only names the manifest and
the batching.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

import fastasr.config  # noqa: F401  (registers resolvers)
from fastasr.recogniser import decode_manifest, decoding_options, load_recogniser
from fastasr.rundir import RunDir


def format_result_line(result: Mapping[str, Any]) -> str:
    """The final line evaluate.py prints: ``PER=<x> WER=<y>`` (CER=<x> added for char models)."""
    line = f"PER={result.get('per', float('nan')):.2f} WER={result['wer']:.2f}"
    if "cer" in result:
        line += f" CER={result['cer']:.2f}"
    return line


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Decode ``cfg.data.test_manifest`` with ``cfg.ckpt_path``; write results.json in the run dir."""
    attention = OmegaConf.to_container(cfg.attention, resolve=True) if cfg.get("attention") else None
    recogniser = load_recogniser(cfg.ckpt_path, attention)
    result = decode_manifest(recogniser, cfg.data.test_manifest, accelerator=cfg.accelerator, seed=cfg.seed,
                             **decoding_options(cfg.data))
    result["ckpt_path"] = str(cfg.ckpt_path)
    run_dir = RunDir(HydraConfig.get().runtime.output_dir if HydraConfig.initialized()
                     else Path(cfg.paths.output_dir) / "eval").create()
    run_dir.write_results(result)
    result["run_dir"] = str(run_dir.path)
    return result
