"""``fastasr-features [overrides of conf/train.yaml]`` (``make features``; or ``python -m fastasr.cli.features``): the
feature caches of ``data.train/dev/test_manifest`` under ``data.cache.dir``, for the features
training would compute (the training config composed and derived as ``train.py`` does it;
:func:`fastasr.data.feature_cache.build_for_config`). Prints one line per cache.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from hydra import compose, initialize_config_dir

from fastasr.config import CONFIG_DIR
from fastasr.data.feature_cache import build_for_config
from fastasr.training.derived_config import resolve_train_config


def main(argv: Sequence[str] | None = None) -> None:
    """``fastasr-features [hydra overrides of conf/train.yaml]``."""
    overrides = list(sys.argv[1:] if argv is None else argv)
    if {"-h", "--help"} & set(overrides):
        print("usage: fastasr-features [hydra overrides of conf/train.yaml]\n"
              "Builds the feature caches of data.train/dev/test_manifest under data.cache.dir\n"
              "(e.g. data=manifest data.train_manifest=T.jsonl ... features=fbank80).")
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    resolve_train_config(cfg)  # tokenizer, batch price: the values training works out
    for cache in build_for_config(cfg.data):
        print(f"{cache.directory}: {len(cache)} utterances, {cache.num_frames} frames, {cache.nbytes() / 1e6:.1f} MB"
              + (f", {len(cache.skipped)} skipped" if cache.skipped else ""))


if __name__ == "__main__":
    main()
