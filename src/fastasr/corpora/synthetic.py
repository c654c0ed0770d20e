"""The built-in corpus: English speech synthesised offline with espeak-ng.

    python -m fastasr.corpora.synthetic --out data/synthetic [--seed 0] \
        [--train 3000 --dev 300 --test 300] [--workers 2] [--force]
    python -m fastasr.corpora.synthetic --out data/synthetic_long \
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
triphthongs ``aɪə``/``aɪɚ`` as ``aɪ`` + ``ə``/``ɚ``; ``|`` separates words. The
inventory is 57 units over the four accents.

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
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fastasr.corpora.espeak import Espeak
from fastasr.corpora.lexicon import make_sentence
from fastasr.corpora.marker import mark_complete, needs_build

log = logging.getLogger(__name__)

GENERATOR_VERSION = 2  # bump when the output for a given seed changes
SAMPLE_RATE = 16000
MIN_DURATION, MAX_DURATION = 1.0, 8.0
SPLITS = ("train", "dev", "test")

# espeak voice name of each accent (the speaker label uses the key)
ACCENTS = {
    "en-us": "en-us",
    "en-gb": "en",
    "en-rp": "en-gb-x-rp",
    "en-nyc": "en-us-nyc",
}
# espeak voice variants (voices/!v), disjoint between splits
VARIANTS = {
    "train": (
        "m1", "m2", "m4", "m5", "m7", "f1", "f3", "f5", "klatt", "klatt4",
        "linda", "john", "max", "paul", "victor", "adam", "zac", "edward", "david",
    ),
    "dev": ("m6", "f4", "klatt3", "steph"),
    "test": ("m3", "f2", "klatt2", "robert"),
}
RATE_WPM = (130, 210)  # espeak speaking rate, words per minute
PITCH = (25, 75)  # espeak base pitch, 0-100 (50 is the voice's own)
PITCH_RANGE = (20, 80)  # espeak pitch range, 0-100
SNR_DB = (10.0, 30.0)
NOISES = ("white", "pink", "brown")
PAD_S = (0.1, 0.4)  # silence added before and after the speech
PEAK = (0.25, 0.9)  # peak level of the final waveform
LONG_COUNTS = {"train": 600, "dev": 60, "test": 60}  # default size of a long corpus (make data-long)



def voices(split: str) -> list[str]:
    """The voice ids (``accent+variant``) of a split, in a fixed order."""
    return [f"{a}+{v}" for v in VARIANTS[split] for a in ACCENTS]


def espeak_voice_name(voice: str) -> str:
    """``en-gb+m3`` → the name espeak-ng's ``SetVoiceByName`` accepts (``en+m3``)."""
    accent, variant = voice.split("+", 1)
    return f"{ACCENTS[accent]}+{variant}"


# ----------------------------------------------------------------- utterances


def _colored_noise(rng: np.random.Generator, kind: str, n: int) -> np.ndarray:
    """Unit-power noise: white, pink (1/f power) or brown (1/f² power)."""
    if kind == "white":
        noise = rng.standard_normal(n)
    else:  # shape white noise in the frequency domain (power-of-two length: fast FFT)
        m = 1 << max(n - 1, 1).bit_length()
        spec = np.fft.rfft(rng.standard_normal(m))
        f = np.arange(spec.shape[0], dtype=np.float64)
        f[0] = 1.0
        spec /= f ** (0.5 if kind == "pink" else 1.0)
        spec[0] = 0.0
        noise = np.fft.irfft(spec, m)[:n]
    return noise / max(np.sqrt(np.mean(noise**2)), 1e-12)


def _worker_init() -> None:
    import torch

    torch.set_num_threads(1)


@dataclass(frozen=True)
class _Job:
    seed: int
    split: str
    index: int
    out: str
    min_seconds: float | None = None  # both set: a long utterance (fastasr.corpora.synthetic_long)
    max_seconds: float | None = None


@dataclass(frozen=True)
class _Style:
    """How one utterance is spoken: the voice (``accent+variant``) and espeak's settings."""

    voice: str
    rate: int
    pitch: int
    pitch_range: int


def _draw_style(rng: np.random.Generator, split: str) -> _Style:
    """A voice of ``split`` and a random rate, pitch and pitch range (4 draws, in that order)."""
    split_voices = voices(split)
    voice = split_voices[int(rng.integers(len(split_voices)))]
    rate = int(rng.integers(RATE_WPM[0], RATE_WPM[1] + 1))
    pitch = int(rng.integers(PITCH[0], PITCH[1] + 1))
    prange = int(rng.integers(PITCH_RANGE[0], PITCH_RANGE[1] + 1))
    return _Style(voice, rate, pitch, prange)


def _speak(es: Espeak, text: str, style: _Style) -> np.ndarray:
    """``text`` spoken in ``style``, espeak's leading and trailing silence trimmed: float64
    samples ``(T,)`` at ``SAMPLE_RATE``."""
    import torch

    from fastasr.data.audio import resample

    pcm = es.synthesize(text, espeak_voice_name(style.voice), rate=style.rate, pitch=style.pitch,
                        pitch_range=style.pitch_range)
    raw = pcm.astype(np.float32) / 32768.0
    loud = np.flatnonzero(np.abs(raw) > 0.01 * max(np.abs(raw).max(), 1e-6))
    if loud.size:
        raw = raw[max(loud[0] - 80, 0): loud[-1] + 80]  # trim espeak's own silences
    return resample(torch.from_numpy(raw), es.sample_rate, SAMPLE_RATE).numpy().astype(np.float64)


