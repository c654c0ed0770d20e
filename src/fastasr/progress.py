"""Progress bars of the long commands: ``evaluate.py`` and ``fastasr-transcribe``.

One setting, ``progress``, in ``conf/evaluate.yaml`` and ``conf/transcribe.yaml``:
``auto`` (the default) shows a bar when stderr, where the bar is drawn, is a terminal, so a
run whose output goes to a file or a pipe (CI, ``2> log``, a test's captured output) prints
none; ``true`` / ``false`` force it on or off. :func:`show_progress` resolves the setting and
:func:`progress_bar` wraps the loop; log lines written while a bar is shown go above it::

    for item in progress_bar(items, enabled=show_progress(cfg.progress), total=n, desc="decode", unit="utt"):
        ...
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any, TypeVar

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

T = TypeVar("T")

_ON = ("true", "yes", "on", "1")
_OFF = ("false", "no", "off", "0", "none", "null")


def show_progress(setting: bool | str | None = "auto", stream: IO[str] | None = None) -> bool:
    """Whether to draw a progress bar: ``setting`` true / false as given; ``auto`` (or None):
    when ``stream`` (default: stderr, where the bar goes) is a terminal."""
    if isinstance(setting, bool):
        return setting
    text = "auto" if setting is None else str(setting).strip().lower()
    if text in _ON:
        return True
    if text in _OFF:
        return False
    if text != "auto":
        raise ValueError(f"progress={setting!r}; expected auto, true or false")
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):  # a closed or detached stream
        return False


def progress_bar(iterable: Iterable[T], *, enabled: bool, total: int | None = None, desc: str = "",
                 unit: str = "it") -> Iterator[T]:
    """The items of ``iterable``, with a tqdm bar on stderr when ``enabled`` (``total``: the
    number expected, for a percentage and a time left; None: a count and a rate only). Log
    records emitted while the bar is drawn are printed above it instead of through it."""
    if not enabled:
        yield from iterable
        return
    with contextlib.ExitStack() as stack:
        stack.enter_context(logging_redirect_tqdm())
        bar: Any = stack.enter_context(tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr,
                                            dynamic_ncols=True))
        yield from bar
