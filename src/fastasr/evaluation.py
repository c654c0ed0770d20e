"""Evaluation entry: decode a manifest with a trained checkpoint, optionally with another
attention, another decoder (``decoding=beam``) or the average of several epochs.

``python evaluate.py ckpt_path=PATH [data.test_manifest=...] [attention=...] [decoding=beam_lm]``
calls :func:`evaluate`, prints ``PER=<x> WER=<y>`` as its last line and writes
``results.json`` and the per-utterance ``recogs-*`` / ``errs-*`` files to its run directory.
The checkpoint carries the tokenizer, features, CMVN, model config, lexicon and word LM
(:func:`fastasr.recogniser.load_recogniser`); ``conf/evaluate.yaml``'s own ``data`` section
names the manifest to decode and the batching (and, for checkpoints that carry no lexicon or
LM, the training manifest they come from). No training data config is composed. The decoding
and scoring are :func:`fastasr.scoring.decode_manifest`'s.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

import fastasr.config  # noqa: F401  (PROJECT_ROOT for conf/paths)
from fastasr.checkpoint_averaging import average_into
from fastasr.recogniser import load_recogniser
from fastasr.rundir import RunDir
from fastasr.scoring import DecodeResult, decode_manifest, decoding_options, training_manifest


def format_result_line(result: DecodeResult) -> str:
    """The final line evaluate.py prints: ``PER=<x> WER=<y>`` (CER=<x> added for char models)."""
    per = result.per if result.per is not None else math.nan
    line = f"PER={per:.2f} WER={result.wer:.2f}"
    if result.cer is not None:
        line += f" CER={result.cer:.2f}"
    return line


def evaluate(cfg: DictConfig) -> DecodeResult:
    """Decode ``cfg.data.test_manifest`` with ``cfg.ckpt_path`` (averaged over epochs with
    ``cfg.average``) and ``cfg.decoding``; write results.json (:meth:`DecodeResult.to_dict`, with
    ``ckpt_path`` and ``averaged_checkpoints``) and the recogs/errs files in the run dir, whose
    path the result's ``run_dir`` gives."""
    attention = OmegaConf.to_container(cfg.attention, resolve=True) if cfg.get("attention") else None
    recogniser = load_recogniser(cfg.ckpt_path, attention)
    averaged = average_into(recogniser.model, cfg.ckpt_path, **(cfg.get("average") or {}))
    run_dir = RunDir(HydraConfig.get().runtime.output_dir if HydraConfig.initialized()
                     else Path(cfg.paths.output_dir) / "eval").create()
    decoding = OmegaConf.to_container(cfg.decoding, resolve=True) if cfg.get("decoding") else None
    result = decode_manifest(recogniser, cfg.data.test_manifest, accelerator=cfg.accelerator, seed=cfg.seed,
                             decoding=decoding, train_manifest=training_manifest(cfg.data), out_dir=run_dir.path,
                             **decoding_options(cfg.data))
    result = replace(result, ckpt_path=str(cfg.ckpt_path), averaged_checkpoints=[str(p) for p in averaged])
    run_dir.write_results(result.to_dict())
    return replace(result, run_dir=str(run_dir.path))
