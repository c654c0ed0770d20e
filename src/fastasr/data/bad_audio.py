"""Skipping utterances whose audio turns out unusable when it is loaded.

The manifest check reads each file's header; some faults show only when the samples are
decoded, inside a DataLoader worker: a truncated or corrupt file, zero samples, NaN samples,
a wrong channel count, an unreadable format (``fastasr.data.audio.BadAudioError``). Such an
utterance is not a reason to stop a run over thousands of files: the dataset returns a
:class:`SkippedUtterance` instead of features, :func:`split_skipped` takes those out of the
batch in ``collate`` and the batch carries them to the main process under ``"skipped"``
(workers are separate processes), where ``fastasr.callbacks.BadAudioReport`` counts them
and writes one summary naming every file and reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

SKIPPED_KEY = "skipped"  # the dataset item / batch key holding SkippedUtterance records


class SkippedUtterance(NamedTuple):
    """An utterance left out of a batch: its id, audio file and why (plain data: it crosses
    from DataLoader worker processes in the batch)."""

    id: str
    path: str
    reason: str


class AllAudioBadError(RuntimeError):
    """Every utterance of a split (or of an epoch over it) had unusable audio."""


def skipped_item(utt_id: str, path: str, reason: str) -> dict[str, SkippedUtterance]:
    """The dataset item that stands for an utterance whose audio could not be used."""
    return {SKIPPED_KEY: SkippedUtterance(str(utt_id), str(path), reason)}


def split_skipped(items: Sequence[dict]) -> tuple[list[dict], list[SkippedUtterance]]:
    """Dataset items → (usable items, skipped utterances), in order."""
    usable = [it for it in items if SKIPPED_KEY not in it]
    skipped = [it[SKIPPED_KEY] for it in items if SKIPPED_KEY in it]
    return usable, skipped


def describe_skipped(skipped: Iterable[SkippedUtterance], limit: int | None = None) -> str:
    """One line per skipped utterance: ``id (path): reason``; the first ``limit`` when given."""
    lines = [f"  {s.id} ({s.path}): {s.reason}" for s in skipped]
    if limit is not None and len(lines) > limit:
        lines = lines[:limit] + [f"  ... and {len(lines) - limit} more"]
    return "\n".join(lines)


def all_bad_error(split: str, skipped: Sequence[SkippedUtterance]) -> AllAudioBadError:
    """The error for a split none of whose utterances has usable audio."""
    return AllAudioBadError(
        f"{split}: all {len(skipped)} utterance(s) have unusable audio; nothing to train or score on. "
        f"Check the corpus (e.g. soundfile.read on one file); first files:\n{describe_skipped(skipped, limit=10)}"
    )
