"""``fastasr-lm build`` (or ``python -m fastasr.cli.lm build``): an n-gram LM (ARPA) from the transcripts of manifests.

    fastasr-lm build --manifest data/synthetic/train.jsonl     # -> data/synthetic/lm/words-3gram.arpa
    fastasr-lm build --manifest T.jsonl --units chars --order 6 --out chars-6gram.arpa --dev D.jsonl
    fastasr-lm build --manifest T.jsonl --frequent-words 50000 --language en --out open.arpa --lexicon-out open.lex

Word LMs serve lexicon decoding; character LMs (tokens = the char tokenizer's units, ``|``
between words) serve lexicon-free decoding of char models. ``--frequent-words N`` opens a word
LM's vocabulary: the N most frequent words of ``--language`` (wordfreq) spellable in the training
text's characters join it, weighted by their frequency (the unigram prior of
:func:`fastasr.lm.kneser_ney.estimate`); ``--lexicon-out`` writes the whole vocabulary spelt, the
lexicon a char model decodes it with (``decoding.lexicon.path``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from fastasr.lm.arpa import corpus_lm_path
from fastasr.lm.build import build


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fastasr-lm", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="estimate an ARPA n-gram LM from manifests' transcripts")
    b.add_argument("--manifest", action="append", required=True, help="training manifest (repeatable)")
    b.add_argument("--out", help="ARPA file to write (default: lm/<units>-<order>gram.arpa beside the first manifest)")
    b.add_argument("--order", type=int, default=3, help="n-gram order (default 3)")
    b.add_argument("--units", choices=("words", "chars"), default="words", help="LM tokens (default words)")
    b.add_argument("--dev", action="append", default=[], help="manifest to report the perplexity on")
    b.add_argument("--frequent-words", type=int, default=0, metavar="N",
                   help="add the N most frequent words of --language (wordfreq) spelt in the training text's "
                        "characters, weighted by their frequency (word LMs; default 0: the training words only)")
    b.add_argument("--language", default="en", help="wordfreq language code for --frequent-words (default en)")
    b.add_argument("--lexicon-out", help="also write the LM's words spelt: a char model's lexicon "
                                         "(decoding.lexicon.path)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = args.out or corpus_lm_path(args.manifest[0], args.order, args.units)
    info = build(args.manifest, out, args.order, args.units, args.dev, args.frequent_words, args.language,
                 args.lexicon_out)
    counts = ", ".join(f"{k}-grams {n}" for k, n in info["ngrams"].items())
    print(f"wrote {info['path']}: {info['sentences']} sentences, {counts}; discounts {info['discounts']}"
          + (f"; {info['added_words']} words not in the training text" if info["added_words"] else ""))
    if info["lexicon"]:
        print(f"wrote {info['lexicon']}: the LM's words spelt")
    if info["dev_perplexity"] is not None:
        print(f"dev perplexity {info['dev_perplexity']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
