"""Connected-digit strings from recorded human speech (AudioMNIST or FSDD) → train/dev/test manifests.

    fastasr-corpus digits SRC OUT [--sample-rate R] [--seed 0] [--split speakers|recordings]
        [--train N --dev N --test N] [--dev-speakers K|a,b --test-speakers K|c] [--force]

``SRC`` is a local copy of AudioMNIST or of the Free Spoken Digit Dataset (layout detected,
see ``digit_sources.py``). Each utterance joins 3–9 random recordings of **one** speaker
into a digit string: every recording is trimmed of leading/trailing silence by frame
energy (10 ms frames below -35 dB of the recording's loudest frame), and the digits are
separated by pauses of 50–250 ms, with 100–300 ms before and after, holding a little
white noise (-60 to -50 dBFS). ``text`` is the digit words (``three one four``);
``speaker`` the source speaker. Recordings are drawn with replacement, so a string can
reuse them.

Two ways to split (``--split``); no recording is ever in two splits:

* ``speakers`` (AudioMNIST's default): **speaker-disjoint**. ``--test-speakers`` /
  ``--dev-speakers`` speakers (a count, drawn with the seed, or comma-separated names) and
  the rest train. AudioMNIST (60 speakers): 48/6/6.
* ``recordings`` (FSDD's default): every speaker in every split, each recording in one:
  recordings ``0``–``4`` of each speaker and digit are test (FSDD's official test set),
  ``5``–``9`` dev, the rest train. With FSDD's six speakers a speaker-disjoint split leaves
  one speaker for test and four to learn from; ``--split speakers`` builds it (4/1/1).

Strings: FSDD 2000/200/200, AudioMNIST 6000/600/600 by default; they rotate over a split's
speakers.

Output: ``OUT/{train,dev,test}.jsonl`` and ``OUT/wav/<split>/*.wav`` (16-bit PCM at the
source rate, or ``--sample-rate``, resampled by torchaudio). Deterministic for a seed and
idempotent: a second run with the same settings finds ``OUT/.complete`` and does nothing.
Unreadable or silent recordings are counted, reported and skipped.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import soundfile as sf

from fastasr.corpora import command
from fastasr.corpora.digit_sources import DigitSource, find_source, recording_index
from fastasr.corpora.marker import mark_complete, needs_build
from fastasr.corpora.paths import CorpusLayoutError
from fastasr.corpora.skipped import Skipped
from fastasr.data.audio import resample, write_wav
from fastasr.data.manifest import write_manifest

log = logging.getLogger(__name__)

GENERATOR_VERSION = 2  # bump when the output for given settings changes
SPLITS = ("train", "dev", "test")
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SPLIT_MODES = ("speakers", "recordings")
DEFAULTS = {  # corpus → split mode, speakers (dev, test) when by speaker, strings (train, dev, test)
    "fsdd": ("recordings", (1, 1), (2000, 200, 200)),
    "audiomnist": ("speakers", (6, 6), (6000, 600, 600)),
}
RECORDING_SPLITS = {"test": range(0, 5), "dev": range(5, 10)}  # recording indices; the rest train
LENGTH = (3, 9)            # digits per string
PAUSE_S = (0.05, 0.25)     # between digits
EDGE_S = (0.10, 0.30)      # before the first and after the last digit
NOISE_DBFS = (-60.0, -50.0)
TRIM_DB = 35.0             # frames this far below the loudest frame are silence
FRAME_S = 0.010


def trim_silence(wav: np.ndarray, rate: int) -> np.ndarray:
    """``wav`` ``(T,)`` without leading/trailing frames quieter than ``TRIM_DB`` below its
    loudest 10 ms frame (one frame of margin kept); empty if the recording is silent."""
    frame = max(1, int(FRAME_S * rate))
    n = wav.shape[0] // frame
    if n == 0:
        return wav[:0]
    rms = np.sqrt(np.mean(wav[: n * frame].reshape(n, frame).astype(np.float64) ** 2, axis=1))
    peak = rms.max()
    if peak < 1e-5:
        return wav[:0]
    loud = np.flatnonzero(rms >= peak * 10 ** (-TRIM_DB / 20))
    start, end = max(loud[0] - 1, 0) * frame, min(loud[-1] + 2, n) * frame
    return wav[start:end]


def in_split(index: int, split: str) -> bool:
    """Whether recording number ``index`` belongs to ``split`` when splitting by recording."""
    if split == "train":
        return not any(index in r for r in RECORDING_SPLITS.values())
    return index in RECORDING_SPLITS[split]


def load_speaker(source: DigitSource, speaker: str, sample_rate: int | None, skipped: Skipped,
                 split: str | None = None) -> tuple[dict[int, list[np.ndarray]], dict[int, list[str]], int]:
    """Trimmed float32 recordings of one speaker by digit, their file names, and the rate;
    with ``split``, only that split's recordings (``in_split``)."""
    import torch

    audio: dict[int, list[np.ndarray]] = {}
    names: dict[int, list[str]] = {}
    out_rate = sample_rate
    for digit, paths in sorted(source.files[speaker].items()):
        for path in paths:
            if split is not None and not in_split(recording_index(path), split):
                continue
            try:
                wav, rate = sf.read(str(path), dtype="float32", always_2d=True)
            except Exception as e:  # soundfile's errors differ between versions
                skipped.add(str(path), "unreadable audio", str(e).strip())
                continue
            wav = trim_silence(wav.mean(axis=1), rate)
            if wav.shape[0] == 0:
                skipped.add(str(path), "empty or silent recording")
                continue
            out_rate = out_rate or rate
            if rate != out_rate:
                wav = resample(torch.from_numpy(wav), rate, out_rate).numpy()
            audio.setdefault(digit, []).append(wav)
            names.setdefault(digit, []).append(path.name)
    absent = [d for d in range(10) if not audio.get(d)]
    if absent:
        where = "" if split is None else f" among its {split} recordings"
        raise CorpusLayoutError(f"{source.root}: speaker {speaker} has no usable recording of digit(s) {absent}"
                                f"{where} ({skipped.summary()})")
    return audio, names, int(out_rate)


