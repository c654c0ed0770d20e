"""``fastasr-tune ckpt_path=CKPT [overrides]`` (or ``python -m fastasr.cli.tune``): tune the beam search's LM weight
and word score on the dev split.

    fastasr-tune ckpt_path=PATH                       # decoding=beam_lm, dev split
    fastasr-tune ckpt_path=PATH data.dev_manifest=D.jsonl decoding.lm.path=LM tune.lm_weight=[0,1,2]

The model runs once over the manifest; each grid point re-runs only the search
(:func:`fastasr.recognition.scoring.tune_recogniser`). The lexicon and word LM are the checkpoint's own
(``decoding=beam_lm``, source ``auto``) unless ``decoding.lexicon`` / ``decoding.lm`` name
others. Prints one line per point and, last, the best pair as overrides for ``evaluate.py``;
writes ``tune.json`` (every point) to the run directory.
"""

from __future__ import annotations

import json
from dataclasses import replace

import hydra
import lightning as L
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from fastasr.config import CONFIG_DIR
from fastasr.recognition.checkpoint_averaging import average_into
from fastasr.recognition.loading import load_recogniser
from fastasr.recognition.scoring import (
    TuningResult,
    decoding_options,
    training_manifest,
    tune_recogniser,
)
from fastasr.rundir import RunDir


def tune(cfg: DictConfig) -> TuningResult:
    """Load ``cfg.ckpt_path`` (averaged with ``cfg.average``), compute the emissions of
    ``cfg.tune.manifest`` once, search the grid; writes ``tune.json`` to the run directory."""
    L.seed_everything(cfg.seed, workers=True)
    attention = OmegaConf.to_container(cfg.attention, resolve=True) if cfg.get("attention") else None
    recogniser = load_recogniser(cfg.ckpt_path, attention, training_manifest=training_manifest(cfg.data))
    average_into(recogniser.model, cfg.ckpt_path, **(cfg.get("average") or {}))
    result = tune_recogniser(recogniser, cfg.tune.manifest, OmegaConf.to_container(cfg.decoding, resolve=True),
                             cfg.tune.lm_weight, cfg.tune.word_score, accelerator=cfg.accelerator,
                             extend_edges=int(cfg.tune.get("extend_edges") or 0),
                             **decoding_options(cfg.data))
    result = replace(result, ckpt_path=str(cfg.ckpt_path))
    run_dir = RunDir(HydraConfig.get().runtime.output_dir if HydraConfig.initialized()
                     else cfg.paths.output_dir).create()
    run_dir.tune_file.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return result


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="tune_decoding")
def main(cfg: DictConfig) -> None:
    result = tune(cfg)
    for p in sorted(result.points, key=lambda p: (p["lm_weight"], p["word_score"])):
        print(f"lm_weight={p['lm_weight']:g} word_score={p['word_score']:g} WER={p['wer']:.2f}")
    best = result.best
    print(f"best: decoding.lm_weight={best['lm_weight']:g} decoding.word_score={best['word_score']:g} "
          f"WER={best['wer']:.2f}")


if __name__ == "__main__":
    main()
