"""The built-in corpus: English speech synthesised offline with espeak-ng.

    python -m fastasr.corpora.synthetic --out data/synthetic [--seed 0] \
        [--train 3000 --dev 300 --test 300] [--workers 2] [--force]

writes ``train.jsonl``, ``dev.jsonl``, ``test.jsonl`` and ``wav/<split>/*.wav``
(16 kHz, 16-bit PCM) under ``--out``, then a completion marker
``.complete``. A second run with the same arguments finds the marker and
does nothing.

Each utterance is a sentence from simple templates over the lexicon in
``words.txt`` (~1400 common English words), spoken by one espeak-ng voice
(accent × variant) at a random rate, pitch and pitch range, with 0.1–0.4 s of
silence either side, then mixed with white, pink or brown noise at a random
SNR of 10–30 dB and scaled to a random peak level. Durations are 1–8 s.

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


def synthesize_utterance(job: _Job) -> dict:
    """Synthesise, write and describe one utterance (runs in a worker process)."""
    import torch

    from fastasr.data.audio import resample, write_wav

    es = Espeak()
    rng = np.random.default_rng([job.seed, SPLITS.index(job.split), job.index])
    split_voices = voices(job.split)
    voice = split_voices[int(rng.integers(len(split_voices)))]
    rate = int(rng.integers(RATE_WPM[0], RATE_WPM[1] + 1))
    pitch = int(rng.integers(PITCH[0], PITCH[1] + 1))
    prange = int(rng.integers(PITCH_RANGE[0], PITCH_RANGE[1] + 1))
    pads = rng.uniform(*PAD_S, size=2)
    target = int(rng.integers(2, 21))
    pad_samples = [int(p * SAMPLE_RATE) for p in pads]

    for _attempt in range(20):
        text = make_sentence(rng, target)
        pcm = es.synthesize(text, espeak_voice_name(voice), rate=rate, pitch=pitch, pitch_range=prange)
        raw = pcm.astype(np.float32) / 32768.0
        loud = np.flatnonzero(np.abs(raw) > 0.01 * max(np.abs(raw).max(), 1e-6))
        if loud.size:
            raw = raw[max(loud[0] - 80, 0): loud[-1] + 80]  # trim espeak's own silences
        speech = resample(torch.from_numpy(raw), es.sample_rate, SAMPLE_RATE).numpy().astype(np.float64)
        duration = (speech.shape[0] + sum(pad_samples)) / SAMPLE_RATE
        if duration > MAX_DURATION:
            target = max(2, min(target - 1, int(len(text.split()) * (MAX_DURATION - 0.8) / duration)))
        elif duration < MIN_DURATION:
            target += 2
        else:
            break
    else:
        raise RuntimeError(f"{job.split} {job.index}: no sentence of {MIN_DURATION}-{MAX_DURATION} s in 20 attempts")

    speech_power = np.mean(speech**2)
    wav = np.concatenate([np.zeros(pad_samples[0]), speech, np.zeros(pad_samples[1])])
    noise_kind = NOISES[int(rng.integers(len(NOISES)))]
    snr_db = float(rng.uniform(*SNR_DB))
    noise = _colored_noise(rng, noise_kind, wav.shape[0])
    wav = wav + noise * np.sqrt(speech_power / 10 ** (snr_db / 10))
    wav *= rng.uniform(*PEAK) / max(np.abs(wav).max(), 1e-9)

    rel = Path("wav") / job.split / f"{job.split}_{job.index:05d}.wav"
    write_wav(Path(job.out) / rel, wav, SAMPLE_RATE)
    phonemes = " | ".join(" ".join(w) for w in es.phonemize(text, espeak_voice_name(voice)))
    return {
        "audio_filepath": rel.as_posix(),
        "duration": round(wav.shape[0] / SAMPLE_RATE, 6),
        "text": text,
        "phonemes": phonemes,
        "speaker": voice,
        "rate_wpm": rate,
        "pitch": pitch,
        "noise": noise_kind,
        "snr_db": round(snr_db, 2),
    }


# --------------------------------------------------------------------- corpus


def _settings(seed: int, counts: Mapping[str, int]) -> dict:
    return {
        "generator_version": GENERATOR_VERSION,
        "seed": int(seed),
        "counts": {s: int(counts[s]) for s in SPLITS},
        "voices": {s: voices(s) for s in SPLITS},
        "sample_rate": SAMPLE_RATE,
    }


def build_corpus(out: str | Path, seed: int = 0, counts: Mapping[str, int] | None = None,
                 workers: int | None = None, force: bool = False) -> bool:
    """Synthesise the corpus under ``out``. Returns False (and does nothing) if
    a complete corpus with the same settings is already there."""
    out = Path(out)
    counts = dict(counts or {"train": 3000, "dev": 300, "test": 300})
    settings = _settings(seed, counts)
    if not needs_build(out, settings, [f"{s}.jsonl" for s in SPLITS], force, "synthetic corpus"):
        return False
    for split in SPLITS:
        shutil.rmtree(out / "wav" / split, ignore_errors=True)
        (out / "wav" / split).mkdir(parents=True, exist_ok=True)

    jobs = [_Job(seed, s, i, str(out)) for s in SPLITS for i in range(counts[s])]
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
    p.add_argument("--train", type=int, default=3000, help="train utterances")
    p.add_argument("--dev", type=int, default=300, help="dev utterances")
    p.add_argument("--test", type=int, default=300, help="test utterances")
    p.add_argument("--workers", type=int, default=None, help="processes (default: min(2, CPUs))")
    p.add_argument("--force", action="store_true", help="rebuild even if complete")
    args = p.parse_args(argv)
    counts = {"train": args.train, "dev": args.dev, "test": args.test}
    for split, n in counts.items():
        if n < 1:
            p.error(f"--{split} {n}; expected ≥ 1")
    build_corpus(args.out, seed=args.seed, counts=counts, workers=args.workers, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
