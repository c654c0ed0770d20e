"""The ``short`` shape (``fastasr-corpus shapes short``): 1-4 s segments cut at word
boundaries placed by a forced alignment against a character-unit checkpoint's emissions. Its
description: :mod:`fastasr.corpora.shapes`."""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastasr.corpora.shapes.source import (
    SPLITS,
    wav_path,
)
from fastasr.data.audio import BadAudioError, file_sample_rate, load_audio, write_wav
from fastasr.data.features import Fbank
from fastasr.data.manifest import Utterance
from fastasr.data.tokenizer import UnknownUnitError, ctc_min_frames, normalize_text
from fastasr.decoding import long_form
from fastasr.decoding.alignment import align_units, word_frames

log = logging.getLogger(__name__)


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


def build_short(corpus, out, seed, skipped, *, align_ckpt, min_seconds=1.0, max_seconds=4.0):
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
                path = wav_path(out, split, seg_id).resolve()
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
