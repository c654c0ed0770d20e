"""The cells of the matrix and their storage, ``matrix.csv`` (one row per (train, eval) pair).

A cell's ``status`` is ``ok`` (decoded: PER or CER, WER, utterances, decode seconds), ``n/a``
(the pair cannot run; ``reason`` says why), ``failed`` (``reason`` holds the exception) or
``missing`` (not computed yet). ``checkpoint`` and ``train_step`` name the model an ``ok``
cell was computed with and ``decoding`` the decoder (:func:`decoding_label`), so a re-run keeps
it only while that model and that decoder are unchanged.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastasr.studies.matrix.rules import MatrixError

CSV_FILE, MD_FILE, PNG_FILE = "matrix.csv", "matrix.md", "matrix.png"
CSV_COLUMNS = (
    "train", "eval", "status", "per", "cer", "wer", "utterances", "decode_seconds",
    "reason", "checkpoint", "train_step", "decoding",
)
OK, NA, FAILED, MISSING = "ok", "n/a", "failed", "missing"

#: Cells by (train spec, eval spec).
Cells = Mapping[tuple[str, str], "Cell"]


@dataclass
class Cell:
    """One (train, eval) pair of the matrix (a row of matrix.csv); error rates in percent."""

    train: str
    eval: str
    status: str = MISSING
    per: float | None = None
    cer: float | None = None
    wer: float | None = None
    utterances: int | None = None
    decode_seconds: float | None = None
    reason: str = ""
    checkpoint: str = ""
    train_step: int | None = None
    decoding: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return self.train, self.eval

    @property
    def unit_error(self) -> float | None:
        """PER for phoneme models, CER for character models."""
        return self.per if self.per is not None else self.cer

    def to_row(self) -> dict[str, str]:
        def fmt(v: Any) -> str:
            if v is None:
                return ""
            if isinstance(v, float):
                return f"{v:.4f}" if math.isfinite(v) else "nan"
            return str(v)

        return {c: fmt(getattr(self, c)) for c in CSV_COLUMNS}

    @classmethod
    def from_row(cls, row: Mapping[str, str]) -> Cell:
        def num(key: str, kind=float):
            text = (row.get(key) or "").strip()
            if not text:
                return None
            try:
                return kind(float(text)) if kind is int else kind(text)
            except ValueError:
                return None

        return cls(
            train=row["train"],
            eval=row["eval"],
            status=row.get("status") or MISSING,
            per=num("per"),
            cer=num("cer"),
            wer=num("wer"),
            utterances=num("utterances", int),
            decode_seconds=num("decode_seconds"),
            reason=row.get("reason") or "",
            checkpoint=row.get("checkpoint") or "",
            train_step=num("train_step", int),
            decoding=row.get("decoding") or "",
        )


def read_cells(path: str | Path) -> dict[tuple[str, str], Cell]:
    """The cells of a matrix.csv (empty when the file does not exist)."""
    path = Path(path)
    if not path.is_file():
        return {}
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = {"train", "eval", "status"} - set(reader.fieldnames or ())
        if missing:
            raise MatrixError(f"{path}: not a matrix.csv (no column {', '.join(sorted(missing))})")
        cells = [Cell.from_row(r) for r in reader]
    return {c.key: c for c in cells}


def write_cells(path: str | Path, cells: Iterable[Cell]) -> None:
    """Write matrix.csv atomically (a kill never leaves half a file)."""
    path = Path(path)
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for cell in cells:
            writer.writerow(cell.to_row())
    tmp.replace(path)


def ordered(cells: Cells, train: Sequence[str], evals: Sequence[str]) -> list[Cell]:
    """Cells in train-list × eval-list order, then any others (from earlier lists) after them."""
    first = [cells[(t, e)] for t in train for e in evals if (t, e) in cells]
    seen = {c.key for c in first}
    return first + [c for k, c in cells.items() if k not in seen]


def decoding_label(decoding: Mapping[str, Any] | None) -> str:
    """A short name of a resolved ``conf/decoding`` mapping for matrix.csv: the decoder's name
    and a hash of its settings (files by their names, so a moved data directory keeps cells
    current), e.g. ``greedy-<8 hex digits>``; None is the default greedy decoding."""
    spec = dict(decoding or {"name": "greedy"})
    for key in ("lexicon", "lm"):
        if isinstance(spec.get(key), Mapping):
            spec[key] = {k: Path(v).name if k == "path" and v else v for k, v in spec[key].items()}
    digest = hashlib.sha1(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{spec.get('name', 'greedy')}-{digest}"


def is_current(cell: Cell | None, checkpoint: str | None, step: int | None, decoding: str = "") -> bool:
    """Whether a cell read from matrix.csv need not be recomputed: ``n/a`` always, ``ok``
    while its model is the same checkpoint at the same training step, decoded the same way
    (``decoding``: :func:`decoding_label`)."""
    if cell is None:
        return False
    if cell.status == NA:
        return True
    if cell.status != OK or checkpoint is None:
        return False
    return cell.checkpoint == checkpoint and cell.train_step == step and cell.decoding == decoding
