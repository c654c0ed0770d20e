"""Mini LibriSpeech (``train-clean-5``) → a fixed speaker-disjoint train/dev/test split.

    fastasr-corpus mini-librispeech SRC OUT

``SRC`` is a local copy of a repository or directory holding ``LibriSpeech/train-clean-5``
(the public repository ``zhangrui0712/Voice-Age`` has it complete), the ``LibriSpeech``
directory, or the ``train-clean-5`` directory itself. ``train-clean-5`` (CC BY 4.0) has
1,519 utterances from 28 speakers, 5.3 h of FLAC at 16 kHz.

The split is fixed so that numbers compare across runs and machines (``SPLIT``):

* test: speakers 19, 2136, 5789, 6848 (157 utterances, 34 min, 5,424 words);
* dev: speakers 1737, 1867 (64 utterances);
* train: the other 22 speakers (1,298 utterances, 4.5 h).

``--train-minutes M`` keeps only the first ``M`` minutes of train, taken in turn from every
training speaker (each speaker's utterances in id order, one speaker after another, round
after round), so the subset keeps all 22 voices: the small-corpus check of a recipe (40
minutes is the scale of the smallest real corpora, such as AN4 or a new language's first
recordings). Dev and test stay the same.

Writes ``OUT/{train,dev,test}.jsonl`` (pointing at the FLAC files where they are; ``text``
lower-cased, ``speaker`` the LibriSpeech speaker id). A speaker of ``SPLIT`` that the copy
lacks is an error naming it; any other speaker goes to train. Idempotent: a second run with
the same source finds ``OUT/.complete`` and does nothing (``--force`` rebuilds).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fastasr.corpora import command
from fastasr.corpora.command import write_split
from fastasr.corpora.librispeech import read_part
from fastasr.corpora.marker import mark_complete, needs_build
from fastasr.corpora.paths import CorpusLayoutError, require_dir
from fastasr.corpora.skipped import Skipped

PART = "train-clean-5"
SPLIT = {  # held-out speakers; every other speaker of the part is train
    "test": ("19", "2136", "5789", "6848"),
    "dev": ("1737", "1867"),
}
SPLITS = ("train", "dev", "test")
LAYOUT = f"a directory holding LibriSpeech/{PART}/<speaker>/<chapter>/*.trans.txt (or that part itself)"


def find_part(src: Path) -> Path:
    """The ``train-clean-5`` directory under ``src`` (a repository copy, ``LibriSpeech/`` or the part)."""
    for candidate in (src, src / PART, src / "LibriSpeech" / PART):
        if candidate.name == PART and candidate.is_dir():
            return candidate
    raise CorpusLayoutError(f"{src}: no {PART} directory in it, nor in its LibriSpeech/; expected {LAYOUT}")


def split_of(speaker: str) -> str:
    """``train``, ``dev`` or ``test`` for a LibriSpeech speaker id."""
    for name, speakers in SPLIT.items():
        if speaker in speakers:
            return name
    return "train"


def round_robin_minutes(records: list[dict], minutes: float) -> list[dict]:
    """The first ``minutes`` of ``records`` taken one utterance per speaker in turn: every
    speaker's first utterance (by id), then every speaker's second, and so on, speakers in sorted
    order; the utterance that crosses ``minutes`` is kept."""
    by_speaker: dict[str, list[dict]] = {}
    for rec in sorted(records, key=lambda r: r["id"]):
        by_speaker.setdefault(rec["speaker"], []).append(rec)
    in_turn = sorted(((rank, speaker), rec) for speaker, utts in by_speaker.items() for rank, rec in enumerate(utts))
    kept: list[dict] = []
    total = 0.0
    for _, rec in in_turn:
        if total >= minutes * 60:
            break
        kept.append(rec)
        total += rec["duration"]
    return kept


def build(src: str | Path, out: str | Path, force: bool = False,
          train_minutes: float | None = None) -> dict[str, list[dict]]:
    """Write ``OUT/{train,dev,test}.jsonl`` of the fixed split (train cut to ``train_minutes``
    by :func:`round_robin_minutes` when given); returns the records by split."""
    if train_minutes is not None and train_minutes <= 0:
        raise ValueError(f"--train-minutes {train_minutes}; expected a positive number of minutes")
    part = find_part(require_dir(src, LAYOUT))
    out = Path(out)
    settings = {"corpus": "mini_librispeech", "source": str(part.resolve()), "split": SPLIT}
    if train_minutes is not None:
        settings["train_minutes"] = train_minutes
    if not needs_build(out, settings, [f"{s}.jsonl" for s in SPLITS], force, "Mini LibriSpeech"):
        return {}
    found = {p.name for p in part.iterdir() if p.is_dir()}
    missing = sorted(s for speakers in SPLIT.values() for s in speakers if s not in found)
    if missing:
        raise CorpusLayoutError(f"{part}: speaker director(ies) {missing} of the fixed split are missing; "
                                f"expected the complete {PART} (28 speakers)")
    skipped = Skipped("utterance")
    by_split: dict[str, list[dict]] = {s: [] for s in SPLITS}
    for rec in read_part(part, skipped):
        by_split[split_of(rec["speaker"])].append(rec)
    if train_minutes is not None:
        by_split["train"] = round_robin_minutes(by_split["train"], train_minutes)
    out.mkdir(parents=True, exist_ok=True)
    for name in SPLITS:
        write_split(out, name, by_split[name], skipped if name == "train" else Skipped("utterance"), part)
    mark_complete(out, settings)
    return by_split


def main(argv: Sequence[str] | None = None) -> int:
    p = command.parser("mini_librispeech", __doc__, f"a copy holding LibriSpeech/{PART} (or that directory)",
                       "output directory for train/dev/test.jsonl")
    p.add_argument("--force", action="store_true", help="rebuild even if OUT holds this split already")
    p.add_argument("--train-minutes", type=float, default=None, metavar="M",
                   help="keep only M minutes of train, taken from every training speaker in turn")
    return command.run(p, argv, lambda a: build(a.src, a.out, a.force, a.train_minutes))
