"""Decode a manifest with a checkpoint: ``fastasr-evaluate ckpt_path=PATH [data.test_manifest=E.jsonl]
[attention=...] [decoding=beam_lm]``, also ``python evaluate.py ...`` (the repository's shim) and
``python -m fastasr.cli.evaluate``.

The checkpoint carries all decoding needs (lexicon and word LM included); conf/evaluate.yaml
composes no training data config. Prints the decoding that ran and where results.json went,
then ``PER=<x> WER=<y> (<n> utterances)`` (percent; CER for character models) as its last line.
A command whose checkpoint or manifest is missing stops before its run directory is made
(:class:`fastasr.cli.preflight.EvaluatePreflight`); any other failure is written into the run
directory's evaluate.log.
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig

from fastasr.config import CONFIG_DIR
from fastasr.quiet import quiet_known_noise

log = logging.getLogger("evaluate")


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="evaluate")
def main(cfg: DictConfig) -> None:
    """The Hydra entry point: decode, print the decoding, where results.json is, and the error rates."""
    # torch and Lightning load here, after Hydra's composition and the preflight's check
    from fastasr.recognition.evaluation import (  # loads torch
        decoding_label,
        evaluate,
        format_result_line,
    )

    quiet_known_noise()  # third-party messages that are not the user's to act on (fastasr.quiet)
    try:
        result = evaluate(cfg)
    except Exception:  # into evaluate.log too, not only onto the terminal
        log.exception("evaluate failed")
        raise SystemExit(1) from None
    print(f"decoding: {decoding_label(result.decoding)}, {result.words} words; "
          f"results: {Path(result.run_dir) / 'results.json'}")
    print(format_result_line(result))


if __name__ == "__main__":
    main()
