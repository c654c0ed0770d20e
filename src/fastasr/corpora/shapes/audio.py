"""The shapes that make new audio from a corpus's utterances (``fastasr-corpus shapes``):
``long`` (one speaker's consecutive utterances joined) and ``noisy`` (coloured noise and babble
of the same split). Their descriptions: :mod:`fastasr.corpora.shapes`."""

from __future__ import annotations

import logging
import random
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from fastasr.corpora.join import join_audio, joined_record
from fastasr.corpora.shapes.source import (
    SPLITS,
    draw_rng,
    wav_path,
)
from fastasr.corpora.speaking import colored_noise
from fastasr.data.audio import BadAudioError, file_sample_rate, load_audio, write_wav
from fastasr.data.augment import mix_at_snr

log = logging.getLogger(__name__)

COLOURS = ("pink", "brown")
PEAK = 0.99  # a noisy mix is scaled down whole so that its peak stays below this


# ------------------------------------------------------------------ long


def plan_long(durations: Sequence[float], speakers: Sequence[str | None], min_seconds: float,
              max_seconds: float, pause_s: tuple[float, float], rng: random.Random
              ) -> tuple[list[tuple[list[int], list[float]]], list[tuple[int, str]]]:
    """Joins of consecutive utterances of one speaker (manifest order within each speaker).

    Each join draws a target uniformly in ``[min_seconds, max_seconds]`` and takes the
    speaker's next utterances, with a pause drawn from ``pause_s`` between two, until it
    reaches the target or the next would pass ``max_seconds``. Returns ``(joins, dropped)``:
    each join as (utterance indices, pauses), each dropped utterance as (index, reason):
    longer than ``max_seconds`` alone, or in a join that stays below ``min_seconds``."""
    if not 0 < min_seconds <= max_seconds:
        raise ValueError(f"--min-seconds {min_seconds}, --max-seconds {max_seconds}; expected 0 < min <= max")
    lo, hi = pause_s
    if not 0 <= lo <= hi:
        raise ValueError(f"--pause-s {lo} {hi}; expected 0 <= low <= high")
    by_speaker: dict[str | None, list[int]] = defaultdict(list)
    for i, s in enumerate(speakers):
        by_speaker[s].append(i)
    joins: list[tuple[list[int], list[float]]] = []
    dropped: list[tuple[int, str]] = []
    for s in sorted(by_speaker, key=lambda x: "" if x is None else str(x)):
        run = by_speaker[s]
        k = 0
        while k < len(run):
            first = run[k]
            k += 1
            if durations[first] > max_seconds:
                dropped.append((first, f"longer than --max-seconds {max_seconds:g} alone"))
                continue
            target = rng.uniform(min_seconds, max_seconds)
            picked, pauses, total = [first], [], durations[first]
            while total < target and k < len(run):
                pause = rng.uniform(lo, hi)
                if total + pause + durations[run[k]] > max_seconds:
                    break
                picked.append(run[k])
                pauses.append(pause)
                total += pause + durations[run[k]]
                k += 1
            if total < min_seconds:
                dropped += [(i, f"left over (its join stays below --min-seconds {min_seconds:g})") for i in picked]
            else:
                joins.append((picked, pauses))
    return joins, dropped


def build_long(corpus, out, seed, skipped, *, min_seconds=15.0, max_seconds=35.0, pause_s=(0.2, 0.6)):

    records: dict[str, list[dict]] = {}
    for split in SPLITS:
        utts = corpus[split]
        joins, dropped = plan_long([u.duration for u in utts], [u.speaker for u in utts], min_seconds,
                                   max_seconds, tuple(pause_s), random.Random(f"{seed}|long|{split}"))
        for i, reason in dropped:
            skipped[split].add(utts[i].id, reason)
        records[split] = []
        for n, (picked, pauses) in enumerate(joins):
            parts = [utts[i] for i in picked]
            try:
                wav, rate, placed = join_audio(parts, pauses)
            except BadAudioError as err:
                skipped[split].add(err.path, "unusable audio", err.reason)
                continue
            utt_id = f"{parts[0].id}-long{len(parts)}"
            path = wav_path(out, split, utt_id).resolve()
            write_wav(path, wav, rate)
            record = {"id": utt_id, **joined_record(placed, path, wav.shape[0] / rate)}
            if parts[0].speaker is not None:
                record["speaker"] = parts[0].speaker  # one speaker: not "a+a+a"
            records[split].append(record)
            if (n + 1) % 100 == 0:
                log.info("long %s: %d / %d joins", split, n + 1, len(joins))
    return records


