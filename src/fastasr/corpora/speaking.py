"""How the synthetic corpora speak: espeak-ng voices, speaking styles, noise and the written
utterance. :mod:`fastasr.corpora.synthetic` (1-8 s sentences) and
:mod:`fastasr.corpora.synthetic_long` (sentences joined to 10-40 s) both build on it.

Voices are ``<accent>+<variant>``: accents shared by every split, variants disjoint between
them. An utterance is spoken in one :class:`Style` (voice, rate, pitch, pitch range), padded
with silence, mixed with white, pink or brown noise at a random SNR and scaled to a random
peak (:func:`mix_and_write`). Every draw comes from the generator the caller passes, in a
fixed order, so a corpus is byte-identical for a seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

import numpy as np

from fastasr.corpora.espeak import Espeak
from fastasr.data.audio import resample, write_wav

__all__ = ["SAMPLE_RATE", "SPLITS", "Job", "Style", "colored_noise", "draw_style", "espeak_voice_name",
           "mix_and_write", "phonemes_of", "speak", "split_phonetic_words", "voices", "word_phonemes",
           "worker_init"]

SAMPLE_RATE = 16000
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


def colored_noise(rng: np.random.Generator, kind: str, n: int) -> np.ndarray:
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


def worker_init() -> None:
    import torch

    torch.set_num_threads(1)


@dataclass(frozen=True)
class Job:
    seed: int
    split: str
    index: int
    out: str
    min_seconds: float | None = None  # both set: a long utterance (fastasr.corpora.synthetic_long)
    max_seconds: float | None = None


@dataclass(frozen=True)
class Style:
    """How one utterance is spoken: the voice (``accent+variant``) and espeak's settings."""

    voice: str
    rate: int
    pitch: int
    pitch_range: int


def draw_style(rng: np.random.Generator, split: str) -> Style:
    """A voice of ``split`` and a random rate, pitch and pitch range (4 draws, in that order)."""
    split_voices = voices(split)
    voice = split_voices[int(rng.integers(len(split_voices)))]
    rate = int(rng.integers(RATE_WPM[0], RATE_WPM[1] + 1))
    pitch = int(rng.integers(PITCH[0], PITCH[1] + 1))
    prange = int(rng.integers(PITCH_RANGE[0], PITCH_RANGE[1] + 1))
    return Style(voice, rate, pitch, prange)


def speak(es: Espeak, text: str, style: Style) -> np.ndarray:
    """``text`` spoken in ``style``, espeak's leading and trailing silence trimmed: float64
    samples ``(T,)`` at ``SAMPLE_RATE``."""
    import torch

    pcm = es.synthesize(text, espeak_voice_name(style.voice), rate=style.rate, pitch=style.pitch,
                        pitch_range=style.pitch_range)
    raw = pcm.astype(np.float32) / 32768.0
    loud = np.flatnonzero(np.abs(raw) > 0.01 * max(np.abs(raw).max(), 1e-6))
    if loud.size:
        raw = raw[max(loud[0] - 80, 0): loud[-1] + 80]  # trim espeak's own silences
    return resample(torch.from_numpy(raw), es.sample_rate, SAMPLE_RATE).numpy().astype(np.float64)


def phonemes_of(es: Espeak, text: str, voice: str) -> str:
    """The manifest's ``phonemes`` of ``text`` spoken by ``voice``: units, `` | `` between words,
    one phonetic word a word of ``text`` (:func:`word_phonemes`)."""
    return " | ".join(" ".join(w) for w in word_phonemes(es, text, voice))


