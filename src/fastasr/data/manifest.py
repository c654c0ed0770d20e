"""Manifests: JSON lines, one utterance a line (NeMo-style fields).

Required fields: ``audio_filepath`` (absolute, or relative to the manifest's
directory), ``duration`` (seconds, > 0, finite), ``text`` (words, non-empty).
Optional: ``phonemes`` (space-separated units, ``|`` between words),
``speaker``, ``id`` (defaults to the audio file's stem). Other fields are
ignored when reading.

A manifest of audio to transcribe (``fastasr-transcribe``) needs no ``text``:
``read_manifest(path, require_text=False)`` reads it (``Utterance.text`` is then None where
the line has none). Training and evaluation read with the default ``require_text=True``, and a
line without ``text`` is a bad line there.

Every line is validated; a bad line is reported as
``manifest train.jsonl line 812: duration 0.0 s; expected > 0``.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import soundfile as sf

log = logging.getLogger(__name__)

REQUIRED_FIELDS = ("audio_filepath", "duration", "text")
TRANSCRIPTION_FIELDS = ("audio_filepath", "duration")  # what a manifest to transcribe must have
MAX_WARNINGS = 10  # bad lines logged one by one in skip mode; the rest are only counted


class ManifestError(ValueError):
    """A manifest line is unusable (or nothing usable is left in a manifest)."""


@dataclass(frozen=True)
class Utterance:
    """One manifest line. ``audio_filepath`` is resolved (absolute). ``text`` is None only
    when read with ``require_text=False`` from a line that has none (transcription)."""

    id: str
    audio_filepath: str
    duration: float
    text: str | None
    phonemes: str | None = None
    speaker: str | None = None

    def record(self) -> dict[str, Any]:
        """The manifest line's fields that are set (None fields left out)."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


def _check_line(raw: str, base: Path, check_audio: bool, require_text: bool = True) -> Utterance:
    """Parse and validate one manifest line; raise ``ValueError`` with the reason."""
    required = REQUIRED_FIELDS if require_text else TRANSCRIPTION_FIELDS
    try:
        rec = json.loads(raw.rstrip("\r\n"))  # the line break is no part of the record
    except json.JSONDecodeError as e:
        where = e.msg.removesuffix(" at")  # "Unterminated string starting at" would read "at at column"
        raise ValueError(f"not valid JSON ({where} at column {e.colno}); expected one JSON object") from None
    if not isinstance(rec, dict):
        raise ValueError(f"JSON {type(rec).__name__}; expected an object with fields {', '.join(required)}")
    for field in required:
        if field not in rec:
            raise ValueError(f"missing field {field!r}; expected fields {', '.join(required)}")

    duration = rec["duration"]
    if isinstance(duration, bool) or not isinstance(duration, int | float):
        raise ValueError(f"duration {duration!r}; expected a number of seconds > 0")
    if not math.isfinite(duration) or duration <= 0:
        raise ValueError(f"duration {duration} s; expected > 0 and finite")

    text = rec.get("text")
    if not require_text and (not isinstance(text, str) or not text.strip()):
        text = None  # transcription: a reference text is not needed
    elif not isinstance(text, str) or not text.strip():
        raise ValueError(f"text {text!r}; expected non-empty words")

    phonemes = rec.get("phonemes")
    if phonemes is not None and (not isinstance(phonemes, str) or not phonemes.strip()):
        raise ValueError(f"phonemes {phonemes!r}; expected non-empty space-separated units (or no field)")

    speaker = rec.get("speaker")
    if speaker is not None:
        speaker = str(speaker)

    rel = rec["audio_filepath"]
    if not isinstance(rel, str) or not rel:
        raise ValueError(f"audio_filepath {rel!r}; expected a path string")
    path = Path(rel) if os.path.isabs(rel) else base / rel
    if check_audio:
        if not path.is_file():
            raise ValueError(f"audio_filepath {rel!r}: no such file {str(path)!r}; expected an existing audio file")
        try:
            info = sf.info(str(path))
        except Exception as e:  # soundfile raises LibsndfileError / RuntimeError
            raise ValueError(
                f"audio_filepath {rel!r}: not readable audio ({str(e).strip()}); "
                "expected a file soundfile can read (wav, flac, ...)"
            ) from None
        if info.frames <= 0:
            raise ValueError(f"audio_filepath {rel!r}: 0 samples; expected non-empty audio")

    utt_id = rec.get("id")
    utt_id = str(utt_id) if utt_id not in (None, "") else Path(rel).stem
    return Utterance(
        id=utt_id,
        audio_filepath=str(path.resolve()) if check_audio else str(path),
        duration=float(duration),
        text=text.strip() if text is not None else None,
        phonemes=phonemes.strip() if phonemes is not None else None,
        speaker=speaker,
    )


