"""Bad items of a corpus are reported and skipped, never fatal and never silent: the first
few are logged one by one with where and why, the rest counted by reason, and the summary
is printed at the end of a build."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

from fastasr.data.audio import audio_duration

log = logging.getLogger("fastasr.corpora")
MAX_WARNINGS = 10


class Skipped:
    """Counts skipped items by reason; ``add(where, reason)`` logs the first ``MAX_WARNINGS``."""

    def __init__(self, what: str = "item") -> None:
        self.what = what
        self.reasons: Counter[str] = Counter()
        self.examples: dict[str, str] = {}

    def add(self, where: str, reason: str, detail: str = "") -> None:
        """Record one skipped item (``where``: file/line or id; ``reason``: a short category
        such as ``"unreadable audio"``; ``detail``: the error text)."""
        self.reasons[reason] += 1
        self.examples.setdefault(reason, where)
        if self.total <= MAX_WARNINGS:
            log.warning("%s: %s%s (skipped)", where, reason, f" ({detail})" if detail else "")

    @property
    def total(self) -> int:
        return sum(self.reasons.values())

    def summary(self) -> str:
        """One line: ``skipped 3 recordings: 2 unreadable audio (e.g. x.wav), 1 empty (e.g. y.wav)``."""
        if not self.total:
            return f"skipped no {self.what}s"
        parts = ", ".join(f"{n} {r} (e.g. {self.examples[r]})" for r, n in self.reasons.most_common())
        return f"skipped {self.total} {self.what}{'s' if self.total != 1 else ''}: {parts}"

    def as_dict(self) -> dict[str, int]:
        return dict(self.reasons)


def duration_or_skip(path, skipped: Skipped) -> float | None:
    """Seconds of audio in ``path`` from its header, or None (recorded in ``skipped``) when
    the file is missing, unreadable or empty."""

    if not Path(path).is_file():
        skipped.add(str(path), "audio missing")
        return None
    try:
        duration = audio_duration(path)
    except Exception as e:  # soundfile's errors differ between versions
        skipped.add(str(path), "unreadable audio", str(e).strip())
        return None
    if duration <= 0:
        skipped.add(str(path), "empty audio")
        return None
    return duration
