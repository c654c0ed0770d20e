"""Joined utterances: a manifest's utterances joined with pauses into longer ones, voices mixed.

    fastasr-corpus join data/synthetic/train.jsonl data/synthetic_joined \\
        [--count 500] [--min-seconds 10 --max-seconds 30] [--pause-s 0.2 1.0] [--seed 0] [--force]

A model trained on single utterances meets, in a long recording, what it never saw in training:
one voice giving way to another after a pause. Its attention then pools the voice of the whole
context (docs/TRANSCRIBE.md). Training on utterances joined across speakers shows it that. This
builder works on any manifest (any corpus, any language):

* each joined utterance draws its duration uniformly from ``[min, max]`` seconds, then draws
  utterances at random until the next would pass ``max`` (the first is always taken);
* with ``speaker`` fields, consecutive utterances are of different speakers (mixed voices), when
  the manifest has more than one; without them, utterances are drawn regardless;
* a pause drawn uniformly from ``--pause-s`` lies between two utterances (digital silence, as
  between the utterances of a long recording);
* ``text`` is the utterances' texts joined by spaces, ``phonemes`` (when every part has them)
  joined by `` | ``, the word boundary; ``speaker`` lists the parts' speakers joined by ``+``,
  and ``parts`` their ids.

``OUT/train.jsonl`` holds the source manifest's utterances (absolute paths) followed by the joined
ones (``OUT/wav/joined-NNNNN.wav``), so ``data.train_manifest=OUT/train.jsonl`` trains on both;
``OUT/joined.jsonl`` holds the joined ones alone. Deterministic for a seed; a completion marker
makes a second run with the same settings a no-op. :func:`join_audio` is also how the
long-recording benchmark builds its test recordings.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fastasr.corpora import marker
from fastasr.corpora.command import run, write_split
from fastasr.corpora.skipped import Skipped
from fastasr.data.audio import file_sample_rate, load_audio, write_wav
from fastasr.data.manifest import read_manifest

__all__ = ["join_audio", "joined_record", "draw_joins", "build_joined_corpus", "main"]


def join_audio(utterances: Sequence, pauses_s: Sequence[float], sample_rate: int | None = None
               ) -> tuple[np.ndarray, int, list[dict]]:
    """The utterances' audio joined with ``pauses_s[i]`` seconds of silence after the i-th
    (``len(utterances) - 1`` pauses), at ``sample_rate`` (None: the first file's rate).

    Returns ``(waveform float32, sample_rate, parts)``: each part is the utterance's manifest
    fields (``id``, ``audio_filepath``, ``duration``, ``text``, ``phonemes``, ``speaker``; None
    dropped) with its ``start`` and ``end`` in the joined audio (seconds)."""

    if not utterances:
        raise ValueError("join_audio: no utterances to join")
    if len(pauses_s) != len(utterances) - 1:
        raise ValueError(f"join_audio: {len(utterances)} utterances need {len(utterances) - 1} pauses, "
                         f"got {len(pauses_s)}")
    rate = sample_rate or file_sample_rate(utterances[0].audio_filepath)
    pieces: list[np.ndarray] = []
    parts: list[dict] = []
    total = 0
    for i, utt in enumerate(utterances):
        if i:
            pause = np.zeros(int(round(pauses_s[i - 1] * rate)), dtype=np.float32)
            pieces.append(pause)
            total += pause.shape[0]
        wav = load_audio(utt.audio_filepath, rate).numpy().astype(np.float32, copy=False)
        parts.append({**utt.record(), "start": round(total / rate, 4), "end": round((total + wav.shape[0]) / rate, 4)})
        pieces.append(wav)
        total += wav.shape[0]
    return np.concatenate(pieces), rate, parts


def joined_record(parts: Sequence[dict], audio_filepath: str | Path, duration: float) -> dict:
    """The manifest line of joined ``parts`` (:func:`join_audio`): texts joined by spaces,
    phonemes by `` | `` (only when every part has them), speakers by ``+``, the parts' ids."""
    record = {"audio_filepath": str(audio_filepath), "duration": round(duration, 4),
              "text": " ".join(p["text"] for p in parts)}
    if all(p.get("phonemes") for p in parts):
        record["phonemes"] = " | ".join(p["phonemes"] for p in parts)
    if all(p.get("speaker") for p in parts):
        record["speaker"] = "+".join(p["speaker"] for p in parts)
    record["parts"] = [p["id"] for p in parts]
    return record


def draw_joins(utterances: Sequence, count: int, min_seconds: float, max_seconds: float,
               pause_s: tuple[float, float], seed: int = 0) -> list[tuple[list[int], list[float]]]:
    """``count`` joins of ``utterances``: for each, the indices of its utterances and the pauses
    between them (see the module docstring for the rules). Deterministic for ``seed``."""
    if not utterances:
        raise ValueError("no utterances to join")
    if not 0 < min_seconds <= max_seconds:
        raise ValueError(f"--min-seconds {min_seconds}, --max-seconds {max_seconds}; expected 0 < min <= max")
    lo, hi = pause_s
    if not 0 <= lo <= hi:
        raise ValueError(f"--pause-s {lo} {hi}; expected 0 <= low <= high")
    rng = random.Random(seed)
    speakers = [u.speaker for u in utterances]
    mixed = all(s is not None for s in speakers) and len(set(speakers)) > 1
    joins = []
    for _ in range(count):
        target = rng.uniform(min_seconds, max_seconds)
        picked: list[int] = []
        pauses: list[float] = []
        total = 0.0
        while total < target:
            i = rng.randrange(len(utterances))
            while mixed and picked and speakers[i] == speakers[picked[-1]]:
                i = rng.randrange(len(utterances))
            pause = rng.uniform(lo, hi) if picked else 0.0
            if picked and total + pause + utterances[i].duration > max_seconds:
                break
            if picked:
                pauses.append(pause)
            picked.append(i)
            total += pause + utterances[i].duration
        joins.append((picked, pauses))
    return joins


def build_joined_corpus(manifest: str | Path, out: str | Path, count: int = 500, min_seconds: float = 10.0,
                        max_seconds: float = 30.0, pause_s: tuple[float, float] = (0.2, 1.0), seed: int = 0,
                        force: bool = False) -> Path:
    """Write ``OUT/wav/joined-NNNNN.wav``, ``OUT/joined.jsonl`` and ``OUT/train.jsonl`` (the
    source's utterances, then the joined ones); returns ``OUT/train.jsonl``. Raises
    ``ValueError`` for bad settings or a manifest without usable utterances."""

    out = Path(out)
    settings = {"manifest": str(Path(manifest).resolve()), "count": count, "min_seconds": min_seconds,
                "max_seconds": max_seconds, "pause_s": list(pause_s), "seed": seed}
    if not marker.needs_build(out, settings, ("train.jsonl", "joined.jsonl"), force, "the joined corpus"):
        return out / "train.jsonl"
    if count < 1:
        raise ValueError(f"--count {count}; expected >= 1")
    utterances = read_manifest(manifest)
    if not utterances:
        raise ValueError(f"{manifest}: no usable utterance to join")
    (out / "wav").mkdir(parents=True, exist_ok=True)
    joined = []
    for n, (picked, pauses) in enumerate(draw_joins(utterances, count, min_seconds, max_seconds, pause_s, seed)):
        wav, rate, parts = join_audio([utterances[i] for i in picked], pauses)
        path = (out / "wav" / f"joined-{n:05d}.wav").resolve()
        write_wav(path, wav, rate)
        joined.append({"id": f"joined-{n:05d}", **joined_record(parts, path, wav.shape[0] / rate)})
    skipped = Skipped()
    write_split(out, "joined", joined, skipped, manifest)
    train = write_split(out, "train", [u.record() for u in utterances] + joined, skipped, manifest)
    marker.mark_complete(out, settings)
    return train


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fastasr-corpus join", description=__doc__.split("\n")[0])
    p.add_argument("manifest", help="the manifest whose utterances are joined (JSON lines)")
    p.add_argument("out", help="output directory: train.jsonl (source + joined), joined.jsonl, wav/")
    p.add_argument("--count", type=int, default=500, help="joined utterances to make")
    p.add_argument("--min-seconds", type=float, default=10.0, help="shortest target duration (s)")
    p.add_argument("--max-seconds", type=float, default=30.0, help="longest duration (s)")
    p.add_argument("--pause-s", type=float, nargs=2, default=(0.2, 1.0), metavar=("LOW", "HIGH"),
                   help="pause between two utterances, drawn uniformly (s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="rebuild even when complete")
    return run(p, argv, lambda a: build_joined_corpus(a.manifest, a.out, a.count, a.min_seconds, a.max_seconds,
                                                      tuple(a.pause_s), a.seed, a.force))