def split_speakers(speakers: Sequence[str], dev: int | Sequence[str], test: int | Sequence[str],
                   seed: int) -> dict[str, list[str]]:
    """Speaker-disjoint splits: named speakers, or counts drawn with ``seed``; the rest train."""
    wanted = {"test": test, "dev": dev}
    chosen: dict[str, list[str]] = {}
    for split, want in wanted.items():  # named speakers first, so that counts draw around them
        if not isinstance(want, int):
            unknown = sorted(set(want) - set(speakers))
            if unknown:
                raise ValueError(f"--{split}-speakers {unknown}: not speakers of this corpus; expected some of "
                                 f"{sorted(speakers)}")
            chosen[split] = sorted(want)
    if set(chosen.get("dev", ())) & set(chosen.get("test", ())):
        raise ValueError(f"dev and test speakers overlap: {sorted(set(chosen['dev']) & set(chosen['test']))}")
    shuffled = [str(s) for s in np.random.default_rng([seed, 7]).permutation(sorted(speakers))]
    for split, want in wanted.items():
        if isinstance(want, int):
            taken = {s for v in chosen.values() for s in v}
            chosen[split] = sorted([s for s in shuffled if s not in taken][:want])
    taken = {s for v in chosen.values() for s in v}
    chosen["train"] = sorted(s for s in speakers if s not in taken)
    for split in SPLITS:
        if not chosen[split]:
            raise ValueError(f"no {split} speaker left ({len(speakers)} speakers: {sorted(speakers)}); "
                             "choose fewer dev/test speakers")
    return {s: chosen[s] for s in SPLITS}


def compose(rng: np.random.Generator, audio: dict[int, list[np.ndarray]], names: dict[int, list[str]],
            rate: int) -> tuple[np.ndarray, list[int], list[str]]:
    """One connected-digit string: ``(samples (T,), digits, source file names)``."""
    digits = [int(d) for d in rng.integers(0, 10, int(rng.integers(LENGTH[0], LENGTH[1] + 1)))]
    noise_rms = 10 ** (rng.uniform(*NOISE_DBFS) / 20)

    def gap(bounds) -> np.ndarray:
        return rng.standard_normal(int(rng.uniform(*bounds) * rate)).astype(np.float32) * noise_rms

    pieces, sources = [gap(EDGE_S)], []
    for i, d in enumerate(digits):
        k = int(rng.integers(len(audio[d])))
        pieces.append(audio[d][k])
        sources.append(names[d][k])
        pieces.append(gap(EDGE_S if i == len(digits) - 1 else PAUSE_S))
    wav = np.concatenate(pieces)
    peak = np.abs(wav).max()
    return (wav / peak * 0.99 if peak > 0.99 else wav), digits, sources


