"""TIMIT → ``train.jsonl`` (462 speakers), ``dev.jsonl`` (50) and ``test.jsonl`` (the 24-speaker core test).

    fastasr-corpus timit SRC OUT [--partial]

``SRC`` is the TIMIT directory holding ``TRAIN/`` and ``TEST/`` (directly or under
``data/`` or ``TIMIT/``), with ``<DR>/<SPEAKER>/<SENTENCE>.{WAV,PHN,WRD,TXT}`` below in
upper or lower case. ``.WAV`` files are NIST SPHERE (read by soundfile/libsndfile; RIFF
works too); manifests point at them where they are. The SA1/SA2 sentences (read by every
speaker) are excluded, as is standard. The speaker lists of the standard dev and core test
sets are package data (``timit_speakers/``); training is every speaker of ``TRAIN/``.
Without ``--partial``, a copy that lacks speakers of any split is an error (a
half-extracted corpus); ``--partial`` builds from whatever is there.

``phonemes`` hold the **61-phone** transcription of the ``.PHN`` file, every label in
order (closures, ``h#``, ``pau``, ``epi``, ``q`` included), with ``|`` between words: a
phone belongs to the ``.WRD`` word containing its midpoint, and phones outside every word
(silences between words) form their own group. Train with ``data=timit``
(``data.phone_folding=timit``): the tokenizer folds the 61 phones to the 48 of Lee & Hon
for training and the 48 to the standard 39 for scoring PER (``fastasr.data.phone_sets``).
``text`` is the ``.TXT`` sentence, normalised (``normalize_transcript``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from fastasr.corpora import command
from fastasr.corpora.command import write_split
from fastasr.corpora.paths import CorpusLayoutError, child_ci, require_dir
from fastasr.corpora.skipped import Skipped, duration_or_skip
from fastasr.corpora.text import normalize_transcript
from fastasr.data.phone_sets import TIMIT_61

log = logging.getLogger(__name__)
LAYOUT = "a TIMIT directory with TRAIN/ and TEST/ holding <DR>/<SPEAKER>/<SENTENCE>.WAV/.PHN/.WRD/.TXT"
SPLITS = ("train", "dev", "test")
TRAIN_SPEAKERS = 462
_LISTS = Path(__file__).with_name("timit_speakers")


def speaker_list(name: str) -> tuple[str, ...]:
    """The speakers (lower case) of the standard ``dev`` or ``core_test`` list."""
    lines = (_LISTS / f"{name}.txt").read_text().splitlines()
    return tuple(s.strip().lower() for s in lines if s.strip() and not s.startswith("#"))


def find_root(src: Path) -> tuple[Path, Path]:
    """``(TRAIN dir, TEST dir)`` at ``src``, ``src/data`` or ``src/TIMIT`` (any case)."""
    for base in (src, child_ci(src, "data"), child_ci(src, "timit")):
        if base is None or not base.is_dir():
            continue
        train, test = child_ci(base, "train"), child_ci(base, "test")
        if train is not None and test is not None:
            return train, test
    raise CorpusLayoutError(f"{src}: no TRAIN/ and TEST/ directories (in any case, also under data/ or TIMIT/); "
                            f"expected {LAYOUT}")


def speakers_below(split_dir: Path) -> dict[str, Path]:
    """Speaker (lower case) → its directory, for ``<DR>/<SPEAKER>/`` below a TRAIN or TEST dir."""
    return {d.name.lower(): d for region in sorted(split_dir.iterdir()) if region.is_dir()
            for d in sorted(region.iterdir()) if d.is_dir()}


def _sibling(phn: Path, suffix: str) -> Path | None:
    """The file beside ``phn`` with the same stem and ``suffix``, in any case."""
    for cand in sorted(phn.parent.iterdir()):
        if cand.stem.lower() == phn.stem.lower() and cand.suffix.lower() == suffix:
            return cand
    return None


def _timing(path: Path) -> list[tuple[int, int, str]]:
    """``<start> <end> <label>`` lines (sample indices); ValueError naming the bad line."""
    rows = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 3 or not (parts[0].isdigit() and parts[1].isdigit()):
            raise ValueError(f"{path} line {lineno}: {line!r}; expected '<start> <end> <label>'")
        rows.append((int(parts[0]), int(parts[1]), parts[2].lower()))
    return rows


def phone_groups(phones: Sequence[tuple[int, int, str]], words: Sequence[tuple[int, int, str]]) -> str:
    """The 61-phone transcription with ``|`` between words (see the module docstring)."""
    groups: list[list[str]] = []
    current: object = object()
    for start, end, phone in phones:
        mid = (start + end) / 2
        word = next((w for w, (ws, we, _) in enumerate(words) if ws <= mid < we), None)
        if not groups or word != current:
            groups.append([])
            current = word
        groups[-1].append(phone)
    return " | ".join(" ".join(g) for g in groups)


def read_speaker(speaker: str, directory: Path, skipped: Skipped) -> list[dict]:
    """Manifest records of one speaker's sentences (SA1/SA2 excluded)."""
    records = []
    for phn in sorted(p for p in directory.iterdir() if p.suffix.lower() == ".phn"):
        sentence = phn.stem.lower()
        if sentence.startswith("sa"):
            continue
        files = {s: _sibling(phn, s) for s in (".wav", ".wrd", ".txt")}
        missing = [s for s, f in files.items() if f is None]
        if missing:
            skipped.add(str(phn), f"no {'/'.join(missing)} beside it")
            continue
        try:
            phones, words = _timing(phn), _timing(files[".wrd"])
        except ValueError as e:
            skipped.add(str(phn), "bad timing file", str(e))
            continue
        unknown = sorted({p for _, _, p in phones} - set(TIMIT_61))
        if unknown:
            skipped.add(str(phn), "not a TIMIT phone", f"{unknown}; expected the 61 of TIMIT")
            continue
        duration = duration_or_skip(files[".wav"], skipped)
        if duration is None:
            continue
        fields = files[".txt"].read_text(errors="replace").split(maxsplit=2)
        text = normalize_transcript(fields[2] if len(fields) == 3 else " ".join(w for _, _, w in words))
        if not text or not phones:
            skipped.add(str(phn), "empty transcript")
            continue
        records.append({
            "id": f"{speaker}_{sentence}", "audio_filepath": str(files[".wav"].resolve()),
            "duration": round(duration, 6), "text": text, "phonemes": phone_groups(phones, words),
            "speaker": speaker,
        })
    return records


