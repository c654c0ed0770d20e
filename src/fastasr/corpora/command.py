"""What every corpus command shares: its argument parser, logging, a summary line per
manifest written, and layout errors turned into a one-line message and exit status 2."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from fastasr.corpora.paths import CorpusLayoutError
from fastasr.corpora.skipped import Skipped
from fastasr.data.manifest import write_manifest


def parser(module: str, doc: str, src_help: str, out_help: str) -> argparse.ArgumentParser:
    """``fastasr-corpus <module> SRC OUT ...`` (``_`` written ``-``): the first paragraph of ``doc`` describes it."""
    p = argparse.ArgumentParser(prog=f"fastasr-corpus {module.replace('_', '-')}", description=doc.split("\n\n")[0])
    p.add_argument("src", help=src_help)
    p.add_argument("out", help=out_help)
    return p


def run(p: argparse.ArgumentParser, argv: Sequence[str] | None,
        build: Callable[[argparse.Namespace], object]) -> int:
    """Parse ``argv``, log at INFO, call ``build(args)``; a ``CorpusLayoutError`` or
    ``ValueError`` (bad source or options) exits with status 2 and its message."""
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        build(args)
    except (CorpusLayoutError, ValueError) as e:
        p.exit(2, f"error: {e}\n")
    return 0


def write_split(out: str | Path, name: str, records: list[dict], skipped: Skipped, source: str | Path) -> Path:
    """Write ``OUT/<name>.jsonl`` and print its summary line; an error naming ``source``
    when no record is usable."""

    if not records:
        raise CorpusLayoutError(f"{source}: no usable {name} utterance ({skipped.summary()})")
    manifest = Path(out) / f"{name}.jsonl"
    write_manifest(manifest, records)
    hours = sum(r["duration"] for r in records) / 3600
    print(f"{name}: {len(records)} utterances, {hours:.2f} h → {manifest}; {skipped.summary()}")
    return manifest
