"""Tune the beam search's LM weight and word score on the dev split.

    python -m fastasr.decoding.tune ckpt_path=PATH                       # decoding=beam_lm, dev split
    python -m fastasr.decoding.tune ckpt_path=PATH data.dev_manifest=D.jsonl decoding.lm.path=LM tune.lm_weight=[0,1,2]

The model runs once over the manifest (:func:`compute_emissions`); each grid point re-runs
only the search. The lexicon and word LM are the checkpoint's own (``decoding=beam_lm``, source
``auto``) unless ``decoding.lexicon`` / ``decoding.lm`` name others. Prints one line per point and, last, the best pair as overrides for
``evaluate.py``; writes ``tune.json`` (every point) to the run directory.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import hydra
import lightning as L
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from fastasr.config import CONFIG_DIR
from fastasr.data.bad_audio import SkippedAudio
from fastasr.data.lexicon import Lexicon
from fastasr.data.tokenizer import Tokenizer
from fastasr.data.tokenizer import unit_metric as unit_metric_of
from fastasr.decoding.builder import build_decoder, build_lexicon, resolve_lm
from fastasr.decoding.transcribe import (
    Emission,
    compute_emissions,
    decoding_device,
    score,
    transcribe,
)
from fastasr.lm.bundled import BundledLM
from fastasr.recogniser import Recogniser, load_recogniser
from fastasr.rundir import RunDir
from fastasr.scoring import decoding_loader, decoding_options, training_manifest

log = logging.getLogger(__name__)


def grid_search(emissions: Sequence[Emission], tokenizer: Tokenizer, decoding: Mapping[str, Any],
                lm_weights: Sequence[float], word_scores: Sequence[float],
                train_manifest: str | None = None, lexicon: Lexicon | None = None, *,
                bundled_lexicon: Lexicon | None = None, bundled_lm: BundledLM | None = None) -> list[dict[str, float]]:
    """WER (and unit error rate) of the ``decoding`` config for every (lm_weight, word_score),
    best first. The lexicon (``decoding.lexicon``, unless given) is built once for the grid.
    ``bundled_lexicon`` / ``bundled_lm``: the recogniser's own (what the ``auto`` sources use)."""
    spec = dict(decoding, name="beam")
    if lexicon is None:
        lexicon = build_lexicon(spec.get("lexicon"), tokenizer, train_manifest, bundled_lexicon)
    unit_metric = unit_metric_of(tokenizer.kind)
    points = []
    for lm_weight in lm_weights:
        for word_score in word_scores:
            start = time.perf_counter()
            decoder, _ = build_decoder(dict(spec, lm_weight=float(lm_weight), word_score=float(word_score)),
                                       tokenizer, train_manifest, lexicon=lexicon, bundled_lm=bundled_lm)
            result, _, _ = score(transcribe(emissions, decoder, tokenizer), unit_metric)
            point = {"lm_weight": float(lm_weight), "word_score": float(word_score), "wer": result["wer"],
                     unit_metric: result[unit_metric], "seconds": time.perf_counter() - start}
            log.info("lm_weight=%g word_score=%g: WER %.2f", lm_weight, word_score, result["wer"])
            points.append(point)
    return sorted(points, key=lambda p: (p["wer"], p[unit_metric]))


def manifest_emissions(recogniser: Recogniser, manifest: str, *, accelerator: str = "auto",
                       **loader_options: Any) -> tuple[list[Emission], list]:
    """``manifest``'s emissions under ``recogniser`` and the utterances whose audio was left out
    (reported, not fatal). ``loader_options``: :func:`fastasr.scoring.decoding_options`."""
    loader = decoding_loader(recogniser, manifest, **loader_options)
    skipped = SkippedAudio(loader_options.get("on_bad_utterance", "skip"))  # unusable audio: left out, reported
    start = time.perf_counter()
    emissions = compute_emissions(recogniser.model, skipped.batches(loader), recogniser.tokenizer,
                                  decoding_device(accelerator))
    skipped_audio = skipped.finish(str(manifest))
    log.info("emissions of %d utterances of %s in %.1f s", len(emissions), manifest, time.perf_counter() - start)
    return emissions, skipped_audio


def tune_recogniser(recogniser: Recogniser, manifest: str, decoding: Mapping[str, Any], lm_weights: Sequence[float],
                    word_scores: Sequence[float], *, accelerator: str = "auto", train_manifest: str | None = None,
                    emissions: tuple[list[Emission], list] | None = None, **loader_options: Any) -> dict[str, Any]:
    """Compute ``manifest``'s emissions with ``recogniser`` once (or take ``emissions``, what
    :func:`manifest_emissions` returned for it) and search the (lm_weight, word_score) grid of
    the ``decoding`` config over them. Returns ``{"manifest", "lm", "lm_sha256", "best",
    "points", "skipped_audio"}`` (``points`` best first).
    ``loader_options``: :func:`fastasr.scoring.decoding_options` of a data config."""
    if emissions is None:
        emissions = manifest_emissions(recogniser, manifest, accelerator=accelerator, **loader_options)
    emissions, skipped_audio = emissions
    points = grid_search(emissions, recogniser.tokenizer, decoding, list(lm_weights), list(word_scores),
                         train_manifest, bundled_lexicon=recogniser.lexicon, bundled_lm=recogniser.lm)
    lm = resolve_lm(decoding.get("lm"), train_manifest, recogniser.lm)
    return {"manifest": str(manifest),
            "lm": lm.path if isinstance(lm, BundledLM) else lm,  # the checkpoint's LM: where it was built
            "lm_sha256": lm.sha256 if isinstance(lm, BundledLM) else None,
            "best": points[0], "points": points, "skipped_audio": skipped_audio}


def tune(cfg: DictConfig) -> dict[str, Any]:
    """Load ``cfg.ckpt_path`` (averaged with ``cfg.average``), compute the emissions of
    ``cfg.tune.manifest`` once, search the grid; writes ``tune.json`` to the run directory."""
    from fastasr.checkpoint_averaging import average_into

    L.seed_everything(cfg.seed, workers=True)
    attention = OmegaConf.to_container(cfg.attention, resolve=True) if cfg.get("attention") else None
    recogniser = load_recogniser(cfg.ckpt_path, attention)
    average_into(recogniser.model, cfg.ckpt_path, **(cfg.get("average") or {}))
    result = tune_recogniser(recogniser, cfg.tune.manifest, OmegaConf.to_container(cfg.decoding, resolve=True),
                             cfg.tune.lm_weight, cfg.tune.word_score, accelerator=cfg.accelerator,
                             train_manifest=training_manifest(cfg.data), **decoding_options(cfg.data))
    out = {"ckpt_path": str(cfg.ckpt_path), **result}
    run_dir = RunDir(HydraConfig.get().runtime.output_dir if HydraConfig.initialized()
                     else cfg.paths.output_dir).create()
    run_dir.tune_file.write_text(json.dumps(out, indent=2) + "\n")
    return out


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="tune_decoding")
def main(cfg: DictConfig) -> None:
    out = tune(cfg)
    for p in sorted(out["points"], key=lambda p: (p["lm_weight"], p["word_score"])):
        print(f"lm_weight={p['lm_weight']:g} word_score={p['word_score']:g} WER={p['wer']:.2f}")
    best = out["best"]
    print(f"best: decoding.lm_weight={best['lm_weight']:g} decoding.word_score={best['word_score']:g} "
          f"WER={best['wer']:.2f}")


if __name__ == "__main__":
    main()
