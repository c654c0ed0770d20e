"""Train a CTC recogniser: `python train.py [hydra overrides]` (see conf/train.yaml)."""

import os
import sys

import hydra
from omegaconf import DictConfig

from fastasr.config import CONFIG_DIR
from fastasr.distributed import hydra_overrides_for_rank
from fastasr.training import train


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
def main(cfg: DictConfig) -> None:
    result = train(cfg)
    test = result.get("test")
    if test:
        print(f"test: PER={test.get('per', float('nan')):.2f} WER={test['wer']:.2f} ({result['best_ckpt']})")


if __name__ == "__main__":
    sys.argv += hydra_overrides_for_rank(sys.argv[1:])  # ranks > 0 (torchrun) write nothing to the run dir
    # A wandb service inherited from the Python process that started this one would still hold
    # the run id of a killed training, and the resumed one could not reattach: use our own.
    os.environ.pop("WANDB_SERVICE", None)
    main()
