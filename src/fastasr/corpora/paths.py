"""Source-directory checks shared by the corpus converters."""

from __future__ import annotations

from pathlib import Path


class CorpusLayoutError(ValueError):
    """The source directory is not (or not all of) the corpus it should be."""


def require_dir(src: str | Path, expected: str) -> Path:
    """``src`` as a Path; a clear error if it is not an existing directory. ``expected``
    describes the layout (``"a LibriSpeech directory: <part>/<speaker>/<chapter>/*.trans.txt"``)."""
    path = Path(src).expanduser()
    if not path.exists():
        raise CorpusLayoutError(f"{path}: no such directory; expected {expected}")
    if not path.is_dir():
        raise CorpusLayoutError(f"{path}: not a directory; expected {expected}")
    return path


def child_ci(parent: Path, name: str) -> Path | None:
    """The child of ``parent`` named ``name`` in any letter case (TIMIT ships upper or lower
    case), or None."""
    exact = parent / name
    if exact.exists():
        return exact
    for child in parent.iterdir() if parent.is_dir() else ():
        if child.name.lower() == name.lower():
            return child
    return None