def build(src: str | Path, out: str | Path, sample_rate: int | None = None, seed: int = 0,
          counts: dict[str, int] | None = None, dev_speakers: int | Sequence[str] | None = None,
          test_speakers: int | Sequence[str] | None = None, force: bool = False, split: str | None = None) -> bool:
    """Build the corpus under ``out``; False (and nothing done) if it is already complete.
    ``split``: ``speakers`` or ``recordings`` (None: the corpus's default, ``DEFAULTS``)."""

    source = find_source(src)
    mode_default, (dev_default, test_default), count_default = DEFAULTS[source.corpus]
    mode = split or mode_default
    if mode not in SPLIT_MODES:
        raise ValueError(f"--split {mode!r}; expected one of {SPLIT_MODES}")
    counts = dict(zip(SPLITS, count_default)) | dict(counts or {})
    if mode == "speakers":
        splits = split_speakers(source.speakers, dev_default if dev_speakers is None else dev_speakers,
                                test_default if test_speakers is None else test_speakers, seed)
    elif dev_speakers is not None or test_speakers is not None:
        raise ValueError("--dev-speakers/--test-speakers need --split speakers (recordings puts every "
                         "speaker in every split)")
    else:
        splits = {s: source.speakers for s in SPLITS}
    settings = {"generator_version": GENERATOR_VERSION, "corpus": source.corpus, "files": source.num_files,
                "seed": seed, "counts": counts, "split": mode, "speakers": splits, "sample_rate": sample_rate}
    out = Path(out)
    if not needs_build(out, settings, [f"{s}.jsonl" for s in SPLITS], force, "digits corpus"):
        return False
    t0 = time.time()
    skipped = Skipped("recording")
    records: dict[str, list[dict]] = {}
    for split_index, split in enumerate(SPLITS):
        shutil.rmtree(out / "wav" / split, ignore_errors=True)
        (out / "wav" / split).mkdir(parents=True)
        speakers = splits[split]
        records[split] = [None] * counts[split]
        for s_index, speaker in enumerate(speakers):
            audio, names, rate = load_speaker(source, speaker, sample_rate, skipped,
                                              split if mode == "recordings" else None)
            for i in range(s_index, counts[split], len(speakers)):
                rng = np.random.default_rng([seed, split_index, i])
                wav, digits, sources = compose(rng, audio, names, rate)
                rel = Path("wav") / split / f"{split}_{i:05d}.wav"
                write_wav(out / rel, wav, rate)
                records[split][i] = {
                    "audio_filepath": rel.as_posix(), "duration": round(wav.shape[0] / rate, 6),
                    "text": " ".join(DIGIT_WORDS[d] for d in digits), "speaker": speaker,
                    "digits": "".join(map(str, digits)), "sources": sources,
                }
        write_manifest(out / f"{split}.jsonl", records[split])
    mark_complete(out, settings)
    for split in SPLITS:
        hours = sum(r["duration"] for r in records[split]) / 3600
        print(f"{split}: {counts[split]} strings, {hours:.2f} h, speakers {', '.join(splits[split])}")
    print(f"built {source.corpus} connected digits (split by {mode}) from {source.num_files} recordings into {out} "
          f"in {time.time() - t0:.1f} s; {skipped.summary()}")
    return True


def _speakers_arg(value: str) -> int | list[str]:
    return int(value) if value.isdigit() else [s.strip().lower() for s in value.split(",") if s.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    p = command.parser("digits", __doc__, "local copy of AudioMNIST or FSDD", "output directory (manifests + wav/)")
    p.add_argument("--sample-rate", type=int, help="output rate in Hz (default: the source's)")
    p.add_argument("--seed", type=int, default=0, help="same seed → same corpus")
    p.add_argument("--split", choices=SPLIT_MODES,
                   help="speakers: speaker-disjoint splits; recordings: every speaker everywhere, recordings 0-4 "
                        "test, 5-9 dev (default: AudioMNIST speakers, FSDD recordings)")
    for split in SPLITS:
        p.add_argument(f"--{split}", type=int, help=f"{split} strings (default: per corpus)")
    p.add_argument("--dev-speakers", type=_speakers_arg, help="dev speakers: a count or comma-separated names")
    p.add_argument("--test-speakers", type=_speakers_arg, help="test speakers: a count or comma-separated names")
    p.add_argument("--force", action="store_true", help="rebuild even if complete")

    def run(args):
        counts = {s: getattr(args, s) for s in SPLITS if getattr(args, s) is not None}
        for split, n in counts.items():
            if n < 1:
                raise ValueError(f"--{split} {n}; expected ≥ 1")
        build(args.src, args.out, args.sample_rate, args.seed, counts, args.dev_speakers, args.test_speakers,
              args.force, args.split)

    return command.run(p, argv, run)
