"""Shared test fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

TINY_COUNTS = {"train": 10, "dev": 2, "test": 2}


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    """A tiny espeak-ng corpus (10 train, 2 dev, 2 test utterances of 1-8 s, 16 kHz),
    synthesised once per test session. Returns the directory holding
    ``train.jsonl``, ``dev.jsonl``, ``test.jsonl`` (and ``wav/``)."""
    from fastasr.corpora.synthetic import build_corpus

    out = tmp_path_factory.mktemp("tiny_corpus")
    build_corpus(out, seed=0, counts=TINY_COUNTS, workers=1)
    return out
