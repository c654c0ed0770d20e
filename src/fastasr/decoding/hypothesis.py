"""What a CTC decoder returns for one utterance."""

from __future__ import annotations

from dataclasses import dataclass

from fastasr.data.tokenizer import WORD_BOUNDARY


@dataclass
class Hypothesis:
    """A decoded utterance: ``units`` (phonemes or characters, ``|`` between words, none at
    either end) and ``words`` — real words when the decoder knows them (a lexicon, or a
    character model), else the phonetic words (units between boundaries, joined)."""

    units: list[str]
    words: list[str]
    score: float | None = None


def tidy_boundaries(units: list[str], boundary: str = WORD_BOUNDARY) -> list[str]:
    """Drop word boundaries at either end and merge repeated ones."""
    out: list[str] = []
    for u in units:
        if u == boundary and (not out or out[-1] == boundary):
            continue
        out.append(u)
    if out and out[-1] == boundary:
        out.pop()
    return out


def word_groups(units: list[str], boundary: str = WORD_BOUNDARY) -> list[list[str]]:
    """The units of each word (the runs between boundaries; empty runs dropped)."""
    groups: list[list[str]] = [[]]
    for u in units:
        if u == boundary:
            groups.append([])
        else:
            groups[-1].append(u)
    return [g for g in groups if g]
