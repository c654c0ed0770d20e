"""Corpus shapes: a built corpus's train/dev/test manifests reshaped into another corpus. This
package's root holds the shapes' table (:data:`SHAPES`), the build API (:func:`build_shape`) and
the arguments of the command that runs them (:func:`main`, run as ``fastasr-corpus shapes``):

    fastasr-corpus shapes SHAPE SRC OUT [options] [--seed 0] [--force]

``SRC`` holds ``{train,dev,test}.jsonl`` of any corpus in the manifest format (docs/DATA.md),
including the output of another shape, so shapes compose (``tiny`` of ``short``, ``noisy`` of
``resample``). ``OUT`` receives ``{train,dev,test}.jsonl`` and, for the shapes that make new
audio, ``OUT/wav/<split>/*.wav`` (16-bit PCM). The shapes:

* ``tiny``: at most ``--utterances`` (1000) training utterances and ``--minutes`` (45) of
  training audio, at most ``--dev-utterances`` / ``--test-utterances`` (200) of dev and test,
  drawn so that every prefix of the draw holds the speakers in proportion to their utterance
  counts (where ``speaker`` exists). Audio is not copied: the manifests point at the source's.
* ``long``: 15-35 s utterances (``--min-seconds``, ``--max-seconds``) joined from consecutive
  utterances of **one** speaker (in manifest order) with pauses of digital silence drawn from
  ``--pause-s`` (0.2-0.6 s), in every split. An utterance longer than the maximum, and the
  utterances of a join that cannot reach the minimum (a speaker's last ones, or before one too
  long to add), are dropped and counted. Utterances without ``speaker`` are joined with each
  other as if of one speaker.
* ``resample``: every utterance's audio resampled to ``--sample-rate`` (8000 Hz;
  ``torchaudio.functional.resample``'s windowed sinc, via ``fastasr.data.audio``).
* ``speakers``: only the training utterances of the ``--count`` K speakers with the most
  training audio (ties broken by speaker id; no randomness); dev and test unchanged. K ≤ 5 is
  the few-speaker regime, K ≥ 20 the many-speaker one.
* ``noisy``: every utterance of every split with additive noise at an SNR drawn uniformly from
  ``--snr-db`` (5 15) dB, powers taken over the whole utterance. The noise is a mix of
  coloured noise (pink or brown, drawn per utterance) and babble: the sum of
  ``--babble-talkers`` (3) **other utterances of the same split** (of other speakers where
  the split has them), each at a random offset, looped to length and brought to equal power.
  Babble from the same split keeps the splits apart (no training voice is heard in test); the
  share of babble in the noise's power is drawn uniformly from [0, 1] per utterance. A mix
  whose peak would clip is scaled down whole (the SNR is kept). Each line records ``snr_db``
  and ``noise`` (colour, babble share, the babble's utterance ids).
* ``short``: 1-4 s segments (``--min-seconds``, ``--max-seconds``) cut at word boundaries.
  The words are placed by ``torchaudio.functional.forced_align`` of the transcript against the
  emissions of a character-unit fastasr checkpoint (``--align-ckpt``); a cut lies in the middle
  of the gap between one word's last frame and the next word's first (:func:`plan_segments`).
  Segments outside the range are regrouped with the previous segment when that fits, else
  dropped, with counts. An utterance whose transcript the checkpoint cannot spell, or with too
  few frames for it, is reported and skipped.
* ``voices``: train unchanged; every dev and test speaker's voice made child-like, F0 raised by
  semitones drawn from ``--semitones`` (4 7) and formants scaled by a factor drawn from
  ``--formant-scale`` (1.15 1.25), once per speaker, the duration kept
  (:mod:`fastasr.corpora.shapes.voices`). Each line records ``voice``.

Every shape is deterministic for ``--seed`` (draws are keyed by seed, split and utterance id)
and idempotent (``OUT/.complete`` holds the shape, its options and a hash of the source
manifests; a second run with the same ones does nothing, ``--force`` rebuilds). Bad source
lines (invalid JSON or fields, missing or unreadable audio, duplicate ids) and unusable audio
are reported and skipped with a count. Each split's line, then one summary line (utterances,
hours and speakers per split), is printed at the end.

The shapes are built by
:mod:`fastasr.corpora.shapes.subsets` (tiny, speakers, resample), :mod:`fastasr.corpora.shapes.audio`
(long, noisy), :mod:`fastasr.corpora.shapes.short` (short) and :mod:`fastasr.corpora.shapes.voices`
(voices), from a source read by :mod:`fastasr.corpora.shapes.source`.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastasr.corpora import command
from fastasr.corpora.command import write_split
from fastasr.corpora.marker import mark_complete, needs_build
from fastasr.corpora.paths import CorpusLayoutError, require_dir
from fastasr.corpora.shapes.audio import build_long, build_noisy
from fastasr.corpora.shapes.short import build_short
from fastasr.corpora.shapes.source import LAYOUT, SPLITS, read_corpus, source_hashes
from fastasr.corpora.shapes.subsets import build_resample, build_speakers, build_tiny
from fastasr.corpora.shapes.voices import build_voices

SHAPE_VERSION = 1  # bump when a shape's output for given settings changes

__all__ = ["SHAPES", "Shape", "build_shape", "main"]


@dataclass(frozen=True)
class Shape:
    """A shape: what it does (one line), the function that builds it, whether it writes audio."""

    help: str
    build: Callable[..., dict[str, list[dict]]]
    writes_audio: bool


SHAPES: dict[str, Shape] = {
    "tiny": Shape("a small subset: <= N utterances and M minutes of train, <= 200 dev / test", build_tiny, False),
    "long": Shape("15-35 s utterances joined from consecutive utterances of one speaker", build_long, True),
    "resample": Shape("all audio resampled to --sample-rate (8 kHz)", build_resample, True),
    "speakers": Shape("train of the K speakers with the most audio; dev / test unchanged", build_speakers, False),
    "noisy": Shape("coloured noise + babble of the same split at a random SNR", build_noisy, True),
    "short": Shape("1-4 s segments cut at force-aligned word boundaries", build_short, True),
    "voices": Shape("train unchanged; dev / test speakers given child-like pitch and formants", build_voices, True),
}


def _speaker_count(records: list[dict]) -> str:
    speakers = {r.get("speaker") for r in records}
    return "no" if speakers == {None} else str(len(speakers - {None}))


def build_shape(shape: str, src: str | Path, out: str | Path, *, seed: int = 0, force: bool = False,
                **options: Any) -> dict[str, list[dict]]:
    """Build ``shape`` of the corpus in ``src`` into ``out`` (see the module docstring) and
    return its records by split (empty when ``out`` was already complete). ``options`` are the
    shape's (``utterances=500`` for ``tiny``, ``sample_rate=8000`` for ``resample``, ...).
    Raises ``ValueError`` (or its subclass ``CorpusLayoutError``) for a bad source or option."""
    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r}; expected one of {', '.join(SHAPES)}")
    src = require_dir(src, LAYOUT)
    for split in SPLITS:
        if not (src / f"{split}.jsonl").is_file():
            raise CorpusLayoutError(f"{src / f'{split}.jsonl'}: no such manifest; expected {LAYOUT}")
    out = Path(out)
    params = inspect.signature(SHAPES[shape].build).parameters
    known = {k: p.default for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"option(s) {unknown} for the {shape} shape; expected some of {sorted(known)}")
    missing = sorted(k for k, v in known.items() if v is inspect.Parameter.empty and k not in options)
    if missing:
        raise ValueError(f"the {shape} shape needs option(s) {missing}")
    opts = {k: list(v) if isinstance(v, tuple) else v for k, v in {**known, **options}.items()}
    settings = {"shape": shape, "version": SHAPE_VERSION, "source": str(src.resolve()),
                "manifests": source_hashes(src), "seed": seed, "options": opts}
    if "align_ckpt" in opts:
        ckpt = Path(opts["align_ckpt"])
        if not ckpt.is_file():
            raise ValueError(f"--align-ckpt {ckpt}: no such checkpoint file; expected a fastasr training checkpoint")
        settings["options"]["align_ckpt"] = str(ckpt.resolve())
        settings["checkpoint"] = hashlib.sha256(ckpt.read_bytes()).hexdigest()[:16]
    if not needs_build(out, settings, [f"{s}.jsonl" for s in SPLITS], force, f"the {shape} shape"):
        return {}
    corpus, skipped = read_corpus(src)
    out.mkdir(parents=True, exist_ok=True)
    if SHAPES[shape].writes_audio:
        for split in SPLITS:
            shutil.rmtree(out / "wav" / split, ignore_errors=True)
            (out / "wav" / split).mkdir(parents=True)
    records = SHAPES[shape].build(corpus, out, seed, skipped, **options)
    for split in SPLITS:
        write_split(out, split, records[split], skipped[split], src)
    mark_complete(out, settings)
    print(f"{shape} shape of {src} in {out}: " + "; ".join(
        f"{split} {len(records[split])} utterances, {sum(r['duration'] for r in records[split]) / 3600:.2f} h, "
        f"{_speaker_count(records[split])} speakers" for split in SPLITS))
    return records


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fastasr-corpus shapes", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="shape", required=True, metavar="SHAPE",
                           help=" | ".join(SHAPES) + " (fastasr-corpus shapes SHAPE -h: its options)")
    parsers = {}
    for name, shape in SHAPES.items():
        sp = sub.add_parser(name, help=shape.help, description=shape.help)
        sp.add_argument("src", help=f"the source corpus: {LAYOUT}")
        sp.add_argument("out", help="output directory: {train,dev,test}.jsonl (and wav/)")
        sp.add_argument("--seed", type=int, default=0, help="every random draw follows it")
        sp.add_argument("--force", action="store_true", help="rebuild even if OUT is complete with these settings")
        parsers[name] = sp
    t = parsers["tiny"]
    t.add_argument("--utterances", type=int, default=1000, help="most training utterances")
    t.add_argument("--minutes", type=float, default=45.0, help="most minutes of training audio")
    t.add_argument("--dev-utterances", type=int, default=200, help="most dev utterances")
    t.add_argument("--test-utterances", type=int, default=200, help="most test utterances")
    for name, lo, hi in (("long", 15.0, 35.0), ("short", 1.0, 4.0)):
        parsers[name].add_argument("--min-seconds", type=float, default=lo, help="shortest utterance (s)")
        parsers[name].add_argument("--max-seconds", type=float, default=hi, help="longest utterance (s)")
    parsers["long"].add_argument("--pause-s", type=float, nargs=2, default=(0.2, 0.6), metavar=("LOW", "HIGH"),
                                 help="silence between two joined utterances, drawn uniformly (s)")
    parsers["resample"].add_argument("--sample-rate", type=int, default=8000, help="the new rate (Hz)")
    parsers["speakers"].add_argument("--count", type=int, default=5,
                                     help="training speakers kept (<= 5: few, >= 20: many)")
    parsers["noisy"].add_argument("--snr-db", type=float, nargs=2, default=(5.0, 15.0), metavar=("LOW", "HIGH"),
                                  help="SNR drawn uniformly per utterance (dB)")
    parsers["noisy"].add_argument("--babble-talkers", type=int, default=3,
                                  help="other utterances of the split summed into the babble")
    parsers["short"].add_argument("--align-ckpt", required=True,
                                  help="a fastasr checkpoint with character units, for forced alignment")
    parsers["voices"].add_argument("--semitones", type=float, nargs=2, default=(4.0, 7.0), metavar=("LOW", "HIGH"),
                                   help="F0 raise drawn uniformly per dev / test speaker (semitones)")
    parsers["voices"].add_argument("--formant-scale", type=float, nargs=2, default=(1.15, 1.25),
                                   metavar=("LOW", "HIGH"),
                                   help="formant scaling drawn uniformly per dev / test speaker (> 1: shorter vocal tract)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    def build(a: argparse.Namespace) -> None:
        options = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(a).items()
                   if k not in ("shape", "src", "out", "seed", "force")}
        build_shape(a.shape, a.src, a.out, seed=a.seed, force=a.force, **options)

    return command.run(_parser(), argv, build)