# ------------------------------------------------------------------ noisy


def _looped(wav: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` samples of ``wav`` from a random offset, looped when short."""
    start = int(rng.integers(0, wav.shape[0]))
    reps = -(-(start + n) // wav.shape[0])
    return np.tile(wav, reps)[start:start + n]


def _unit_power(x: np.ndarray) -> np.ndarray:
    p = float(np.mean(x.astype(np.float64) ** 2))
    return x / np.sqrt(p) if p > 0 else x


def add_noise(speech: np.ndarray, snr_db: float, coloured: np.ndarray, babble: np.ndarray | None,
              babble_share: float) -> tuple[np.ndarray, float]:
    """``speech (T,)`` plus noise at ``snr_db`` (mean-square powers over the whole utterance).

    The noise is ``√(1-b)·coloured + √b·babble`` (each brought to unit power; ``b`` =
    ``babble_share``, 0 without babble), scaled by ``fastasr.data.augment.mix_at_snr``. A mix
    whose peak passes ``PEAK`` is scaled down whole (speech and noise alike, so the SNR holds).
    Returns ``(mix float32, the scale applied)``."""
    import torch


    noise = np.sqrt(1.0 - babble_share) * _unit_power(coloured)
    if babble is not None:
        noise = noise + np.sqrt(babble_share) * _unit_power(babble)
    mix = mix_at_snr(torch.from_numpy(speech.astype(np.float32)), torch.from_numpy(noise.astype(np.float32)),
                     snr_db).numpy()
    peak = float(np.max(np.abs(mix))) if mix.size else 0.0
    scale = PEAK / peak if peak > PEAK else 1.0
    return (mix * scale).astype(np.float32), scale


def build_noisy(corpus, out, seed, skipped, *, snr_db=(5.0, 15.0), babble_talkers=3):

    lo, hi = snr_db
    if not lo <= hi:
        raise ValueError(f"--snr-db {lo} {hi}; expected low <= high")
    if babble_talkers < 0:
        raise ValueError(f"--babble-talkers {babble_talkers}; expected >= 0")
    records: dict[str, list[dict]] = {}
    for split in SPLITS:
        utts = corpus[split]
        records[split] = []
        for n, utt in enumerate(utts):
            rng = draw_rng(seed, "noisy", split, utt.id)
            try:
                rate = file_sample_rate(utt.audio_filepath)
                speech = load_audio(utt.audio_filepath, expected_seconds=utt.duration).numpy()
            except BadAudioError as err:
                skipped[split].add(err.path, "unusable audio", err.reason)
                continue
            if not np.any(speech):
                skipped[split].add(utt.id, "silent audio (no SNR to set)")
                continue
            others = [i for i, u in enumerate(utts) if u.id != utt.id
                      and (u.speaker is None or u.speaker != utt.speaker)]
            if not others:  # one speaker in the split: any other utterance
                others = [i for i, u in enumerate(utts) if u.id != utt.id]
            picked = sorted(rng.choice(others, size=min(babble_talkers, len(others)), replace=False).tolist()) \
                if others and babble_talkers else []
            talkers, ids = [], []
            for i in picked:
                try:
                    talkers.append(_unit_power(_looped(load_audio(utts[i].audio_filepath, rate).numpy(),
                                                       speech.shape[0], rng)))
                    ids.append(utts[i].id)
                except BadAudioError as err:
                    log.warning("noisy %s: babble from %s left out: %s", split, utts[i].id, err.reason)
            babble = np.sum(talkers, axis=0) if talkers else None
            share = float(rng.uniform(0.0, 1.0)) if babble is not None else 0.0
            colour = str(rng.choice(COLOURS))
            coloured = colored_noise(rng, colour, speech.shape[0])
            snr = float(rng.uniform(lo, hi))
            mix, _ = add_noise(speech, snr, coloured, babble, share)
            path = wav_path(out, split, utt.id).resolve()
            write_wav(path, mix, rate)
            records[split].append({**utt.record(), "audio_filepath": str(path), "snr_db": round(snr, 3),
                                   "noise": {"colour": colour, "babble_share": round(share, 3), "babble": ids}})
            if (n + 1) % 200 == 0:
                log.info("noisy %s: %d / %d", split, n + 1, len(utts))
    return records
