"""Train a CTC recogniser: ``fastasr-train [hydra overrides]``, ``python train.py [overrides]``
(the repository's shim) or ``python -m fastasr.cli.train`` (conf/train.yaml; ``--help`` lists the
config groups and most used keys: conf/hydra/help/train.yaml).

:func:`main` is the entry point of all three: it adds the overrides of a rank > 0 process
(torchrun, Lightning's launcher) before Hydra parses the command line, and drops an inherited
wandb service, then runs the Hydra task :func:`run`.
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

from fastasr.config import CONFIG_DIR
from fastasr.distributed import hydra_overrides_for_rank
from fastasr.quiet import quiet_known_noise


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
def run(cfg: DictConfig) -> None:
    """The Hydra task: train, then print the test split's error rates (greedy, and the final decoding's)."""
    # torch and Lightning load here, after Hydra has composed the config and the preflight
    # (fastasr.cli.preflight) has checked it: a refused command does not wait for them
    from fastasr.recognition.evaluation import format_result_line  # loads torch
    from fastasr.training.fit import train  # loads torch and Lightning

    quiet_known_noise()  # third-party messages that are not the user's to act on (fastasr.quiet)
    result = train(cfg)
    test = result.test
    if test:  # training's own test: greedy decoding; a phoneme model's WER is over phonetic words
        metric = "per" if "per" in test else "cer"  # phoneme models: PER; character and subword models: CER
        print(f"test: {metric.upper()}={test[metric]:.2f} WER={test['wer']:.2f} ({result.tested_ckpt})")
    final = result.final_decoding
    if final:  # the same split by final_decoding (beam search, + LM when built): WER over real words
        lm = " + LM" if final.decoding.get("lm") else ""
        print(f"test, {final.decoding['name']}{lm}, {final.words} words: {format_result_line(final)}")


def main() -> None:
    """``fastasr-train`` / ``python train.py``: Hydra reads the overrides from ``sys.argv``."""
    sys.argv += hydra_overrides_for_rank(sys.argv[1:])  # ranks > 0 (torchrun) write nothing to the run dir
    # A wandb service inherited from the Python process that started this one would still hold
    # the run id of a killed training, and the resumed one could not reattach: use our own.
    os.environ.pop("WANDB_SERVICE", None)
    run()


if __name__ == "__main__":
    main()
