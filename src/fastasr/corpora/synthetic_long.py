"""Long utterances for the built-in corpus: the paper's long-sequence regime.

    fastasr-corpus synthetic --out data/synthetic_long \\
        --min-seconds 10 --max-seconds 40 [--train 600 --dev 60 --test 60]     (make data-long)

An utterance of the long corpus (``data=synthetic_long``) is several sentences of the
built-in corpus spoken by **one** voice in **one** style (rate, pitch, pitch range), joined
by 0.15–0.6 s pauses, padded with 0.1–0.4 s of silence either side and mixed with one noise
at one SNR, exactly as a short utterance is. Its duration is drawn as
``min + (max - min) · min(u1, u2)`` (u uniform: density falling linearly from ``min`` to
``max``; 10–40 s gives ~20 s on average, ~21 s once the last sentence has overshot), and
sentences (a target of 4–16 words each; templates can run a few words longer) are added until it is reached. A sentence that would pass ``max`` is
replaced by a shorter one while the utterance is still below ``min``; otherwise the
utterance ends there. Durations therefore always lie within ``[min, max]``.

Without subsampling (100 frames a second) the attention sees 1,000–4,000 positions: the
clustered-attention paper's WSJ regime (780 frames on average, up to 2,500) and beyond.

Targets: ``text`` is the sentences' words joined by spaces, ``phonemes`` the phonemes each
sentence was spoken with (``espeak_TextToPhonemes`` of that sentence and voice), joined by
`` | `` like the words within a sentence; ``sentence_words`` lists each sentence's word
count, so the utterance can be cut back into its sentences. Voices follow the built-in
corpus's split (dev and test voices unseen in training, dev ≠ test), so the
two corpora's models are comparable.

Determinism: each utterance draws from its own generator seeded by
``(seed, split, index, LONG_STREAM)`` (the extra entry keeps it apart from the short
corpus's utterance of the same index), and espeak-ng is reloaded and re-seeded for every
sentence, so the corpus is byte-identical for a seed whatever the number of workers.
"""

from __future__ import annotations

import numpy as np

from fastasr.corpora.espeak import Espeak
from fastasr.corpora.sentences import make_sentence
from fastasr.corpora.speaking import (
    PAD_S,
    SAMPLE_RATE,
    SPLITS,
    Job,
    draw_style,
    mix_and_write,
    phonemes_of,
    speak,
)

LONG_GENERATOR_VERSION = 2  # bump when the output of a long corpus for a given seed changes (2: every word its phonetic word)
LONG_STREAM = 1  # 4th entry of the per-utterance seed: long utterances draw apart from short ones
SENTENCE_WORDS = (4, 16)  # words per sentence (make_sentence's target), uniform
PAUSE_S = (0.15, 0.6)  # silence between two sentences
MIN_SPAN_S = 3.0  # max - min must leave room for a sentence (a long corpus with a narrower span is refused)
MAX_REDRAWS = 40  # sentences too long to fit, redrawn shorter, before giving up


def target_seconds(rng: np.random.Generator, lo: float, hi: float) -> float:
    """The duration an utterance aims at: ``lo + (hi - lo) · min(u1, u2)`` (mean ``lo + (hi - lo) / 3``)."""
    u = rng.uniform(size=2)
    return lo + (hi - lo) * float(u.min())


def synthesize_long_utterance(job: Job) -> dict:
    """Synthesise, write and describe one long utterance (``job.min_seconds`` to
    ``job.max_seconds``); runs in a worker process like
    :func:`fastasr.corpora.synthetic.synthesize_utterance`."""
    lo, hi = float(job.min_seconds), float(job.max_seconds)
    es = Espeak()
    rng = np.random.default_rng([job.seed, SPLITS.index(job.split), job.index, LONG_STREAM])
    style = draw_style(rng, job.split)
    pad_samples = [int(p * SAMPLE_RATE) for p in rng.uniform(*PAD_S, size=2)]
    target = target_seconds(rng, lo, hi)
    lo_n, hi_n, target_n = (int(round(x * SAMPLE_RATE)) for x in (lo, hi, target))

    pieces: list[np.ndarray] = []  # speech and pauses, in order
    speech_parts: list[np.ndarray] = []
    texts: list[str] = []
    total = sum(pad_samples)
    words = int(rng.integers(SENTENCE_WORDS[0], SENTENCE_WORDS[1] + 1))
    redraws = 0
    while total < target_n:
        text = make_sentence(rng, words)
        speech = speak(es, text, style)
        pause = int(rng.uniform(*PAUSE_S) * SAMPLE_RATE) if pieces else 0
        if total + pause + speech.shape[0] > hi_n:
            if total >= lo_n:
                break  # long enough: end here rather than pass the maximum
            redraws += 1
            if redraws > MAX_REDRAWS:
                raise RuntimeError(
                    f"{job.split} {job.index}: no sentence fits between {total / SAMPLE_RATE:.2f} s and "
                    f"the {hi} s maximum in {MAX_REDRAWS} tries; expected a span max - min of a few seconds"
                )
            words = max(1, len(text.split()) // 2)
            continue
        if pause:
            pieces.append(np.zeros(pause))
        pieces.append(speech)
        speech_parts.append(speech)
        texts.append(text)
        total += pause + speech.shape[0]
        words = int(rng.integers(SENTENCE_WORDS[0], SENTENCE_WORDS[1] + 1))

    speech = np.concatenate(pieces)
    power = float(np.mean(np.concatenate(speech_parts) ** 2))  # of the voice, not of the pauses
    _, fields = mix_and_write(rng, job, speech, pad_samples, power)
    return {
        "audio_filepath": fields["audio_filepath"],
        "duration": fields["duration"],
        "text": " ".join(texts),
        "phonemes": " | ".join(phonemes_of(es, t, style.voice) for t in texts),
        "speaker": style.voice,
        "rate_wpm": style.rate,
        "pitch": style.pitch,
        "noise": fields["noise"],
        "snr_db": fields["snr_db"],
        "sentence_words": [len(t.split()) for t in texts],
    }
