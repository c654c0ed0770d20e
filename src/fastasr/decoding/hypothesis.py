"""What a CTC decoder returns for one utterance."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

from fastasr.data.subword import WORD_START
from fastasr.data.tokenizer import SUBWORD_KINDS, WORD_BOUNDARY


@dataclass
class Hypothesis:
    """A decoded utterance: ``units`` (phonemes or characters, ``|`` between words, none at
    either end) and ``words`` — real words when the decoder knows them (a lexicon, or a
    character model), else the phonetic words (units between boundaries, joined).

    ``frames``: for each unit, the output frame (of the ``(T, V)`` log-probabilities decoded)
    at which the decoder emitted it — greedy: the first frame of the unit's argmax run; beam
    search: the search's time step. None when the decoder does not say. Word times come
    from a forced alignment (``fastasr.decoding.alignment``), which uses these frames only
    to cut a long recording into pieces it aligns one at a time."""

    units: list[str]
    words: list[str]
    score: float | None = None
    frames: list[int] | None = None


def tidy_boundaries(units: list[str], boundary: str = WORD_BOUNDARY) -> list[str]:
    """Drop word boundaries at either end and merge repeated ones."""
    return [units[i] for i in tidy_boundary_indices(units, boundary)]


def tidy_boundary_indices(units: list[str], boundary: str = WORD_BOUNDARY) -> list[int]:
    """The indices of ``units`` that :func:`tidy_boundaries` keeps (to keep a parallel list,
    e.g. the units' frames, in step)."""
    kept: list[int] = []
    for i, u in enumerate(units):
        if u == boundary and (not kept or units[kept[-1]] == boundary):
            continue
        kept.append(i)
    if kept and units[kept[-1]] == boundary:
        kept.pop()
    return kept


def word_groups(units: list[str], boundary: str = WORD_BOUNDARY) -> list[list[str]]:
    """The units of each word (the runs between boundaries; empty runs dropped)."""
    groups: list[list[str]] = [[]]
    for u in units:
        if u == boundary:
            groups.append([])
        else:
            groups[-1].append(u)
    return [g for g in groups if g]


def word_unit_groups(units: Sequence[str], boundary: str | None = "|", word_start: str | None = None) -> list[list[int]]:
    """The indices of each word's units: the runs between ``boundary`` units (phoneme and
    char models), or, for subword units, runs each starting at a unit that begins with
    ``word_start`` (sentencepiece's ``▁``). Empty runs are dropped."""
    groups: list[list[int]] = [[]]
    for i, u in enumerate(units):
        if boundary is not None and u == boundary:
            groups.append([])
            continue
        if word_start is not None and u.startswith(word_start) and groups[-1]:
            groups.append([])
        groups[-1].append(i)
    return [g for g in groups if g]


def word_frames(units: Sequence[str], spans: Sequence[tuple[int, int]], boundary: str | None = "|",
                word_start: str | None = None) -> list[tuple[int, int]]:
    """``[start, end)`` frames of each word: from its first unit's start to its last unit's end."""
    return [(spans[g[0]][0], spans[g[-1]][1]) for g in word_unit_groups(units, boundary, word_start)]


class PathWords:
    """The units, frames and words of a CTC path that arrives a unit at a time (a stream's
    decoding), at a cost a unit that does not grow with the path: :meth:`add` each unit the path
    emits (blanks and repeats already dropped) with its frame; :meth:`hypothesis` gives what
    :func:`tidy_boundary_indices` and ``words_of`` would give over all the units at once.

    ``words_of(units)``: the words of a run of units (a tokenizer's ``units_to_words``, or a
    lexicon's spellings); it must split at word boundaries (``|``; for sentencepiece units, a
    piece starting with ``▁``), as every one here does. Words are computed once, when the next
    word starts; only the word still open is recomputed at each :meth:`hypothesis`.
    """

    def __init__(self, tokenizer, words_of) -> None:
        self.boundary = tokenizer.word_boundary
        self.word_start = WORD_START if tokenizer.kind in SUBWORD_KINDS else None
        self.words_of = words_of
        self.units: list[str] = []
        self.frames: list[int] = []
        self.words: list[str] = []  # the words of units[:_open]
        self._open = 0  # units[_open:]: the word still open
        self._boundary: int | None = None  # frame of a boundary kept back until a unit follows it

    def add(self, unit: str, frame: int) -> None:
        if unit == self.boundary:
            if self.units and self._boundary is None:  # a leading or repeated boundary is dropped
                self._boundary = frame
                self.words += self.words_of(self.units[self._open:])
                self._open = len(self.units) + 1
            return
        if self._boundary is not None:
            self.units.append(self.boundary)
            self.frames.append(self._boundary)
            self._boundary = None
        elif self.word_start is not None and unit.startswith(self.word_start):
            self.words += self.words_of(self.units[self._open:])
            self._open = len(self.units)
        self.units.append(unit)
        self.frames.append(frame)

    def fork(self) -> PathWords:
        """A copy that units can be added to without changing this one."""
        other = copy.copy(self)
        other.units, other.frames, other.words = list(self.units), list(self.frames), list(self.words)
        return other

    def hypothesis(self, score: float | None = None, words: list[str] | None = None) -> Hypothesis:
        """The :class:`Hypothesis` so far (``words``: these instead of the units' words)."""
        if words is None:
            words = self.words + self.words_of(self.units[self._open:])
        return Hypothesis(units=list(self.units), words=words, score=score, frames=list(self.frames))