def _phonemes(es: Espeak, text: str, voice: str) -> str:
    """The manifest's ``phonemes`` of ``text`` spoken by ``voice``: units, `` | `` between words."""
    return " | ".join(" ".join(w) for w in es.phonemize(text, espeak_voice_name(voice)))


def _mix_and_write(rng: np.random.Generator, job: _Job, speech: np.ndarray, pad_samples: Sequence[int],
                   speech_power: float) -> tuple[np.ndarray, dict]:
    """Pad ``speech``, add noise at a random SNR relative to ``speech_power``, scale to a random
    peak, write ``wav/<split>/<split>_<index>.wav``; returns the waveform and its manifest fields
    (``audio_filepath``, ``duration``, ``noise``, ``snr_db``). Draws noise kind, SNR, noise, peak."""
    from fastasr.data.audio import write_wav

    wav = np.concatenate([np.zeros(pad_samples[0]), speech, np.zeros(pad_samples[1])])
    noise_kind = NOISES[int(rng.integers(len(NOISES)))]
    snr_db = float(rng.uniform(*SNR_DB))
    noise = _colored_noise(rng, noise_kind, wav.shape[0])
    wav = wav + noise * np.sqrt(speech_power / 10 ** (snr_db / 10))
    wav *= rng.uniform(*PEAK) / max(np.abs(wav).max(), 1e-9)

    rel = Path("wav") / job.split / f"{job.split}_{job.index:05d}.wav"
    write_wav(Path(job.out) / rel, wav, SAMPLE_RATE)
    fields = {"audio_filepath": rel.as_posix(), "duration": round(wav.shape[0] / SAMPLE_RATE, 6),
              "noise": noise_kind, "snr_db": round(snr_db, 2)}
    return wav, fields


def synthesize_utterance(job: _Job) -> dict:
    """Synthesise, write and describe one utterance (runs in a worker process)."""
    if job.max_seconds is not None:
        from fastasr.corpora.synthetic_long import synthesize_long_utterance

        return synthesize_long_utterance(job)
    es = Espeak()
    rng = np.random.default_rng([job.seed, SPLITS.index(job.split), job.index])
    style = _draw_style(rng, job.split)
    pads = rng.uniform(*PAD_S, size=2)
    target = int(rng.integers(2, 21))
    pad_samples = [int(p * SAMPLE_RATE) for p in pads]

    for _attempt in range(20):
        text = make_sentence(rng, target)
        speech = _speak(es, text, style)
        duration = (speech.shape[0] + sum(pad_samples)) / SAMPLE_RATE
        if duration > MAX_DURATION:
            target = max(2, min(target - 1, int(len(text.split()) * (MAX_DURATION - 0.8) / duration)))
        elif duration < MIN_DURATION:
            target += 2
        else:
            break
    else:
        raise RuntimeError(f"{job.split} {job.index}: no sentence of {MIN_DURATION}-{MAX_DURATION} s in 20 attempts")

    _, fields = _mix_and_write(rng, job, speech, pad_samples, float(np.mean(speech**2)))
    return {
        "audio_filepath": fields["audio_filepath"],
        "duration": fields["duration"],
        "text": text,
        "phonemes": _phonemes(es, text, style.voice),
        "speaker": style.voice,
        "rate_wpm": style.rate,
        "pitch": style.pitch,
        "noise": fields["noise"],
        "snr_db": fields["snr_db"],
    }


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
        from fastasr.corpora.synthetic_long import LONG_GENERATOR_VERSION

        settings["durations"] = [float(durations[0]), float(durations[1])]
        settings["long_generator_version"] = LONG_GENERATOR_VERSION
    return settings


def check_durations(min_seconds: float, max_seconds: float) -> tuple[float, float]:
    """``(min, max)`` of a long corpus, or ValueError naming what is wrong."""
    from fastasr.corpora.synthetic_long import MIN_SPAN_S

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
    jobs = [_Job(seed, s, i, str(out), lo, hi) for s in SPLITS for i in range(counts[s])]
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
        with mp.get_context("spawn").Pool(workers, initializer=_worker_init) as pool:
            records = pool.map(synthesize_utterance, jobs, chunksize=16)

    from fastasr.data.manifest import write_manifest

    start = 0
    for split in SPLITS:
        write_manifest(out / f"{split}.jsonl", records[start: start + counts[split]])
        start += counts[split]
    mark_complete(out, settings)
    print(f"synthesised {len(jobs)} utterances ({counts}) into {out} in {time.time() - t0:.1f} s "
          f"with {workers} worker(s)")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fastasr.corpora.synthetic", description=__doc__.split("\n\n")[0])
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


if __name__ == "__main__":
    sys.exit(main())
