"""``fastasr-corpus <builder> [arguments]``: build a corpus's manifests (:mod:`fastasr.corpora`).

    fastasr-corpus synthetic --out data/synthetic                        # make data
    fastasr-corpus digits SRC OUT [--sample-rate R] [--split speakers|recordings]
    fastasr-corpus shapes tiny data/mini_librispeech data/shapes/tiny
    fastasr-corpus join data/synthetic/train.jsonl data/synthetic_joined --count 150

Each builder's arguments are defined beside it, in its module's ``main(argv)``
(``fastasr-corpus BUILDER -h`` prints them); this command is where they are run from.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastasr.cli.subcommands import Subcommand, dispatch

BUILDERS = {
    "synthetic": Subcommand("fastasr.corpora.synthetic", "the built-in espeak-ng corpus (offline)"),
    "digits": Subcommand("fastasr.corpora.digits", "connected digits from AudioMNIST or FSDD"),
    "librispeech": Subcommand("fastasr.corpora.librispeech", "LibriSpeech (*.trans.txt + FLAC)"),
    "mini-librispeech": Subcommand("fastasr.corpora.mini_librispeech",
                                   "Mini LibriSpeech (train-clean-5) in a fixed train/dev/test split"),
    "timit": Subcommand("fastasr.corpora.timit", "TIMIT (SPHERE .WAV, .PHN, .WRD, .TXT)"),
    "kaldi": Subcommand("fastasr.corpora.kaldi", "a Kaldi data directory (WSJ, Switchboard)"),
    "commonvoice": Subcommand("fastasr.corpora.commonvoice", "Common Voice (train/dev/test.tsv + clips/*.mp3)"),
    "join": Subcommand("fastasr.corpora.join", "a manifest's utterances joined into long ones, voices mixed"),
    "shapes": Subcommand("fastasr.corpora.shapes", "a built corpus reshaped: tiny, long, resample, speakers, noisy, short"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """``fastasr-corpus BUILDER [arguments]``: the builder's ``main`` with the arguments."""
    return dispatch("fastasr-corpus", "Build a corpus's manifests (JSON lines; docs/DATA.md).", BUILDERS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
