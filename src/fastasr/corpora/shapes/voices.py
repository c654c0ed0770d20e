"""The ``voices`` shape (``python -m fastasr.corpora.shapes voices SRC OUT``): dev and test
speakers outside the training speakers' range, as children's voices are to adults'.

Train is the source's train, unchanged (the manifest points at the source audio). Every dev and
test speaker gets a voice of their own: F0 raised by ``s`` semitones and formants scaled by
``α`` (a vocal tract ``1/α`` as long), both drawn uniformly, once per speaker, from
``--semitones`` (4 7: F0 × 1.26–1.50, an adult's 100–220 Hz to a child's 130–330 Hz) and
``--formant-scale`` (1.15 1.25: children's formants lie about that far above adults'), keyed by
seed, split and speaker (an utterance without ``speaker`` is its own speaker). Each utterance
is changed by :func:`fastasr.data.voice.change_voice` (phase-vocoder pitch shift and cepstral
envelope correction; its docstring says how) at its own sample rate and written as 16-bit PCM;
its duration, text and speaker stay, and its line records ``voice`` (``semitones``,
``formant_scale``).
"""

from __future__ import annotations

import logging

from fastasr.corpora.shapes.source import draw_rng, wav_path
from fastasr.data.audio import BadAudioError, file_sample_rate, load_audio, write_wav
from fastasr.data.voice import change_voice

log = logging.getLogger(__name__)

CHANGED = ("dev", "test")


def _range(name: str, lo_hi, lowest: float, highest: float) -> tuple[float, float]:
    lo, hi = (float(v) for v in lo_hi)
    if not lowest <= lo <= hi <= highest:
        raise ValueError(f"--{name} {lo:g} {hi:g}; expected {lowest:g} <= low <= high <= {highest:g}")
    return lo, hi


def speaker_voice(seed: int, split: str, speaker: str, semitones: tuple[float, float],
                  formant_scale: tuple[float, float]) -> tuple[float, float]:
    """A speaker's (semitones, formant scale), drawn uniformly from the two ranges; a function of
    (seed, split, speaker) only, rounded to 3 decimals as the manifest records them."""
    rng = draw_rng(seed, "voices", split, speaker)
    return round(float(rng.uniform(*semitones)), 3), round(float(rng.uniform(*formant_scale)), 3)


def build_voices(corpus, out, seed, skipped, *, semitones=(4.0, 7.0), formant_scale=(1.15, 1.25)):
    semitones = _range("semitones", semitones, -12.0, 12.0)
    formant_scale = _range("formant-scale", formant_scale, 0.7, 1.4)
    records: dict[str, list[dict]] = {"train": [u.record() for u in corpus["train"]]}
    for split in CHANGED:
        utts = corpus[split]
        records[split] = []
        for n, utt in enumerate(utts):
            speaker = utt.speaker if utt.speaker is not None else utt.id
            shift, scale = speaker_voice(seed, split, str(speaker), semitones, formant_scale)
            try:
                rate = file_sample_rate(utt.audio_filepath)
                wav = load_audio(utt.audio_filepath, expected_seconds=utt.duration)
            except BadAudioError as err:
                skipped[split].add(err.path, "unusable audio", err.reason)
                continue
            path = wav_path(out, split, utt.id).resolve()
            write_wav(path, change_voice(wav, rate, shift, scale), rate)
            records[split].append({**utt.record(), "audio_filepath": str(path),
                                   "voice": {"semitones": shift, "formant_scale": scale}})
            if (n + 1) % 100 == 0:
                log.info("voices %s: %d / %d", split, n + 1, len(utts))
    return records
