"""Completion markers: a corpus builder writes its settings to ``OUT/.complete`` last, so a
second run with the same settings finds a complete corpus and does nothing (idempotency),
and a run killed half-way leaves no marker and is redone."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

MARKER = ".complete"  # the Makefile's `make data` target depends on this file name


def is_complete(out: str | Path, settings: Mapping, outputs: Iterable[str] = ()) -> bool | None:
    """Whether ``out`` holds a corpus built with exactly ``settings`` (and every file of
    ``outputs``, relative to ``out``). ``None`` when there is no marker at all,
    ``False`` when there is one for other settings (or a file is missing)."""
    marker = Path(out) / MARKER
    if not marker.is_file():
        return None
    try:
        done = json.loads(marker.read_text())
    except json.JSONDecodeError:
        return False
    return done == json.loads(json.dumps(settings)) and all((Path(out) / f).is_file() for f in outputs)


def clear(out: str | Path) -> None:
    """Remove the marker before (re)building, so a killed build is never taken as complete."""
    (Path(out) / MARKER).unlink(missing_ok=True)


def mark_complete(out: str | Path, settings: Mapping) -> None:
    """Write the marker (the settings as JSON): the last step of a successful build."""
    (Path(out) / MARKER).write_text(json.dumps(settings, indent=1) + "\n")


def needs_build(out: str | Path, settings: Mapping, outputs: Iterable[str], force: bool, what: str) -> bool:
    """Whether ``out`` must be (re)built; says why on stdout. When it must, the old marker
    is removed first. ``what`` names the corpus in the messages."""
    done = None if force else is_complete(out, settings, outputs)
    if done:
        print(f"{what} in {out} is complete (same settings); nothing to do")
        return False
    if done is False:
        print(f"{what} in {out} was built with other settings; rebuilding")
    clear(out)
    return True
