"""What a CTC decoder returns for one utterance."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fastasr.data.tokenizer import WORD_BOUNDARY


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
