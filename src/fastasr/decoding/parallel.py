"""A decoder's search over many utterances, spread over worker processes.

flashlight-text's beam search holds Python's interpreter lock while it runs, so threads search
one utterance at a time; processes search several. :func:`search_in_order` gives each
utterance's hypothesis in the order the utterances came, from ``workers`` processes that each
hold their own copy of the decoder (forked where the platform forks, as the data loader's
workers are, else spawned with the decoder pickled), at most ``start_after`` or ``2 × workers``
utterances (whichever is more) ahead of the caller, so that the emissions of a long test set are
never all in memory at once. The
search is deterministic, so the hypotheses are those of one process; only the time changes.

A search of fewer than ``start_after`` utterances runs in this process: starting the workers
costs more than it saves there.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

#: ``decoding.workers`` value that :func:`resolve_workers` replaces by the machine's cores.
AUTO = "auto"
#: The most workers ``auto`` starts (the search of one test set rarely needs more).
MAX_AUTO_WORKERS = 8
#: Utterances below which the search stays in this process.
START_AFTER = 32

_decoder: Callable[[Any], Any] | None = None  # a worker's decoder


def resolve_workers(workers: int | str, cores: int | None = None) -> int:
    """``decoding.workers``: ``auto`` is ``cores`` (default: those this process may use), at most
    :data:`MAX_AUTO_WORKERS`: the process that hands them the utterances mostly waits for them
    (on 2 cores, 2 workers take 0.57-0.59 of one process's time; docs/DECODING.md); 0 searches in
    this process.

    Raises:
        ValueError: neither ``auto`` nor an integer ≥ 0.
    """
    if workers == AUTO:
        if cores is None:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return max(1, min(MAX_AUTO_WORKERS, cores))
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"decoding.workers={workers!r}; expected {AUTO} or an integer ≥ 0 (0: this process)")
    return workers


def _start(decoder: Callable[[Any], Any]) -> None:
    global _decoder
    _decoder = decoder


def _search(item: Any) -> Any:
    return _decoder(item)


def _context() -> multiprocessing.context.BaseContext:
    return multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")


def search_in_order(decoder: Callable[[Any], Any], items: Iterable[Any], workers: int,
                    start_after: int = START_AFTER) -> Iterator[Any]:
    """``decoder(item)`` of each of ``items``, in their order: in this process where ``workers`` is
    0 or fewer than ``start_after`` items come, else in ``workers`` processes (module docstring).
    ``decoder`` must pickle where processes are spawned rather than forked; ``items`` and the
    results always do."""
    items = iter(items)
    head = list(itertools.islice(items, start_after))
    if workers < 1 or len(head) < start_after:
        for item in itertools.chain(head, items):
            yield decoder(item)
        return
    with ProcessPoolExecutor(workers, mp_context=_context(), initializer=_start, initargs=(decoder,)) as pool:
        pending = deque()
        for item in itertools.chain(head, items):
            pending.append(pool.submit(_search, item))
            if len(pending) > 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