def word_phonemes(es: Espeak, text: str, voice: str) -> list[list[str]]:
    """The units espeak-ng speaks for ``text`` with ``voice``, one list for each of its words
    (split on whitespace).

    espeak-ng speaks a few word pairs as one phonetic word: its dictionary's entries such as
    "with the" (``w ɪ ð ð ə``), "of a" (``ə v ə``) or "for a" (``f ɚ ɹ ə``), and the New York
    voice's "my huge" (``m aɪ j uː dʒ``, the h dropped). Such a phonetic word is split where its
    words' own phonemes (each word phonemized alone) align with it best
    (:func:`split_phonetic_words`), so the units stay those spoken and each word has its own."""
    name = espeak_voice_name(voice)
    spoken = es.phonemize(text, name)
    words = text.split()
    if len(spoken) == len(words):
        return spoken
    alone = [[u for w in es.phonemize(word, name) for u in w] for word in words]
    try:
        return split_phonetic_words(spoken, alone)
    except ValueError as err:
        raise ValueError(f"{text!r} spoken by {voice}: {err}") from None


def split_phonetic_words(spoken: Sequence[Sequence[str]], alone: Sequence[Sequence[str]]) -> list[list[str]]:
    """Split the phonetic words ``spoken`` into one unit list for each word, given each word's
    own units ``alone``: every boundary of ``spoken`` is kept, and a phonetic word that holds
    several words is cut where the sum of the edit distances between each word's units and its
    own is least (each word at least one unit; of equal cuts, the later). ValueError when
    there are more phonetic words than words, or fewer units than words."""
    if len(spoken) > len(alone):
        raise ValueError(f"{len(spoken)} phonetic words for {len(alone)} words")
    units = [u for w in spoken for u in w]
    ends = set(accumulate(len(w) for w in spoken))  # the cuts espeak-ng made, which every split keeps
    n, length = len(alone), len(units)
    # best[i][p]: least cost of the first i words over units[:p]; back[i][p]: where word i-1 starts
    best = [[np.inf] * (length + 1) for _ in range(n + 1)]
    back = [[0] * (length + 1) for _ in range(n + 1)]
    best[0][0] = 0.0
    for i in range(1, n + 1):
        for end in range(1, length + 1):
            for start in range(end - 1, -1, -1):  # the word's units: units[start:end]
                if best[i - 1][start] < np.inf:
                    cost = best[i - 1][start] + _edit_distance(units[start:end], alone[i - 1])
                    if cost < best[i][end]:
                        best[i][end], back[i][end] = cost, start
                if start in ends:  # a word does not reach over a boundary espeak-ng spoke
                    break
    if best[n][length] == np.inf:
        raise ValueError(f"{length} units for {n} words")
    words, end = [], length
    for i in range(n, 0, -1):
        start = back[i][end]
        words.append(units[start:end])
        end = start
    return words[::-1]


def _edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Levenshtein distance between two unit sequences."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def mix_and_write(rng: np.random.Generator, job: Job, speech: np.ndarray, pad_samples: Sequence[int],
                   speech_power: float) -> tuple[np.ndarray, dict]:
    """Pad ``speech``, add noise at a random SNR relative to ``speech_power``, scale to a random
    peak, write ``wav/<split>/<split>_<index>.wav``; returns the waveform and its manifest fields
    (``audio_filepath``, ``duration``, ``noise``, ``snr_db``). Draws noise kind, SNR, noise, peak."""

    wav = np.concatenate([np.zeros(pad_samples[0]), speech, np.zeros(pad_samples[1])])
    noise_kind = NOISES[int(rng.integers(len(NOISES)))]
    snr_db = float(rng.uniform(*SNR_DB))
    noise = colored_noise(rng, noise_kind, wav.shape[0])
    wav = wav + noise * np.sqrt(speech_power / 10 ** (snr_db / 10))
    wav *= rng.uniform(*PEAK) / max(np.abs(wav).max(), 1e-9)

    rel = Path("wav") / job.split / f"{job.split}_{job.index:05d}.wav"
    write_wav(Path(job.out) / rel, wav, SAMPLE_RATE)
    fields = {"audio_filepath": rel.as_posix(), "duration": round(wav.shape[0] / SAMPLE_RATE, 6),
              "noise": noise_kind, "snr_db": round(snr_db, 2)}
    return wav, fields
