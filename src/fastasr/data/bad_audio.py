"""Skipping utterances whose audio turns out unusable when it is loaded.

The manifest check reads each file's header; some faults show only when the samples are
decoded, inside a DataLoader worker: a truncated or corrupt file, zero samples, NaN samples,
a wrong channel count, an unreadable format (``fastasr.data.audio.BadAudioError``). Such an
utterance is not a reason to stop a run over thousands of files: the dataset returns a
:class:`SkippedUtterance` instead of features, :func:`split_skipped` takes those out of the
batch in ``collate`` and the batch carries them to the main process under ``"skipped"``
(workers are separate processes). There ``fastasr.training.callbacks.BadAudioReport`` (training)
or :class:`SkippedAudio` (decoding a manifest) counts them and reports one summary naming
every file and reason. A feature cache lists the utterances its builder skipped by the same
checks; reading one of them is bad audio too (``fastasr.data.feature_sources.CachedFeatures``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from fastasr.data.audio import BadAudioError

log = logging.getLogger(__name__)

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


def skipped_in(batch: Mapping[str, Any]) -> list[SkippedUtterance]:
    """The :class:`SkippedUtterance` records a batch carries (``batch["skipped"]``)."""
    return [SkippedUtterance(*s) for s in batch.get(SKIPPED_KEY) or []]


def refused(skipped: SkippedUtterance) -> BadAudioError:
    """The error that stops a run at a skipped utterance when ``data.on_bad_utterance=raise``."""
    return BadAudioError(skipped.path, f"{skipped.reason} (utterance {skipped.id}; data.on_bad_utterance=raise)")


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


class SkippedAudio:
    """The skipped utterances of one pass over a loader's batches, outside a ``Trainer``
    (decoding a manifest).

    ``for batch in skipped.batches(loader)`` yields the batches that still hold utterances
    and keeps the records of all of them in :attr:`records`; with ``on_bad_audio="raise"``
    the first skipped utterance raises ``BadAudioError``. :meth:`finish` then logs one
    summary, or raises ``AllAudioBadError`` when no utterance was usable.
    """

    def __init__(self, on_bad_audio: str = "skip") -> None:
        if on_bad_audio not in ("skip", "raise"):
            raise ValueError(f"on_bad_audio {on_bad_audio!r}; expected 'skip' or 'raise'")
        self.on_bad_audio = on_bad_audio
        self.records: list[SkippedUtterance] = []
        self.seen = 0  # utterances in the batches, skipped or not

    def batches(self, batches: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
        for batch in batches:
            records = skipped_in(batch)
            if records and self.on_bad_audio == "raise":
                raise refused(records[0])
            self.records.extend(records)
            self.seen += len(batch["ids"]) + len(records)
            if batch["ids"]:
                yield batch

    def finish(self, what: str) -> list[dict[str, str]]:
        """Log the summary of ``what`` (e.g. the manifest) and return the records as plain
        dicts ``{"id", "path", "reason"}`` sorted by id (for a results file)."""
        if self.seen and len(self.records) == self.seen:
            raise all_bad_error(what, self.records)
        if self.records:
            log.warning("%s: %d of %d utterance(s) skipped for unusable audio:\n%s", what, len(self.records),
                        self.seen, describe_skipped(self.records))
        return [s._asdict() for s in sorted(self.records)]
