"""Decode a manifest with a checkpoint:
`python evaluate.py ckpt_path=PATH [data.test_manifest=E.jsonl] [attention=...] [decoding=beam_lm]`.

The checkpoint carries all decoding needs (lexicon and word LM included); conf/evaluate.yaml
composes no training data config. Prints `PER=<x> WER=<y>` (percent) as its last line and
writes results.json to its run dir.
"""

import hydra
from omegaconf import DictConfig

from fastasr.config import CONFIG_DIR
from fastasr.evaluation import evaluate, format_result_line


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="evaluate")
def main(cfg: DictConfig) -> None:
    result = evaluate(cfg)
    print(format_result_line(result))


if __name__ == "__main__":
    main()
