"""The built-in corpus: English speech synthesised offline with espeak-ng.

    python -m fastasr.data.synthetic --out data/synthetic [--seed 0] \
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

import _ctypes
import argparse
import ctypes
import json
import logging
import multiprocessing as mp
import os
import re
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

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

_STRESS = str.maketrans("", "", "ˈˌ")
_WORDS_FILE = Path(__file__).with_name("words.txt")


def voices(split: str) -> list[str]:
    """The voice ids (``accent+variant``) of a split, in a fixed order."""
    return [f"{a}+{v}" for v in VARIANTS[split] for a in ACCENTS]


def espeak_voice_name(voice: str) -> str:
    """``en-gb+m3`` → the name espeak-ng's ``SetVoiceByName`` accepts (``en+m3``)."""
    accent, variant = voice.split("+", 1)
    return f"{ACCENTS[accent]}+{variant}"


# ---------------------------------------------------------------- espeak-ng


_SYNTH_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_PHONEMES_IPA = 0x02
_RATE, _VOLUME, _PITCH, _RANGE = 1, 2, 3, 4


class Espeak:
    """ctypes binding to the libespeak-ng of the ``espeakng-loader`` wheel.

    One instance per process (espeak-ng has global state): ``Espeak()``
    returns the process's instance. ``synthesize`` and ``phonemize`` reload
    the library and re-seed both generators it draws from (its own, which
    ``espeak_Initialize`` seeds from the clock, and libc's ``rand``) first, so
    their output depends only on their arguments.
    """

    _instance: Espeak | None = None
    _pid = -1

    def __new__(cls) -> Espeak:
        if cls._instance is None or cls._pid != os.getpid():
            inst = super().__new__(cls)
            inst._setup()
            cls._instance, cls._pid = inst, os.getpid()
        return cls._instance

    def _setup(self) -> None:
        import espeakng_loader

        self._lib_path = espeakng_loader.get_library_path()
        self._data_path = espeakng_loader.get_data_path().encode()
        self._lib = None
        self._libc = ctypes.CDLL(None)  # espeak-ng also draws from libc's rand()
        self._chunks: list[np.ndarray] = []
        self._callback = _SYNTH_CB(self._on_audio)  # keep a reference: C holds the pointer
        self.sample_rate = 0
        self.reset()

    def _on_audio(self, wav, n, _events) -> int:
        if wav and n > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        return 0  # 0 = continue synthesis

    def reset(self) -> None:
        """Unload and reload libespeak-ng so that all its static state starts fresh (~0.3 ms)."""
        if self._lib is not None:
            self._lib.espeak_Terminate()
            _ctypes.dlclose(self._lib._handle)
            self._lib = None
        try:  # still mapped? then someone else holds a handle and its static state survives
            probe = ctypes.CDLL(self._lib_path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            probe = None
        if probe is not None:
            _ctypes.dlclose(probe._handle)
            raise RuntimeError(f"{self._lib_path} is loaded elsewhere in this process, so it cannot be "
                               "reset; espeak-ng output would depend on earlier synthesis")
        lib = ctypes.CDLL(self._lib_path)
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_Synth.argtypes = [
            ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
            ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
        ]
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_int, ctypes.c_int]
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, self._data_path, 0)
        if rate <= 0:
            raise RuntimeError(f"espeak_Initialize failed ({rate}) with data at {self._data_path.decode()}")
        lib.espeak_SetSynthCallback(self._callback)
        lib.espeak_ng_SetRandSeed(1)  # Initialize seeds espeak's own generator from time()
        self._libc.srand(1)
        self._lib, self.sample_rate = lib, rate

    def _set_voice(self, voice: str) -> None:
        name = espeak_voice_name(voice)
        if self._lib.espeak_SetVoiceByName(name.encode()) != 0:
            raise ValueError(f"espeak-ng has no voice {name!r} (from voice id {voice!r})")

    def synthesize(self, text: str, voice: str, rate: int = 175, pitch: int = 50, pitch_range: int = 50,
                   volume: int = 60) -> np.ndarray:
        """Speak ``text`` with a voice id (``en-us+m3``). Returns int16 samples at ``self.sample_rate``."""
        self.reset()
        self._set_voice(voice)
        for param, value in ((_RATE, rate), (_PITCH, pitch), (_RANGE, pitch_range), (_VOLUME, volume)):
            self._lib.espeak_SetParameter(param, int(value), 0)
        self._chunks = []
        data = text.encode("utf-8")
        err = self._lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        if err != 0:
            raise RuntimeError(f"espeak_Synth failed with status {err} for {text!r}")
        self._lib.espeak_Synchronize()
        return np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)

    def phonemize(self, text: str, voice: str) -> list[list[str]]:
        """The phonemes espeak-ng speaks for ``text`` with that voice: one list of units per word."""
        self.reset()
        self._set_voice(voice)
        buf = ctypes.create_string_buffer(text.encode("utf-8"))
        ptr = ctypes.c_char_p(ctypes.addressof(buf))
        mode = _PHONEMES_IPA | (ord("_") << 8)  # IPA, units separated by "_", words by " "
        words: list[list[str]] = []
        while ptr.value:  # one clause per call; espeak advances ptr
            out = self._lib.espeak_TextToPhonemes(ctypes.byref(ptr), _CHARS_UTF8, mode)
            for word in (out or b"").decode("utf-8").split():
                units = [u for raw in word.split("_") for u in normalize_phoneme(raw)]
                if units:
                    words.append(units)
        return words


