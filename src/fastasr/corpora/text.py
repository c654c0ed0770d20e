"""Transcript normalisation for character (and subword) targets, shared by the converters.

``normalize_transcript``: Unicode NFKC; lower-case; typographic apostrophes (’ ‘ ʼ `) become
``'``; every character that is not a letter (any script), a digit or an apostrophe inside
a word becomes a space (so punctuation and hyphens split words: "well-known" → "well
known"); runs of spaces collapse. Bracketed non-speech tags (``[laughter]``, ``<NOISE>``,
``{breath}``) are removed first when ``drop_tags``.
"""

from __future__ import annotations

import re
import unicodedata

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "`": "'"})
_TAG = re.compile(r"\[[^\]]*\]|<[^>]*>|\{[^}]*\}")


def _keep(c: str) -> bool:
    return c == "'" or unicodedata.category(c)[0] in "LNM"  # letters, numbers, combining marks


def normalize_transcript(text: str, drop_tags: bool = False) -> str:
    """``"Hello, World! It’s [noise] well-known."`` → ``"hello world it's well known"``
    (tags dropped with ``drop_tags``)."""
    text = unicodedata.normalize("NFKC", text).translate(_APOSTROPHES)
    if drop_tags:
        text = _TAG.sub(" ", text)
    text = "".join(c if _keep(c) else " " for c in text.lower())
    words = (w.strip("'") for w in text.split())
    return " ".join(w for w in words if w)
