"""Evaluation entry: decode a manifest with a trained checkpoint, optionally with another
attention, another decoder (``decoding=beam``) or the average of several epochs.

``python evaluate.py ckpt_path=PATH [data.test_manifest=...] [attention=...] [decoding=beam_lm]``
calls :func:`evaluate`, prints ``PER=<x> WER=<y>`` as its last line and writes
``results.json`` and the per-utterance ``recogs-*`` / ``errs-*`` files to its run directory.
The checkpoint carries the tokenizer, features, CMVN, model config, lexicon and word LM
(:func:`fastasr.recognition.recogniser.load_recogniser`); ``conf/evaluate.yaml``'s own ``data`` section
names the manifest to decode and the batching (and, for checkpoints that carry no lexicon or
LM, the training manifest they come from). No training data config is composed. The decoding
and scoring are :func:`fastasr.recognition.scoring.decode_manifest`'s.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

import fastasr.config  # noqa: F401  (PROJECT_ROOT for conf/paths)
from fastasr.progress import show_progress
from fastasr.recognition.checkpoint_averaging import average_into
from fastasr.recognition.loading import load_recogniser
from fastasr.recognition.scoring import (
    DecodeResult,
    decode_manifest,
    decoding_options,
    training_manifest,
)
from fastasr.rundir import RunDir

log = logging.getLogger(__name__)


def decoding_label(decoding: dict) -> str:
    """How a decoder's :meth:`describe` reads on a terminal: ``greedy``, ``beam 500 + LM``,
    ``beam 500`` (with ``, real words`` / ``, phonetic words`` left to the caller)."""
    if decoding.get("name") != "beam":
        return str(decoding.get("name", "greedy"))
    beam = f"beam {decoding['beam_size']}" if decoding.get("beam_size") else "beam"
    return beam + (" + LM" if decoding.get("lm") else "")


def format_result_line(result: DecodeResult) -> str:
    """The final line evaluate.py prints: ``PER=<x> WER=<y> (<n> utterances)`` for a phoneme
    model, ``CER=<x> WER=<y> (...)`` for a character or subword model (no rate that does not
    apply to the units); with skipped utterances ``(295 of 300 utterances; 5 skipped, see
    results.json)``, where results.json lists each with its manifest line and reason."""
    line = f"{result.unit_metric.upper()}={result.unit_error_rate:.2f} WER={result.wer:.2f}"
    skipped = result.skipped_utterances
    if not skipped:
        return f"{line} ({result.utterances} utterances)"
    total = result.manifest_lines if result.manifest_lines is not None else result.utterances + skipped
    return f"{line} ({result.utterances} of {total} utterances; {skipped} skipped, see results.json)"


def evaluate(cfg: DictConfig) -> DecodeResult:
    """Decode ``cfg.data.test_manifest`` with ``cfg.ckpt_path`` (averaged over epochs with
    ``cfg.average``) and ``cfg.decoding``; write results.json (:meth:`DecodeResult.to_dict`, with
    ``ckpt_path`` and ``averaged_checkpoints``) and the recogs/errs files in the run dir, whose
    path the result's ``run_dir`` gives."""
    attention = OmegaConf.to_container(cfg.attention, resolve=True) if cfg.get("attention") else None
    recogniser = load_recogniser(cfg.ckpt_path, attention, training_manifest=training_manifest(cfg.data))
    decoding = OmegaConf.to_container(cfg.decoding, resolve=True) if cfg.get("decoding") else None
    if (decoding or {}).get("name") == "auto":
        log.info("decoding=auto: %s (the checkpoint carries %s)", recogniser.words_decoding,
                 "a lexicon and a word LM" if recogniser.words_decoding == "beam_lm" else
                 "a lexicon, no word LM" if recogniser.words_decoding == "beam" else "no lexicon")
    averaged = average_into(recogniser.model, cfg.ckpt_path, **(cfg.get("average") or {}))
    if cfg.get("chunk") is not None:
        recogniser.set_chunked_decoding(cfg.chunk, cfg.get("left", "auto"))
        log.info("decoding in a chunked context: %s", recogniser.model.decoding_context.describe(recogniser.frame_seconds))
    run_dir = RunDir(HydraConfig.get().runtime.output_dir if HydraConfig.initialized()
                     else Path(cfg.paths.output_dir) / "eval").create()
    result = decode_manifest(recogniser, cfg.data.test_manifest, accelerator=cfg.accelerator, seed=cfg.seed,
                             decoding=decoding, out_dir=run_dir.path,
                             progress=show_progress(cfg.get("progress", "auto")), **decoding_options(cfg.data))
    result = replace(result, ckpt_path=str(cfg.ckpt_path), averaged_checkpoints=[str(p) for p in averaged])
    context = recogniser.model.decoding_context
    run_dir.write_results({**result.to_dict(), "context": "full" if context is None else
                           context.describe(recogniser.frame_seconds)})
    return replace(result, run_dir=str(run_dir.path))


