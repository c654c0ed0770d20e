"""``python -m fastasr.lm build``: an n-gram LM (ARPA) from the transcripts of manifests.

    python -m fastasr.lm build --manifest data/synthetic/train.jsonl     # -> data/synthetic/lm/words-3gram.arpa
    python -m fastasr.lm build --manifest T.jsonl --units chars --order 6 --out chars-6gram.arpa --dev D.jsonl

Word LMs serve lexicon decoding; character LMs (tokens = the char tokenizer's units, ``|``
between words) serve lexicon-free decoding of char models.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from fastasr.data.manifest import read_manifest
from fastasr.data.tokenizer import units_of
from fastasr.decoding.lexicon import words_of
from fastasr.lm.arpa import corpus_lm_path, read_arpa, write_arpa
from fastasr.lm.kneser_ney import estimate

log = logging.getLogger("fastasr.lm")


def transcripts(manifests: Sequence[str | Path], units: str) -> list[list[str]]:
    """Token sequences of the ``text`` of every utterance: words, or characters (``|`` between words)."""
    if units not in ("words", "chars"):
        raise ValueError(f"units {units!r}; expected 'words' or 'chars'")
    out = []
    for path in manifests:
        for utt in read_manifest(path, on_error="skip", check_audio=False):
            out.append(words_of(utt.text) if units == "words" else units_of(utt.text, "char"))
    return out


def build(manifests: Sequence[str | Path], out: str | Path, order: int = 3, units: str = "words",
          dev: Sequence[str | Path] = ()) -> dict:
    """Estimate a modified Kneser-Ney LM from the manifests' transcripts and write it as ARPA.

    Returns ``{"path", "sentences", "ngrams": {order: count}, "discounts", "dev_perplexity"}``.
    """
    sentences = transcripts(manifests, units)
    model = estimate(sentences, order)
    path = write_arpa(model, out)
    info = {
        "path": str(path),
        "sentences": len(sentences),
        "ngrams": {k: len(model.prob[k]) for k in range(1, order + 1)},
        "discounts": {k: [round(d, 4) for d in ds] for k, ds in model.discounts.items()},
        "dev_perplexity": None,
    }
    if dev:
        info["dev_perplexity"] = read_arpa(path).perplexity(transcripts(dev, units))
    return info


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastasr.lm", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="estimate an ARPA n-gram LM from manifests' transcripts")
    b.add_argument("--manifest", action="append", required=True, help="training manifest (repeatable)")
    b.add_argument("--out", help="ARPA file to write (default: lm/<units>-<order>gram.arpa beside the first manifest)")
    b.add_argument("--order", type=int, default=3, help="n-gram order (default 3)")
    b.add_argument("--units", choices=("words", "chars"), default="words", help="LM tokens (default words)")
    b.add_argument("--dev", action="append", default=[], help="manifest to report the perplexity on")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = args.out or corpus_lm_path(args.manifest[0], args.order, args.units)
    info = build(args.manifest, out, args.order, args.units, args.dev)
    counts = ", ".join(f"{k}-grams {n}" for k, n in info["ngrams"].items())
    print(f"wrote {info['path']}: {info['sentences']} sentences, {counts}; discounts {info['discounts']}")
    if info["dev_perplexity"] is not None:
        print(f"dev perplexity {info['dev_perplexity']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
