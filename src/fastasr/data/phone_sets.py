"""Phone-set foldings applied by the tokenizer: units for training, units for scoring.

``timit``: the 61 TIMIT phones of the ``.PHN`` files (what a TIMIT manifest's
``phonemes`` hold) are folded to the 48 of Lee & Hon (1989) for training
(closures → ``cl``/``vcl``, ``h#``/``pau`` → ``sil``, ``q`` deleted, ...) and the
48 to the standard 39 for scoring PER (``cl``, ``vcl``, ``epi`` → ``sil``,
``ao`` → ``aa``, ``zh`` → ``sh``, ...). The maps travel with the tokenizer in the
checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

TIMIT_61 = tuple(
    "aa ae ah ao aw ax ax-h axr ay b bcl ch d dcl dh dx eh el em en eng epi er ey f g gcl h# hh hv "
    "ih ix iy jh k kcl l m n ng nx ow oy p pau pcl q r s sh t tcl th uh uw ux v w y z zh".split()
)
# 61 → 48 (None: deleted); phones not listed map to themselves.
TIMIT_61_TO_48: dict[str, str | None] = {p: p for p in TIMIT_61} | {
    "ax-h": "ax", "axr": "er", "em": "m", "eng": "ng", "hv": "hh", "nx": "n", "ux": "uw",
    "bcl": "vcl", "dcl": "vcl", "gcl": "vcl", "pcl": "cl", "tcl": "cl", "kcl": "cl",
    "h#": "sil", "pau": "sil", "q": None,
}
TIMIT_48 = tuple(sorted({p for p in TIMIT_61_TO_48.values() if p is not None}))
# 48 → 39 for scoring; phones not listed map to themselves.
TIMIT_48_TO_39: dict[str, str] = {p: p for p in TIMIT_48} | {
    "ao": "aa", "ax": "ah", "el": "l", "en": "n", "ix": "ih", "zh": "sh",
    "cl": "sil", "vcl": "sil", "epi": "sil",
}
TIMIT_39 = tuple(sorted(set(TIMIT_48_TO_39.values())))

FOLDINGS: dict[str, tuple[Mapping[str, str | None], Mapping[str, str | None]]] = {
    "timit": (TIMIT_61_TO_48, TIMIT_48_TO_39),
}


def folding(name: str) -> tuple[dict[str, str | None], dict[str, str | None]]:
    """``(training map, scoring map)`` of a named folding (``timit``)."""
    if name not in FOLDINGS:
        raise ValueError(f"phone_folding {name!r}; expected one of {sorted(FOLDINGS)} (or null)")
    train_map, score_map = FOLDINGS[name]
    return dict(train_map), dict(score_map)


def fold(units: Iterable[str], mapping: Mapping[str, str | None], boundary: str = "|") -> list[str]:
    """Map units through ``mapping`` (absent units pass through, ``None`` deletes). Word
    boundaries pass through, but never twice in a row nor at either end (a word whose
    units were all deleted disappears)."""
    out: list[str] = []
    for u in units:
        if u == boundary:
            if out and out[-1] != boundary:
                out.append(u)
            continue
        folded = mapping.get(u, u)
        if folded is not None:
            out.append(folded)
    while out and out[-1] == boundary:
        out.pop()
    return out