def split_speakers(train_dir: Path, test_dir: Path, partial: bool) -> dict[str, dict[str, Path]]:
    """Speaker directories of each split; a clear error when speakers are missing (unless ``partial``)."""
    train, test = speakers_below(train_dir), speakers_below(test_dir)
    lists = {"dev": speaker_list("dev"), "test": speaker_list("core_test")}
    splits = {"train": train, **{k: {s: test[s] for s in v if s in test} for k, v in lists.items()}}
    for split, found in splits.items():
        if not found:
            raise CorpusLayoutError(f"{train_dir.parent}: no speaker of the {split} split; expected {LAYOUT}")
        expected = len(lists[split]) if split in lists else TRAIN_SPEAKERS
        if len(found) != expected and not partial:
            missing = f" (missing: {', '.join(sorted(set(lists[split]) - set(found))[:5])}, ...)" if split in lists else ""
            raise CorpusLayoutError(
                f"{train_dir.parent}: {len(found)} speakers of the standard {split} split; expected "
                f"{expected}{missing}. A half-extracted copy? --partial builds from what is there")
    return splits


def convert(src: str | Path, out: str | Path, partial: bool = False) -> dict[str, list[dict]]:
    """Write ``OUT/{train,dev,test}.jsonl``; returns the records of each split."""
    train_dir, test_dir = find_root(require_dir(src, LAYOUT))
    written = {}
    for split, speakers in split_speakers(train_dir, test_dir, partial).items():
        skipped = Skipped("utterance")
        written[split] = [r for spk, d in speakers.items() for r in read_speaker(spk, d, skipped)]
        write_split(out, split, written[split], skipped, src)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    p = command.parser("timit", __doc__, "the TIMIT directory (holding TRAIN/ and TEST/)",
                       "output directory for train/dev/test.jsonl")
    p.add_argument("--partial", action="store_true", help="build even if speakers of a split are missing")
    return command.run(p, argv, lambda a: convert(a.src, a.out, a.partial))