def _lines(path: Path, check_audio: bool, require_text: bool):
    """``(line number, Utterance, None)`` or ``(line number, None, reason)`` of each non-blank line."""
    base = path.parent
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                yield lineno, _check_line(raw, base, check_audio, require_text), None
            except ValueError as e:
                yield lineno, None, str(e)


def skipped_lines(path: str | Path, check_audio: bool = True, require_text: bool = True) -> tuple[int, list[dict]]:
    """``(lines, skipped)``: the number of non-blank lines of a manifest and, for each line
    :func:`read_manifest` drops (bad JSON, a missing field, missing or unreadable audio),
    ``{"line": <number>, "reason": <why>}``; nothing is logged. Evaluation lists them in
    results.json so that every line is either scored or accounted for."""
    lines, skipped = 0, []
    for lineno, _, error in _lines(Path(path), check_audio, require_text):
        lines += 1
        if error is not None:
            skipped.append({"line": lineno, "reason": error})
    return lines, skipped


def read_manifest(path: str | Path, on_error: str = "skip", check_audio: bool = True,
                  require_text: bool = True) -> list[Utterance]:
    """Read and validate a manifest.

    Args:
        path: the ``.jsonl`` file.
        on_error: ``"skip"`` logs each bad line as a warning (the first
            ``MAX_WARNINGS``, then a summary count) and drops it; ``"raise"``
            raises ``ManifestError`` at the first bad line.
        check_audio: check that every audio file exists and has a readable
            header (``soundfile.info``).
        require_text: a line without ``text`` is bad (training, evaluation); False: ``text``
            is optional (transcription; ``Utterance.text`` None where absent or empty).

    Returns:
        the valid utterances in file order. Raises ``ManifestError`` if the
        manifest is missing or no valid line remains (in either mode).
    """
    if on_error not in ("skip", "raise"):
        raise ValueError(f"on_error {on_error!r}; expected 'skip' or 'raise'")
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"manifest {path}: no such file")
    utterances: list[Utterance] = []
    bad = 0
    n_lines = 0
    first_error = ""
    for lineno, utterance, error in _lines(path, check_audio, require_text):
        n_lines += 1
        if error is None:
            utterances.append(utterance)
            continue
        msg = f"manifest {path} line {lineno}: {error}"
        if on_error == "raise":
            raise ManifestError(msg) from None
        bad += 1
        first_error = first_error or msg
        if bad <= MAX_WARNINGS:
            log.warning("%s (skipped)", msg)
    if bad:
        more = f"; only the first {MAX_WARNINGS} are shown above" if bad > MAX_WARNINGS else ""
        log.warning("manifest %s: skipped %d of %d lines%s", path, bad, n_lines, more)
    if not utterances:
        hint = ""
        if "missing field 'text'" in first_error:
            hint = " (a manifest without text can be transcribed: fastasr-transcribe audio=MANIFEST)"
        first = f"; the first: {first_error}{hint}" if first_error else ""
        raise ManifestError(
            f"manifest {path}: no valid utterance ({n_lines} lines, {bad} bad); expected at least one{first}"
        )
    return utterances


def write_manifest(path: str | Path, records: Iterable[Mapping | Utterance], relative: bool = True) -> None:
    """Write records (dicts or ``Utterance``) as JSON lines, atomically.

    With ``relative``, absolute ``audio_filepath`` values below the manifest's
    directory are written relative to it (others stay absolute).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    base = path.parent.resolve()
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for rec in records:
            if isinstance(rec, Utterance):
                rec = rec.record()
            rec = dict(rec)
            audio = rec["audio_filepath"]
            if relative and os.path.isabs(audio):
                try:
                    rec["audio_filepath"] = Path(audio).resolve().relative_to(base).as_posix()
                except ValueError:
                    pass
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
