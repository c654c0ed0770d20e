"""Audio decoding: the loop behind ``Recogniser.transcribe`` that turns recordings into text, and what
it gives, one :class:`~fastasr.decoding.transcript_formats.Transcription` a recording with its
timed words (defined without PyTorch, so the ONNX runtime gives the same objects).

The recording's features are computed by ``DataLoader`` workers, batches of them (or of windows
of long ones: :mod:`fastasr.decoding.long_form`) go through the model, each recording is decoded
and its words timed by a forced alignment. A recogniser is anything with ``model``,
``features``, ``tokenizer``, ``subsampling``, ``frame_seconds`` and ``decoder(decoding)``
(``fastasr.recognition.recogniser.Recogniser``), which imports this module.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from fastasr.data.audio import BadAudioError
from fastasr.data.bad_audio import SKIPPED_KEY
from fastasr.data.recordings import Recording, RecordingFeatures
from fastasr.data.subword import WORD_START
from fastasr.decoding.alignment import align_units, word_frames
from fastasr.decoding.emissions import decoding_device
from fastasr.decoding.long_form import (
    LongFormConfig,
    long_form_log_probs,
    output_frames,
    resolve_mode,
)
from fastasr.decoding.transcript_formats import Transcription, Word
from fastasr.progress import progress_bar

log = logging.getLogger(__name__)


def _as_is(item: Any) -> Any:
    return item  # DataLoader collate_fn: items as the dataset made them (picklable for workers)


def iter_transcriptions(recogniser: Any, audio: Any, batch_size: int = 4, *, sample_rate: int | None = None,
                        decoding: str | Mapping[str, Any] | Any | None = None,
                        long_form: Mapping[str, Any] | Any | None = None, device: str | torch.device | None = None,
                        num_workers: int = 0, progress: bool = False, on_bad_audio: str = "skip",
                        seed: int | None = None) -> Iterator[Transcription]:
    """``Recogniser.iter_transcribe``: each :class:`Transcription` of ``audio`` as soon as its
    batch is decoded, in input order (the arguments: ``Recogniser.transcribe``)."""
    if recogniser.model is None:
        raise ValueError("transcribe: the recogniser has no model; get one from load_recogniser(ckpt_path)")
    if on_bad_audio not in ("skip", "raise"):
        raise ValueError(f"on_bad_audio {on_bad_audio!r}; expected 'skip' or 'raise'")
    single = isinstance(audio, (str, os.PathLike, torch.Tensor, np.ndarray, Recording))
    recordings = [Recording.of(x, sample_rate, i) for i, x in enumerate([audio] if single else list(audio))]
    decoder = recogniser.decoder(decoding)
    config = LongFormConfig.from_dict(long_form)
    model = recogniser.model
    target = next(model.parameters()).device if device is None else decoding_device(device)
    was_training = model.training
    model.eval().to(target)
    if seed is not None:
        torch.manual_seed(seed)
    items: Iterator[dict] = iter(DataLoader(RecordingFeatures(recordings, recogniser.features), batch_size=None,
                                            num_workers=num_workers, collate_fn=_as_is))
    items = iter(progress_bar(items, enabled=progress, total=len(recordings), desc="transcribe", unit="file"))
    batch_size = max(1, int(batch_size))
    try:
        while group := [item for _, item in zip(range(batch_size), items)]:
            usable = [item for item in group if SKIPPED_KEY not in item]
            log_probs = long_form_log_probs(model, [item["features"] for item in usable], config,
                                            frame_shift_ms=recogniser.features.frame_shift_ms, batch_size=batch_size,
                                            device=target)
            by_index = {item["index"]: lp for item, lp in zip(usable, log_probs)}
            for item in group:
                rec = recordings[item["index"]]
                if SKIPPED_KEY in item:
                    reason = item[SKIPPED_KEY].reason
                    if on_bad_audio == "raise":
                        raise BadAudioError(rec.name, reason)
                    yield Transcription(rec.id, rec.audio_filepath, "", [], [], 0.0, error=reason)
                    continue
                lp = by_index[item["index"]]
                mode = resolve_mode(config, model, output_frames(item["features"].shape[0], recogniser.subsampling))
                yield transcription_of(recogniser, rec, lp, item["seconds"], decoder, mode)
    finally:
        model.train(was_training)


def transcription_of(recogniser: Any, recording: Any, log_probs: torch.Tensor, seconds: float, decoder: Any,
                      mode: str, hyp: Any = None) -> Transcription:
    """Decode one recording's ``(T', V)`` log-probabilities with ``recogniser``'s units and time
    its words (a forced alignment of the hypothesis' units: :mod:`fastasr.decoding.alignment`);
    ``hyp``: the decoder's hypothesis when it is already known (a stream's)."""
    tok = recogniser.tokenizer
    hyp = decoder(log_probs) if hyp is None else hyp
    index = {u: i for i, u in enumerate(tok.vocab)}
    spans = align_units(log_probs, [index[u] for u in hyp.units], blank=tok.blank_id, frames=hyp.frames,
                        cut_before=[u == tok.word_boundary for u in hyp.units])
    if spans is None and hyp.frames is not None:
        spans = [(f, f + 1) for f in hyp.frames]  # no alignment: the frames the decoder emitted them at
    subword = tok.kind in ("bpe", "unigram")
    frames = None if spans is None else word_frames(hyp.units, spans, None if subword else tok.word_boundary,
                                                    WORD_START if subword else None)
    if frames is None or len(frames) != len(hyp.words):
        log.warning("%s: no word times (%s); each word is given the whole recording", recording.name,
                    "no alignment" if frames is None else f"{len(hyp.words)} words, {len(frames)} unit groups")
        frames = [(0, log_probs.shape[0])] * len(hyp.words)
    step = recogniser.frame_seconds
    words = []
    for word, (a, b) in zip(hyp.words, frames):
        end = round(min(b * step, seconds), 3)
        words.append(Word(word, round(min(a * step, end), 3), end))
    # real words: every word is a lexicon word (greedy decoding keeps a phonetic word it cannot look up)
    lexicon = getattr(decoder, "lexicon", None)
    real = bool(decoder.real_words) and (lexicon is None or all(w in lexicon for w in hyp.words))
    return Transcription(recording.id, recording.audio_filepath, " ".join(hyp.words), words, list(hyp.units),
                         round(seconds, 3), real_words=real, score=hyp.score, mode=mode)