def normalize_phoneme(unit: str) -> list[str]:
    """Map one espeak IPA unit to corpus units: drop stress, split r-coloured vowels and triphthongs."""
    unit = unit.translate(_STRESS).strip()
    if not unit:
        return []
    if len(unit) > 1 and unit.endswith("ɹ"):  # ɑːɹ, ɔːɹ, ɛɹ, ɪɹ, ʊɹ → vowel + ɹ
        return [unit[:-1], "ɹ"]
    if unit in ("aɪə", "aɪɚ"):
        return ["aɪ", unit[2:]]
    return [unit]


# ------------------------------------------------------------------ sentences


@lru_cache(maxsize=1)
def load_lexicon(path: str | None = None) -> dict[str, tuple[str, ...]]:
    """Word classes of ``words.txt``: ``{"noun": (...), "verb": (...), ...}``."""
    classes: dict[str, list[str]] = {}
    current = None
    for line in Path(path or _WORDS_FILE).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"\[(\w+)\]", line)
        if m:
            current = classes.setdefault(m.group(1), [])
        elif current is None:
            raise ValueError(f"{path or _WORDS_FILE}: words before the first [class] header")
        else:
            current.extend(line.split())
    return {k: tuple(dict.fromkeys(v)) for k, v in classes.items()}


def vocabulary() -> set[str]:
    """All words the generator can use."""
    return {w for words in load_lexicon().values() for w in words}


def _noun_phrase(rng: np.random.Generator, lex) -> list[str]:
    det = str(rng.choice(lex["det"]))
    words = [str(rng.choice(lex["adj"]))] if rng.random() < 0.5 else []
    words.append(str(rng.choice(lex["noun"])))
    if det == "a" and words[0][0] in "aeiou":
        det = "an"
    return [det, *words]


def _clause(rng: np.random.Generator, lex) -> list[str]:
    words: list[str] = []
    if rng.random() < 0.1:
        words.append(str(rng.choice(lex["adv"])))
    words += [str(rng.choice(lex["pron"]))] if rng.random() < 0.3 else _noun_phrase(rng, lex)
    words.append(str(rng.choice(lex["modal"])))
    if rng.random() < 0.2:
        words.append(str(rng.choice(lex["neg"])))
    words.append(str(rng.choice(lex["verb"])))
    words += _noun_phrase(rng, lex)
    if rng.random() < 0.4:
        words += [str(rng.choice(lex["prep"])), *_noun_phrase(rng, lex)]
    if rng.random() < 0.3:
        words.append(str(rng.choice(lex["adv"])))
    return words


def make_sentence(rng: np.random.Generator, target_words: int) -> str:
    """A template sentence of about ``target_words`` words (a noun phrase when ≤ 3)."""
    lex = load_lexicon()
    if target_words <= 3:
        return " ".join(_noun_phrase(rng, lex))
    words = _clause(rng, lex)
    while len(words) < target_words - 2:
        words += [str(rng.choice(lex["conj"])), *_clause(rng, lex)]
    return " ".join(words)


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
        raw = es.synthesize(text, voice, rate=rate, pitch=pitch, pitch_range=prange).astype(np.float32) / 32768.0
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
    phonemes = " | ".join(" ".join(w) for w in es.phonemize(text, voice))
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


MARKER = ".complete"  # the Makefile's `make data` target depends on this file


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
    marker = out / MARKER
    if marker.is_file() and not force:
        try:
            done = json.loads(marker.read_text())
        except json.JSONDecodeError:
            done = None
        if done == settings and all((out / f"{s}.jsonl").is_file() for s in SPLITS):
            print(f"synthetic corpus in {out} is complete ({counts}, seed {seed}); nothing to do")
            return False
        print(f"synthetic corpus in {out} was built with other settings; rebuilding")
    marker.unlink(missing_ok=True)
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
    marker.write_text(json.dumps(settings, indent=1) + "\n")
    print(f"synthesised {len(jobs)} utterances ({counts}) into {out} in {time.time() - t0:.1f} s "
          f"with {workers} worker(s)")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fastasr.data.synthetic", description=__doc__.split("\n\n")[0])
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
