"""Recordings of single spoken digits in their public layouts, found and indexed.

* **AudioMNIST** (``soerenab/AudioMNIST``): ``data/<NN>/<digit>_<NN>_<index>.wav``, 48 kHz,
  60 speakers ``01``–``60``, speaker metadata in ``data/audioMNIST_meta.txt`` (JSON).
* **FSDD** (``Jakobovski/free-spoken-digit-dataset``): ``recordings/<digit>_<speaker>_<index>.wav``,
  8 kHz, 6 speakers, speaker metadata in ``metadata.py`` (a Python dict literal).

``find_source(SRC)`` accepts the repository root or the ``data/`` / ``recordings/``
directory itself. The speakers named in the metadata must all have recordings of every
digit, else the copy is taken as half-downloaded and a clear error says what is missing.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from fastasr.corpora.paths import CorpusLayoutError, require_dir

LAYOUTS = ("AudioMNIST: data/<NN>/<digit>_<NN>_<index>.wav (+ data/audioMNIST_meta.txt), or "
           "FSDD: recordings/<digit>_<speaker>_<index>.wav (+ metadata.py)")
_AUDIOMNIST_FILE = re.compile(r"^(\d)_(\d+)_(\d+)\.wav$", re.IGNORECASE)
_FSDD_FILE = re.compile(r"^(\d)_([A-Za-z]\w*)_(\d+)\.wav$", re.IGNORECASE)


@dataclass
class DigitSource:
    """An indexed copy: ``files[speaker][digit]`` = sorted recording paths."""

    corpus: str                     # "audiomnist" or "fsdd"
    root: Path                      # the directory holding the recordings
    files: dict[str, dict[int, list[Path]]] = field(default_factory=dict)
    metadata_speakers: tuple[str, ...] | None = None  # speakers the metadata lists (None: no metadata)

    @property
    def speakers(self) -> list[str]:
        return sorted(self.files)

    @property
    def num_files(self) -> int:
        return sum(len(v) for by_digit in self.files.values() for v in by_digit.values())


def recording_index(path: Path) -> int:
    """The ``<index>`` of ``<digit>_<speaker>_<index>.wav`` (both layouts)."""
    return int(Path(path).stem.rsplit("_", 1)[1])


def _index(paths, pattern: re.Pattern) -> dict[str, dict[int, list[Path]]]:
    files: dict[str, dict[int, list[Path]]] = {}
    for path in sorted(paths):
        m = pattern.match(path.name)
        if m:
            files.setdefault(m.group(2).lower(), {}).setdefault(int(m.group(1)), []).append(path)
    return files


def _audiomnist(data: Path) -> DigitSource:
    speaker_dirs = [d for d in sorted(data.iterdir()) if d.is_dir() and d.name.isdigit()]
    files = _index((p for d in speaker_dirs for p in d.iterdir()), _AUDIOMNIST_FILE)
    meta = data / "audioMNIST_meta.txt"
    speakers = None
    if meta.is_file():
        try:
            speakers = tuple(sorted(json.loads(meta.read_text())))
        except json.JSONDecodeError as e:
            raise CorpusLayoutError(f"{meta}: not JSON ({e.msg} at line {e.lineno}); expected AudioMNIST's "
                                    "speaker metadata") from None
    for d in speaker_dirs:  # a speaker directory without recordings is a half-downloaded copy
        files.setdefault(d.name.lower(), {})
    return DigitSource("audiomnist", data, files, speakers)


def _fsdd(recordings: Path) -> DigitSource:
    files = _index(recordings.glob("*.wav"), _FSDD_FILE)
    meta = recordings.parent / "metadata.py"
    speakers = None
    if meta.is_file():
        try:  # `metadata = {...}`: read the literal, never execute the file
            tree = ast.parse(meta.read_text())
            literal = next(n.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict))
            speakers = tuple(sorted(str(k).lower() for k in ast.literal_eval(literal)))
        except (SyntaxError, ValueError, StopIteration):
            speakers = None  # unreadable metadata: check against the split sizes only
    return DigitSource("fsdd", recordings, files, speakers)


def find_source(src: str | Path) -> DigitSource:
    """Detect the layout of ``src`` and index its recordings; a clear error for a wrong
    path, an unknown layout or a half-downloaded copy."""
    src = require_dir(src, LAYOUTS)
    candidates = [(src / "data", _audiomnist), (src / "recordings", _fsdd)]
    if any(d.is_dir() and d.name.isdigit() for d in src.iterdir()):
        candidates.insert(0, (src, _audiomnist))
    if any(_FSDD_FILE.match(p.name) for p in src.glob("*.wav")):
        candidates.insert(0, (src, _fsdd))
    for directory, reader in candidates:
        if directory.is_dir():
            source = reader(directory)
            if source.files:
                check_complete(source)
                return source
            raise CorpusLayoutError(f"{directory}: no recordings named <digit>_<speaker>_<index>.wav; "
                                    f"expected {LAYOUTS}")
    raise CorpusLayoutError(f"{src}: neither AudioMNIST nor FSDD; expected {LAYOUTS}")


def check_complete(source: DigitSource) -> None:
    """Every speaker of the metadata has a directory/recordings, and every speaker every digit."""
    if source.metadata_speakers is not None:
        missing = sorted(set(source.metadata_speakers) - {s for s, d in source.files.items() if d})
        if missing:
            raise CorpusLayoutError(
                f"{source.root}: no recordings of {len(missing)} of the {len(source.metadata_speakers)} speakers "
                f"in the metadata ({', '.join(missing[:8])}{', ...' if len(missing) > 8 else ''}); "
                "a half-downloaded copy?")
    for speaker, by_digit in sorted(source.files.items()):
        absent = [d for d in range(10) if not by_digit.get(d)]
        if absent:
            raise CorpusLayoutError(f"{source.root}: speaker {speaker} has no recordings of digit(s) "
                                    f"{absent}; a half-downloaded copy? (every speaker needs all ten)")
