"""The shapes that select or resample a corpus's utterances (``fastasr-corpus shapes``):
``tiny`` (a proportional subset), ``speakers`` (the K speakers with the most training audio) and
``resample`` (every utterance at another rate). Their descriptions: :mod:`fastasr.corpora.shapes`."""

from __future__ import annotations

import logging
import random
from collections import Counter, defaultdict
from collections.abc import Sequence

from fastasr.corpora.paths import CorpusLayoutError
from fastasr.corpora.shapes.source import (
    SPLITS,
    wav_path,
)
from fastasr.data.audio import BadAudioError, load_audio, write_wav
from fastasr.data.manifest import Utterance

log = logging.getLogger(__name__)


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


def build_tiny(corpus, out, seed, skipped, *, utterances=1000, minutes=45.0, dev_utterances=200, test_utterances=200):
    limits = {"train": (utterances, minutes * 60), "dev": (dev_utterances, None), "test": (test_utterances, None)}
    for split, (n, _) in limits.items():
        if n < 1:
            raise ValueError(f"--{'' if split == 'train' else split + '-'}utterances {n}; expected >= 1")
    if minutes <= 0:
        raise ValueError(f"--minutes {minutes}; expected a positive number of minutes")
    return {split: [u.record() for u in take_subset(corpus[split], *limits[split], seed=seed)] for split in SPLITS}


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


def build_speakers(corpus, out, seed, skipped, *, count=5):
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


# ------------------------------------------------------------------ resample


def build_resample(corpus, out, seed, skipped, *, sample_rate=8000):

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
            path = wav_path(out, split, utt.id).resolve()
            write_wav(path, wav, sample_rate)
            records[split].append({**utt.record(), "audio_filepath": str(path),
                                   "duration": round(wav.shape[0] / sample_rate, 4)})
            if (n + 1) % 500 == 0:
                log.info("resample %s: %d / %d", split, n + 1, len(corpus[split]))
    return records
