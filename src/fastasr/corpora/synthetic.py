"""The built-in corpus: English speech synthesised offline with espeak-ng.

    fastasr-corpus synthetic --out data/synthetic [--seed 0] \
        [--train 3000 --dev 300 --test 300] [--workers 2] [--force]
    fastasr-corpus synthetic --out data/synthetic_long \
        --min-seconds 10 --max-seconds 40 [--train 600 --dev 60 --test 60]     (make data-long)

writes ``train.jsonl``, ``dev.jsonl``, ``test.jsonl`` and ``wav/<split>/*.wav``
(16 kHz, 16-bit PCM) under ``--out``, then a completion marker
``.complete``. A second run with the same arguments finds the marker and
does nothing.

Each utterance is a sentence from simple templates over the lexicon in
``words.txt`` (~1400 common English words), spoken by one espeak-ng voice
(accent × variant) at a random rate, pitch and pitch range, with 0.1–0.4 s of
silence either side, then mixed with white, pink or brown noise at a random
SNR of 10–30 dB and scaled to a random peak level. Durations are 1–8 s.

With ``--min-seconds``/``--max-seconds`` (the long corpus, ``data=synthetic_long``) each
utterance instead joins several such sentences of one voice and one speaking style with
short pauses, to a duration within those bounds (10–40 s, ~21 s on average: 1,000–4,000
frames reach an unsubsampled encoder); its ``phonemes`` are the sentences' phonemes joined
by ``|``. Same voices, splits, noise and determinism; see :mod:`fastasr.corpora.synthetic_long`.

Voices (the manifest's ``speaker``) are ``<accent>+<variant>``. Accents are
shared by all splits (each has its own phoneme set, so every accent must be
seen in training); **variants are disjoint between splits**: the dev and the
test voices are all unseen in training, and dev and test voices differ from
each other too. Dev therefore measures generalisation to new voices (as WSJ
dev93 or the TIMIT dev set do) and is a fair model-selection proxy for test.

``phonemes`` are what espeak-ng actually speaks for that voice
(``espeak_TextToPhonemes``), split into units (espeak's own phoneme
segmentation, so diphthongs, affricates and long vowels stay one unit), with
stress marks dropped, r-coloured vowels written as vowel + ``ɹ`` and the
triphthongs ``aɪə``/``aɪɚ`` as ``aɪ`` + ``ə``/``ɚ``; ``|`` separates words, one phonetic
word a word of ``text`` (a word pair espeak-ng speaks as one, "with the" → ``w ɪ ð ð ə``, is
cut between its words: :func:`fastasr.corpora.speaking.word_phonemes`). The inventory is 57
units over the four accents.

Determinism: every utterance draws from its own generator seeded by
``(seed, split, index)`` and is synthesised by a freshly loaded copy of
libespeak-ng (the library keeps synthesis state in static variables) whose
random generators are re-seeded (``espeak_Initialize`` seeds one from the
clock; libc's ``rand`` is the other). The output is therefore byte-identical
for a seed whatever the number of workers or the order of the work.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from fastasr.corpora.espeak import Espeak
from fastasr.corpora.marker import mark_complete, needs_build
from fastasr.corpora.sentences import make_sentence
from fastasr.corpora.speaking import (
    PAD_S,
    SAMPLE_RATE,
    SPLITS,
    Job,
    Style,
    draw_style,
    mix_and_write,
    phonemes_of,
    speak,
    voices,
    worker_init,
)
from fastasr.corpora.synthetic_long import (
    LONG_GENERATOR_VERSION,
    MIN_SPAN_S,
    synthesize_long_utterance,
)
from fastasr.data.manifest import write_manifest

log = logging.getLogger(__name__)

GENERATOR_VERSION = 3  # bump when the output for a given seed changes (3: every word its phonetic word)
MIN_DURATION, MAX_DURATION = 1.0, 8.0
LONG_COUNTS = {"train": 600, "dev": 60, "test": 60}  # default size of a long corpus (make data-long)


def synthesize_utterance(job: Job) -> dict:
    """Synthesise, write and describe one utterance (runs in a worker process)."""
    if job.max_seconds is not None:
        return synthesize_long_utterance(job)
    es = Espeak()
    rng = np.random.default_rng([job.seed, SPLITS.index(job.split), job.index])
    style, pad_samples, text, speech = _spoken_sentence(es, rng, job)
    _, fields = mix_and_write(rng, job, speech, pad_samples, float(np.mean(speech**2)))
    return {
        "audio_filepath": fields["audio_filepath"],
        "duration": fields["duration"],
        "text": text,
        "phonemes": phonemes_of(es, text, style.voice),
        "speaker": style.voice,
        "rate_wpm": style.rate,
        "pitch": style.pitch,
        "noise": fields["noise"],
        "snr_db": fields["snr_db"],
    }


def utterance_text(job: Job) -> tuple[str, str, str]:
    """``(text, phonemes, speaker)`` of the utterance :func:`synthesize_utterance` makes of
    ``job``, without its noise or its file (the speech is still synthesised: a sentence is
    redrawn until it is spoken in 1-8 s)."""
    es = Espeak()
    rng = np.random.default_rng([job.seed, SPLITS.index(job.split), job.index])
    style, _, text, _ = _spoken_sentence(es, rng, job)
    return text, phonemes_of(es, text, style.voice), style.voice


def _spoken_sentence(es: Espeak, rng: np.random.Generator, job: Job) -> tuple[Style, list[int], str, np.ndarray]:
    """The style, the silence either side (samples), the sentence and its speech of one
    utterance: ``rng``'s draws before the noise's."""
    style = draw_style(rng, job.split)
    pads = rng.uniform(*PAD_S, size=2)
    target = int(rng.integers(2, 21))
    pad_samples = [int(p * SAMPLE_RATE) for p in pads]

    for _attempt in range(20):
        text = make_sentence(rng, target)
        speech = speak(es, text, style)
        duration = (speech.shape[0] + sum(pad_samples)) / SAMPLE_RATE
        if duration > MAX_DURATION:
            target = max(2, min(target - 1, int(len(text.split()) * (MAX_DURATION - 0.8) / duration)))
        elif duration < MIN_DURATION:
            target += 2
        else:
            break
    else:
        raise RuntimeError(f"{job.split} {job.index}: no sentence of {MIN_DURATION}-{MAX_DURATION} s in 20 attempts")
    return style, pad_samples, text, speech


# --------------------------------------------------------------------- corpus


def _settings(seed: int, counts: Mapping[str, int], durations: tuple[float, float] | None = None) -> dict:
    settings = {
        "generator_version": GENERATOR_VERSION,
        "seed": int(seed),
        "counts": {s: int(counts[s]) for s in SPLITS},
        "voices": {s: voices(s) for s in SPLITS},
        "sample_rate": SAMPLE_RATE,
    }
    if durations is not None:  # long utterances; the 1-8 s corpus's marker is unchanged
        settings["durations"] = [float(durations[0]), float(durations[1])]
        settings["long_generator_version"] = LONG_GENERATOR_VERSION
    return settings


def check_durations(min_seconds: float, max_seconds: float) -> tuple[float, float]:
    """``(min, max)`` of a long corpus, or ValueError naming what is wrong."""
    lo, hi = float(min_seconds), float(max_seconds)
    if not 0.0 < lo < hi:
        raise ValueError(f"utterance durations {lo}-{hi} s; expected 0 < min < max")
    if hi - lo < MIN_SPAN_S:
        raise ValueError(f"utterance durations {lo}-{hi} s: a span of {hi - lo:g} s; expected at least "
                         f"{MIN_SPAN_S:g} s (one sentence must fit between the bounds)")
    return lo, hi


def build_corpus(out: str | Path, seed: int = 0, counts: Mapping[str, int] | None = None,
                 workers: int | None = None, force: bool = False,
                 durations: tuple[float, float] | None = None) -> bool:
    """Synthesise the corpus under ``out``. Returns False (and does nothing) if
    a complete corpus with the same settings is already there.

    ``durations``: ``(min, max)`` seconds makes every utterance a long one, several sentences
    of one voice joined by short pauses (:mod:`fastasr.corpora.synthetic_long`; ``make
    data-long`` uses 10-40 s); None: one sentence of 1-8 s each."""
    out = Path(out)
    if durations is not None:
        durations = check_durations(*durations)
    counts = dict(counts or (LONG_COUNTS if durations else {"train": 3000, "dev": 300, "test": 300}))
    settings = _settings(seed, counts, durations)
    what = "synthetic corpus" if durations is None else "long synthetic corpus"
    if not needs_build(out, settings, [f"{s}.jsonl" for s in SPLITS], force, what):
        return False
    for split in SPLITS:
        shutil.rmtree(out / "wav" / split, ignore_errors=True)
        (out / "wav" / split).mkdir(parents=True, exist_ok=True)

    lo, hi = durations if durations is not None else (None, None)
    jobs = [Job(seed, s, i, str(out), lo, hi) for s in SPLITS for i in range(counts[s])]
    workers = workers or min(2, os.cpu_count() or 1)
    t0 = time.time()
    if workers <= 1:
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # per-utterance ops are tiny: threads only add overhead
        try:
            records = [synthesize_utterance(j) for j in jobs]
        finally:
            torch.set_num_threads(threads)
    else:
        with mp.get_context("spawn").Pool(workers, initializer=worker_init) as pool:
            records = pool.map(synthesize_utterance, jobs, chunksize=16)

    start = 0
    for split in SPLITS:
        write_manifest(out / f"{split}.jsonl", records[start: start + counts[split]])
        start += counts[split]
    mark_complete(out, settings)
    print(f"synthesised {len(jobs)} utterances ({counts}) into {out} in {time.time() - t0:.1f} s "
          f"with {workers} worker(s)")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fastasr-corpus synthetic", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory (manifests + wav/)")
    p.add_argument("--seed", type=int, default=0, help="same seed → same corpus")
    p.add_argument("--train", type=int, default=None, help="train utterances (default 3000; long: 600)")
    p.add_argument("--dev", type=int, default=None, help="dev utterances (default 300; long: 60)")
    p.add_argument("--test", type=int, default=None, help="test utterances (default 300; long: 60)")
    p.add_argument("--min-seconds", type=float, default=None,
                   help="with --max-seconds: long utterances of several sentences of one voice, "
                        "this long at least (make data-long: 10)")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="with --min-seconds: long utterances at most this long (make data-long: 40)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: min(2, CPUs))")
    p.add_argument("--force", action="store_true", help="rebuild even if complete")
    args = p.parse_args(argv)
    durations = None
    if (args.min_seconds is None) != (args.max_seconds is None):
        p.error("--min-seconds and --max-seconds go together; expected both or neither")
    if args.min_seconds is not None:
        try:
            durations = check_durations(args.min_seconds, args.max_seconds)
        except ValueError as err:
            p.error(str(err))
    defaults = LONG_COUNTS if durations else {"train": 3000, "dev": 300, "test": 300}
    counts = {s: defaults[s] if getattr(args, s) is None else getattr(args, s) for s in SPLITS}
    for split, n in counts.items():
        if n < 1:
            p.error(f"--{split} {n}; expected ≥ 1")
    build_corpus(args.out, seed=args.seed, counts=counts, workers=args.workers, force=args.force,
                 durations=durations)
    return 0
