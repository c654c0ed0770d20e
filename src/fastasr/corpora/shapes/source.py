"""The source of a corpus shape (``fastasr-corpus shapes``): its train/dev/test manifests
read and checked, and the helpers every shape uses (keyed random draws, the path of a written
utterance)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from fastasr.corpora.paths import CorpusLayoutError, require_dir
from fastasr.corpora.skipped import Skipped
from fastasr.data.augment import draw_seed
from fastasr.data.manifest import Utterance, _check_line

SPLITS = ("train", "dev", "test")
LAYOUT = "a corpus directory holding train.jsonl, dev.jsonl and test.jsonl (manifests, docs/DATA.md)"


def read_corpus(src: str | Path) -> tuple[dict[str, list[Utterance]], dict[str, Skipped]]:
    """The utterances of ``SRC/{train,dev,test}.jsonl``, each line validated as training does
    (``fastasr.data.manifest``: JSON, fields, duration, the audio file's header). A bad line,
    or a second line with an id already seen in that split, is reported and skipped (counted in
    that split's ``Skipped``). A missing manifest is a ``CorpusLayoutError`` naming it."""

    root = require_dir(src, LAYOUT)
    corpus: dict[str, list[Utterance]] = {}
    skipped: dict[str, Skipped] = {}
    for split in SPLITS:
        path = root / f"{split}.jsonl"
        if not path.is_file():
            raise CorpusLayoutError(f"{path}: no such manifest; expected {LAYOUT}")
        skipped[split] = Skipped("utterance")
        seen: set[str] = set()
        corpus[split] = []
        with open(path, encoding="utf-8") as f:
            for lineno, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                where = f"manifest {path} line {lineno}"
                try:
                    utt = _check_line(raw, path.parent, check_audio=True)
                except ValueError as err:
                    skipped[split].add(where, "bad manifest line", str(err))
                    continue
                if utt.id in seen:
                    skipped[split].add(where, "duplicate id", f"id {utt.id!r} already seen; expected unique ids")
                    continue
                seen.add(utt.id)
                corpus[split].append(utt)
    return corpus, skipped


def source_hashes(src: Path) -> dict[str, str]:
    return {s: hashlib.sha256((src / f"{s}.jsonl").read_bytes()).hexdigest()[:16] for s in SPLITS}


def draw_rng(seed: int, *parts: object) -> np.random.Generator:

    return np.random.default_rng(draw_seed(seed, *parts))


def wav_path(out: Path, split: str, utt_id: str) -> Path:
    return out / "wav" / split / (utt_id.replace("/", "_").replace("\\", "_") + ".wav")
