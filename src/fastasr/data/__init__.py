"""The training-time data pipeline: manifests, audio, features, tokenizers, samplers and
the DataModule. (Corpus builders and converters are offline tools: ``fastasr.corpora``.)

Names are imported lazily, so the corpus builders (and their worker processes) that
import ``fastasr.data.audio`` do not pay for importing Lightning.
"""

from importlib import import_module

_EXPORTS = {
    "ASRDataModule": "datamodule",
    "ASRDataset": "datamodule",
    "collate": "datamodule",
    "AugmentConfig": "augment",
    "WaveformAugment": "augment",
    "CacheConfig": "feature_cache",
    "FeatureCache": "feature_cache",
    "Fbank": "features",
    "FeatureConfig": "features",
    "compute_cmvn_stats": "features",
    "ManifestError": "manifest",
    "Utterance": "manifest",
    "read_manifest": "manifest",
    "write_manifest": "manifest",
    "FrameBudgetBatchSampler": "sampler",
    "Tokenizer": "tokenizer",
    "UnknownUnitError": "tokenizer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f"fastasr.data.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'fastasr.data' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
