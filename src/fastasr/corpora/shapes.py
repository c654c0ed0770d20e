"""Corpus shapes: a built corpus's train/dev/test manifests reshaped into another corpus.

    python -m fastasr.corpora.shapes SHAPE SRC OUT [options] [--seed 0] [--force]

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

Every shape is deterministic for ``--seed`` (draws are keyed by seed, split and utterance id)
and idempotent (``OUT/.complete`` holds the shape, its options and a hash of the source
manifests; a second run with the same ones does nothing, ``--force`` rebuilds). Bad source
lines (invalid JSON or fields, missing or unreadable audio, duplicate ids) and unusable audio
are reported and skipped with a count. Each split's line, then one summary line (utterances,
hours and speakers per split), is printed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import logging
import random
import shutil
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastasr.corpora import command
from fastasr.corpora.command import write_split
from fastasr.corpora.join import join_audio, joined_record
from fastasr.corpora.marker import mark_complete, needs_build
from fastasr.corpora.paths import CorpusLayoutError, require_dir
from fastasr.corpora.skipped import Skipped
from fastasr.corpora.speaking import colored_noise
from fastasr.data.audio import BadAudioError, file_sample_rate, load_audio, write_wav
from fastasr.data.augment import draw_seed, mix_at_snr
from fastasr.data.features import Fbank
from fastasr.data.manifest import Utterance, _check_line
from fastasr.data.tokenizer import UnknownUnitError, normalize_text
from fastasr.decoding import long_form
from fastasr.decoding.alignment import align_units, ctc_min_frames, word_frames

log = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")
SHAPE_VERSION = 1  # bump when a shape's output for given settings changes
LAYOUT = "a corpus directory holding train.jsonl, dev.jsonl and test.jsonl (manifests, docs/DATA.md)"
COLOURS = ("pink", "brown")
PEAK = 0.99  # a noisy mix is scaled down whole so that its peak stays below this

__all__ = ["SHAPES", "read_corpus", "proportional_order", "take_subset", "plan_long", "top_speakers",
           "add_noise", "plan_segments", "Segment", "align_words", "word_spans", "build_shape", "main"]


# ------------------------------------------------------------------ reading the source


def read_corpus(src: str | Path) -> tuple[dict[str, list[Utterance]], dict[str, Skipped]]:
    """The utterances of ``SRC/{train,dev,test}.jsonl``, each line validated as training does
    (``fastasr.data.manifest``: JSON, fields, duration, the audio file's header). A bad line,
    or a second line with an id already seen in that split, is reported and skipped (counted in
    that split's ``Skipped``). A missing manifest is a ``CorpusLayoutError`` naming it."""

    root = require_dir(src, LAYOUT)
    corpus: dict[str, list[Utterance]] = {}
    skipped: dict[str, Skipped] = {}
    for split in SPLITS:
        path = root / f"{split}.jsonl"
        if not path.is_file():
            raise CorpusLayoutError(f"{path}: no such manifest; expected {LAYOUT}")
        skipped[split] = Skipped("utterance")
        seen: set[str] = set()
        corpus[split] = []
        with open(path, encoding="utf-8") as f:
            for lineno, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                where = f"manifest {path} line {lineno}"
                try:
                    utt = _check_line(raw, path.parent, check_audio=True)
                except ValueError as err:
                    skipped[split].add(where, "bad manifest line", str(err))
                    continue
                if utt.id in seen:
                    skipped[split].add(where, "duplicate id", f"id {utt.id!r} already seen; expected unique ids")
                    continue
                seen.add(utt.id)
                corpus[split].append(utt)
    return corpus, skipped


def _source_hashes(src: Path) -> dict[str, str]:
    return {s: hashlib.sha256((src / f"{s}.jsonl").read_bytes()).hexdigest()[:16] for s in SPLITS}


def _rng(seed: int, *parts: object) -> np.random.Generator:

    return np.random.default_rng(draw_seed(seed, *parts))


def _wav_path(out: Path, split: str, utt_id: str) -> Path:
    return out / "wav" / split / (utt_id.replace("/", "_").replace("\\", "_") + ".wav")


# ------------------------------------------------------------------ tiny


def proportional_order(speakers: Sequence[str | None], seed: int = 0) -> list[int]:
    """Indices ``0..len(speakers)-1`` in an order whose every prefix holds each speaker in
    proportion to its share of ``speakers`` (systematic stratified sampling): each speaker's
    utterances are shuffled and its k-th of n gets the key ``(k + u) / n`` (``u`` a random
    offset per speaker in [0, 1)); the order sorts by key. ``None`` speakers are one group.
    Deterministic for ``seed``."""
    rng = random.Random(seed)
    groups: dict[str | None, list[int]] = defaultdict(list)
    for i, s in enumerate(speakers):
        groups[s].append(i)
    keyed: list[tuple[float, int]] = []
    for s in sorted(groups, key=lambda x: "" if x is None else str(x)):
        idx = groups[s][:]
        rng.shuffle(idx)
        offset = rng.random()
        keyed += [((k + offset) / len(idx), i) for k, i in enumerate(idx)]
    return [i for _, i in sorted(keyed)]


def take_subset(utts: Sequence[Utterance], max_utterances: int, max_seconds: float | None,
                seed: int = 0) -> list[Utterance]:
    """At most ``max_utterances`` of ``utts`` and at most ``max_seconds`` of audio (None: no
    limit): the longest prefix of :func:`proportional_order` within both, in source order."""
    picked: list[int] = []
    total = 0.0
    for i in proportional_order([u.speaker for u in utts], seed):
        if len(picked) >= max_utterances:
            break
        if max_seconds is not None and total + utts[i].duration > max_seconds:
            break
        picked.append(i)
        total += utts[i].duration
    return [utts[i] for i in sorted(picked)]


def _tiny(corpus, out, seed, skipped, *, utterances=1000, minutes=45.0, dev_utterances=200, test_utterances=200):
    limits = {"train": (utterances, minutes * 60), "dev": (dev_utterances, None), "test": (test_utterances, None)}
    for split, (n, _) in limits.items():
        if n < 1:
            raise ValueError(f"--{'' if split == 'train' else split + '-'}utterances {n}; expected >= 1")
    if minutes <= 0:
        raise ValueError(f"--minutes {minutes}; expected a positive number of minutes")
    return {split: [u.record() for u in take_subset(corpus[split], *limits[split], seed=seed)] for split in SPLITS}


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


def _long(corpus, out, seed, skipped, *, min_seconds=15.0, max_seconds=35.0, pause_s=(0.2, 0.6)):

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
            path = _wav_path(out, split, utt_id).resolve()
            write_wav(path, wav, rate)
            record = {"id": utt_id, **joined_record(placed, path, wav.shape[0] / rate)}
            if parts[0].speaker is not None:
                record["speaker"] = parts[0].speaker  # one speaker: not "a+a+a"
            records[split].append(record)
            if (n + 1) % 100 == 0:
                log.info("long %s: %d / %d joins", split, n + 1, len(joins))
    return records


# ------------------------------------------------------------------ resample


def _resample(corpus, out, seed, skipped, *, sample_rate=8000):

    if sample_rate < 1000:
        raise ValueError(f"--sample-rate {sample_rate}; expected a rate in Hz (>= 1000)")
    records: dict[str, list[dict]] = {}
    for split in SPLITS:
        records[split] = []
        for n, utt in enumerate(corpus[split]):
            try:
                wav = load_audio(utt.audio_filepath, sample_rate, expected_seconds=utt.duration)
            except BadAudioError as err:
                skipped[split].add(err.path, "unusable audio", err.reason)
                continue
            path = _wav_path(out, split, utt.id).resolve()
            write_wav(path, wav, sample_rate)
            records[split].append({**utt.record(), "audio_filepath": str(path),
                                   "duration": round(wav.shape[0] / sample_rate, 4)})
            if (n + 1) % 500 == 0:
                log.info("resample %s: %d / %d", split, n + 1, len(corpus[split]))
    return records


# ------------------------------------------------------------------ speakers


def top_speakers(utts: Sequence[Utterance], count: int) -> list[str]:
    """The ``count`` speakers with the most audio in ``utts`` (ties: by speaker id), sorted by id.
    A ``ValueError`` when fewer speakers exist."""
    seconds: Counter[str] = Counter()
    for u in utts:
        if u.speaker is not None:
            seconds[u.speaker] += u.duration
    if count < 1 or count > len(seconds):
        raise ValueError(f"--count {count}; expected 1 to {len(seconds)} (the training speakers in the source)")
    ranked = sorted(seconds, key=lambda s: (-seconds[s], s))
    return sorted(ranked[:count])


def _speakers(corpus, out, seed, skipped, *, count=5):
    train = []
    for u in corpus["train"]:
        if u.speaker is None:
            skipped["train"].add(u.id, "no speaker field")
        else:
            train.append(u)
    if not train:
        raise CorpusLayoutError("the source's train.jsonl has no utterance with a 'speaker' field; "
                                "expected speaker ids to choose from")
    keep = set(top_speakers(train, count))
    return {"train": [u.record() for u in train if u.speaker in keep],
            "dev": [u.record() for u in corpus["dev"]], "test": [u.record() for u in corpus["test"]]}


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


def _noisy(corpus, out, seed, skipped, *, snr_db=(5.0, 15.0), babble_talkers=3):

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
            rng = _rng(seed, "noisy", split, utt.id)
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
            path = _wav_path(out, split, utt.id).resolve()
            write_wav(path, mix, rate)
            records[split].append({**utt.record(), "audio_filepath": str(path), "snr_db": round(snr, 3),
                                   "noise": {"colour": colour, "babble_share": round(share, 3), "babble": ids}})
            if (n + 1) % 200 == 0:
                log.info("noisy %s: %d / %d", split, n + 1, len(utts))
    return records


# ------------------------------------------------------------------ short


@dataclass(frozen=True)
class Segment:
    """Words ``[first, end)`` of an utterance, cut from ``start`` to ``stop`` seconds."""

    first: int
    end: int
    start: float
    stop: float

    @property
    def duration(self) -> float:
        return self.stop - self.start


def plan_segments(spans: Sequence[tuple[int, int]], frame_seconds: float, duration: float,
                  min_seconds: float = 1.0, max_seconds: float = 4.0, rng: random.Random | None = None
                  ) -> tuple[list[Segment], Counter[str]]:
    """Cut an utterance into segments of ``min_seconds``-``max_seconds`` at word boundaries.

    Args:
        spans: each word's ``[first, last + 1)`` output frames, in order (``(words, 2)``).
        frame_seconds: seconds per output frame (subsampling × the features' frame shift).
        duration: the utterance's seconds (the last segment ends there; the first starts at 0).
        rng: draws each segment's target length uniformly in the range (None: ``Random(0)``).

    The cut between words ``k-1`` and ``k`` lies in the middle of the gap between the first's
    last frame and the second's first: ``(spans[k-1][1] + spans[k][0]) / 2 × frame_seconds``.
    A segment takes words until it reaches its target or the next word would pass
    ``max_seconds``. One shorter than ``min_seconds`` is merged into the previous segment when
    that one ends where it begins and the merge fits (``regrouped``), else dropped
    (``dropped short``); a single word longer than ``max_seconds`` is dropped (``dropped long``).

    Returns ``(segments, counts)``; ``counts`` has ``kept``, ``regrouped``, ``dropped short``,
    ``dropped long`` (segments or words, as named)."""
    if not 0 < min_seconds <= max_seconds:
        raise ValueError(f"--min-seconds {min_seconds}, --max-seconds {max_seconds}; expected 0 < min <= max")
    rng = rng or random.Random(0)
    n = len(spans)
    bounds = [0.0]
    for (_, end), (start, _) in zip(spans, spans[1:]):
        bounds.append(min(max((end + start) / 2 * frame_seconds, bounds[-1]), duration))
    bounds.append(duration)
    segments: list[Segment] = []
    counts: Counter[str] = Counter()
    i = 0
    while i < n:
        if bounds[i + 1] - bounds[i] > max_seconds:
            counts["dropped long"] += 1
            i += 1
            continue
        target = rng.uniform(min_seconds, max_seconds)
        j = i + 1
        while j < n and bounds[j] - bounds[i] < target and bounds[j + 1] - bounds[i] <= max_seconds:
            j += 1
        if bounds[j] - bounds[i] >= min_seconds:
            segments.append(Segment(i, j, bounds[i], bounds[j]))
        elif segments and segments[-1].end == i and bounds[j] - segments[-1].start <= max_seconds:
            segments[-1] = Segment(segments[-1].first, j, segments[-1].start, bounds[j])
            counts["regrouped"] += 1
        else:
            counts["dropped short"] += 1
        i = j
    counts["kept"] = len(segments)
    return segments, counts


def align_words(log_probs: Any, tokenizer: Any, utt: Utterance) -> list[tuple[int, int]]:
    """Each word's ``[start, end)`` frames in ``log_probs (T, V)``: ``utt``'s transcript, spelt in
    ``tokenizer``'s units (``|`` between words), force-aligned by
    ``torchaudio.functional.forced_align`` (:func:`fastasr.decoding.alignment.align_units`).
    Raises ``ValueError`` naming the utterance when the transcript holds units the tokenizer
    lacks, or needs more CTC frames than ``T``."""

    try:
        ids = tokenizer.encode(utt)
    except UnknownUnitError as err:
        raise ValueError(f"transcript not encodable: {err}") from None
    if ctc_min_frames(ids) > log_probs.shape[0]:
        raise ValueError(f"too few frames: {log_probs.shape[0]} output frames for {ctc_min_frames(ids)} CTC units "
                         f"in utterance {utt.id!r}; expected at least as many frames")
    spans = align_units(log_probs, ids, blank=tokenizer.blank_id)
    if spans is None:
        raise ValueError(f"no alignment: no CTC path spells utterance {utt.id!r}'s transcript in its frames")
    return word_frames(tokenizer.units(utt), spans, tokenizer.word_boundary)


def word_spans(recogniser: Any, utt: Utterance, seed: int = 0) -> list[tuple[int, int]]:
    """Each word's ``[start, end)`` output frames in ``utt``: :func:`align_words` over the
    emissions (CTC log-probabilities, ``(T', V)``) of ``recogniser``
    (``fastasr.recognition.recogniser.load_recogniser``) for the utterance's audio, its filterbanks computed
    with the recogniser's feature settings. ``ValueError`` as :func:`align_words`;
    ``BadAudioError`` for unusable audio."""
    import torch


    features = Fbank(recogniser.features).from_file(utt.audio_filepath)
    torch.manual_seed(seed)  # randomised attentions hash the same way every run
    (log_probs,) = long_form.long_form_log_probs(recogniser.model, [features],
                                                 frame_shift_ms=recogniser.features.frame_shift_ms)
    return align_words(log_probs, recogniser.tokenizer, utt)


def _short(corpus, out, seed, skipped, *, align_ckpt, min_seconds=1.0, max_seconds=4.0):
    from fastasr.recognition.loading import load_recogniser  # only this shape aligns

    if not 0 < min_seconds <= max_seconds:
        raise ValueError(f"--min-seconds {min_seconds}, --max-seconds {max_seconds}; expected 0 < min <= max")
    recogniser = load_recogniser(align_ckpt)
    if recogniser.tokenizer.kind != "char":
        raise ValueError(f"--align-ckpt {align_ckpt}: a {recogniser.tokenizer.kind} model; expected one with "
                         "character units (tokenizer=char), whose transcripts spell the words")
    step = recogniser.frame_seconds
    log.info("short: aligning with %s (%s units, %.0f ms output frames)", align_ckpt, recogniser.tokenizer.kind,
             step * 1000)
    records: dict[str, list[dict]] = {}
    totals: Counter[str] = Counter()
    for split in SPLITS:
        records[split] = []
        for n, utt in enumerate(corpus[split]):
            try:
                spans = word_spans(recogniser, utt, seed)
                wav = load_audio(utt.audio_filepath).numpy()
            except BadAudioError as err:
                skipped[split].add(err.path, "unusable audio", err.reason)
                continue
            except ValueError as err:
                reason = str(err).split(":")[0]
                skipped[split].add(utt.id, f"not aligned ({reason})", str(err))
                continue
            rate = file_sample_rate(utt.audio_filepath)
            words = normalize_text(utt.text).split()
            phonemes = [p.strip() for p in utt.phonemes.split("|")] if utt.phonemes else None
            if phonemes is not None and len(phonemes) != len(words):
                phonemes = None  # word boundaries that do not match the words: left out
            segments, counts = plan_segments(spans, step, wav.shape[0] / rate, min_seconds, max_seconds,
                                             random.Random(f"{seed}|short|{split}|{utt.id}"))
            totals.update(counts)
            for k, seg in enumerate(segments):
                seg_id = f"{utt.id}-s{k:02d}"
                piece = wav[int(round(seg.start * rate)):int(round(seg.stop * rate))]
                path = _wav_path(out, split, seg_id).resolve()
                write_wav(path, piece, rate)
                record = {"id": seg_id, "audio_filepath": str(path), "duration": round(piece.shape[0] / rate, 4),
                          "text": " ".join(words[seg.first:seg.end])}
                if phonemes is not None:
                    record["phonemes"] = " | ".join(phonemes[seg.first:seg.end])
                if utt.speaker is not None:
                    record["speaker"] = utt.speaker
                record["source"] = {"id": utt.id, "start": round(seg.start, 4), "end": round(seg.stop, 4)}
                records[split].append(record)
            if (n + 1) % 100 == 0:
                log.info("short %s: %d / %d utterances", split, n + 1, len(corpus[split]))
    print(f"short: {totals['kept']} segments kept, of them {totals['regrouped']} with a short piece regrouped in; "
          f"dropped {totals['dropped short']} pieces shorter than {min_seconds:g} s and "
          f"{totals['dropped long']} words longer than {max_seconds:g} s")
    return records


# ------------------------------------------------------------------ the command


@dataclass(frozen=True)
class Shape:
    """A shape: what it does (one line), the function that builds it, whether it writes audio."""

    help: str
    build: Callable[..., dict[str, list[dict]]]
    writes_audio: bool


SHAPES: dict[str, Shape] = {
    "tiny": Shape("a small subset: <= N utterances and M minutes of train, <= 200 dev / test", _tiny, False),
    "long": Shape("15-35 s utterances joined from consecutive utterances of one speaker", _long, True),
    "resample": Shape("all audio resampled to --sample-rate (8 kHz)", _resample, True),
    "speakers": Shape("train of the K speakers with the most audio; dev / test unchanged", _speakers, False),
    "noisy": Shape("coloured noise + babble of the same split at a random SNR", _noisy, True),
    "short": Shape("1-4 s segments cut at force-aligned word boundaries", _short, True),
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
                "manifests": _source_hashes(src), "seed": seed, "options": opts}
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
    p = argparse.ArgumentParser(prog="python -m fastasr.corpora.shapes", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="shape", required=True, metavar="SHAPE",
                           help=" | ".join(SHAPES) + " (python -m fastasr.corpora.shapes SHAPE -h: its options)")
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
    return p


def main(argv: Sequence[str] | None = None) -> int:
    def build(a: argparse.Namespace) -> None:
        options = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(a).items()
                   if k not in ("shape", "src", "out", "seed", "force")}
        build_shape(a.shape, a.src, a.out, seed=a.seed, force=a.force, **options)

    return command.run(_parser(), argv, build)


if __name__ == "__main__":
    sys.exit(main())
