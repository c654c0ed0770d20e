"""``fastasr-features [overrides of conf/train.yaml]`` (``make features``; or ``python -m fastasr.cli.features``): the
feature caches of ``data.train/dev/test_manifest`` under ``data.cache.dir``, for the features
training would compute (the training config composed and derived as ``train.py`` does it;
:func:`build_for_config`). Prints one line per cache.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from fastasr.config import CONFIG_DIR
from fastasr.data.augment import AugmentConfig, Variant
from fastasr.data.feature_cache import CacheConfig, FeatureCache, open_feature_caches
from fastasr.data.features import FeatureConfig, with_native_rate
from fastasr.data.manifest import read_manifest
from fastasr.training.derived_config import resolve_train_config

log = logging.getLogger(__name__)


def build_for_config(data_cfg: Mapping) -> list[FeatureCache]:
    """Build (or find) the caches of a data config's train/dev/test manifests; for train,
    one per variant of ``augment`` (speed × VTLP × pitch factors in use). Returns them."""
    cfg = OmegaConf.create(data_cfg) if not OmegaConf.is_config(data_cfg) else data_cfg
    config = FeatureConfig.from_dict(OmegaConf.to_container(cfg.features, resolve=True))
    cache = CacheConfig.from_dict({**OmegaConf.to_container(cfg.cache, resolve=True), "mode": "build"})
    augment = AugmentConfig.from_dict(OmegaConf.to_container(cfg.get("augment"), resolve=True)
                                      if cfg.get("augment") is not None else None)
    manifests = {}  # split → its utterances, each manifest read once
    for split in ("train", "dev", "test"):
        key = f"{split}_manifest"
        if key not in cfg or OmegaConf.is_missing(cfg, key) or not cfg[key]:
            log.info("%s: no manifest (data.%s); nothing to cache", split, key)
            continue
        manifests[split] = read_manifest(cfg[key], on_error=cfg.get("on_bad_utterance", "skip"))
    if not config.resolved:  # features.sample_rate null: the training audio's own rate, as training resolves it
        if "train" not in manifests:
            raise ValueError("features.sample_rate is null (the training audio's rate) but data.train_manifest "
                             "is not set; set one of them")
        config = with_native_rate(config, [u.audio_filepath for u in manifests["train"]],
                                  f"data.train_manifest {cfg.train_manifest}")
    built = []
    for split, utterances in manifests.items():
        key = f"{split}_manifest"
        if split == "train" and augment.needs_audio:
            log.info("train: not cached: data.augment.noise mixes noise into the audio, so training computes "
                     "its features on the fly")
            continue
        variants = augment.variants if split == "train" else (Variant(),)
        built.extend(open_feature_caches(utterances, cfg[key], config, cache, variants,
                                         int(cfg.get("num_workers", 0))).values())
    return built


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
