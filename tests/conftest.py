"""Shared test fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

TINY_COUNTS = {"train": 10, "dev": 2, "test": 2}


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` need a CUDA GPU: skipped where none is visible (CI), run by
    ``make gpu-check`` (``pytest -m cuda``), so none is skipped everywhere."""
    cuda = [item for item in items if item.get_closest_marker("cuda")]
    if not cuda:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: make gpu-check runs it (pytest -m cuda)")
    for item in cuda:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    """A tiny espeak-ng corpus (10 train, 2 dev, 2 test utterances of 1-8 s, 16 kHz),
    synthesised once per test session. Returns the directory holding
    ``train.jsonl``, ``dev.jsonl``, ``test.jsonl`` (and ``wav/``)."""
    from fastasr.corpora.synthetic import build_corpus

    out = tmp_path_factory.mktemp("tiny_corpus")
    build_corpus(out, seed=0, counts=TINY_COUNTS, workers=1)
    return out
