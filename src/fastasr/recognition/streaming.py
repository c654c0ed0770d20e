"""Streaming recognition: words while the audio arrives (``Recogniser.stream``, ``python -m
fastasr.transcribe ... stream=true chunk=0.64``; docs/STREAMING.md).

A :class:`RecognitionStream` takes audio in pieces of any size. Its filterbank frames are computed as
their windows complete (:class:`fastasr.data.features.FbankStream`), every chunk of them runs
through the encoder with the left context each layer keeps
(:class:`fastasr.model.streaming.ModelStream`), and the chunk's log-probabilities extend the
search (greedy, or the beam search with its lexicon and the LM state carried across chunks:
``decoder.stream()``). ``accept`` returns a :class:`Partial` after each chunk; ``finish`` the
:class:`~fastasr.decoding.transcript_formats.Transcription` with timed words. The final words
are those of the simulated chunked decoding of the whole recording (``CTCModel.forward`` with
the same :class:`~fastasr.model.chunking.ChunkContext`, as ``evaluate.py chunk=...`` scores it).

A chunk's words are ready when its last sample has arrived, plus the filterbank window's reach
past its frame shift (15 ms at 25/10 ms), plus the time to compute the chunk.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fastasr.data.features import Fbank
from fastasr.data.recordings import Recording, recording_audio
from fastasr.decoding.transcript_formats import Transcription
from fastasr.model.chunking import ChunkContext
from fastasr.recognition.audio_decoding import transcription_of


@dataclass
class Partial:
    """What a stream has recognised so far.

    Attributes:
        text: the words so far, space-separated (the last may still change).
        words: the same words, as a list.
        seconds: audio heard so far.
        chunks: chunks encoded so far.
        compute_seconds: the wall time the last ``accept`` took (features, encoder, search).
    """

    text: str
    words: list[str]
    seconds: float
    chunks: int
    compute_seconds: float


#: Seconds of left context ``left=auto`` gives a model that trained without chunks (or with an
#: unbounded left context): such a model attended over whole training utterances, and the
#: recipes' are shorter than this (the built-in corpus's a few seconds, Common Voice's at most
#: about 10 s, LibriSpeech's 12 s on average), so it keeps most of the context it learnt to use,
#: while a stream's chunk costs the same at its first minute and its sixtieth: at 40 ms a frame,
#: a 0.64 s chunk's 16 queries attend to at most 266 keys (a chunk-trained model's default 2.56 s,
#: 80). Checkpoints do not record their longest training utterance; ``left=`` sets any other
#: bound, ``left=all`` (or null) every earlier frame (a cost that grows with the stream).
DEFAULT_LEFT_SECONDS = 10.0

#: Spellings of an unbounded left context (``left=all``; None is ``left=null``).
UNBOUNDED_LEFT = (None, "all")


def chunk_context(recogniser: Any, chunk_s: float, left_s: float | str | None = "auto") -> ChunkContext:
    """The :class:`ChunkContext` of ``chunk_s`` seconds of audio a chunk, in the recogniser's encoder
    frames (:attr:`~fastasr.recognition.recogniser.Recogniser.frame_seconds` each, rounded to the
    nearest whole number, at least 1), with ``left_s`` seconds of left context rounded up to whole
    chunks: ``"auto"``, the left context the model trained with (``model.streaming.left_frames``)
    when it trained with chunks and a bounded one, else :data:`DEFAULT_LEFT_SECONDS` (a bounded
    default for every model: a chunk's cost stays constant however long the stream); ``"all"`` or
    None: every earlier frame (a chunk's cost then grows with the stream).

    Raises ValueError naming ``chunk`` / ``left`` for a value that is not a positive number."""
    step = recogniser.frame_seconds
    try:
        chunk_s = float(chunk_s)
    except (TypeError, ValueError):
        raise ValueError(f"chunk={chunk_s!r}; expected seconds of audio a chunk (e.g. 0.64)") from None
    if not chunk_s > 0 or not math.isfinite(chunk_s):
        raise ValueError(f"chunk={chunk_s}; expected seconds > 0 (e.g. 0.64)")
    size = max(1, round(chunk_s / step))
    if left_s == "auto":
        streaming = recogniser.model_config.get("streaming") or {}
        left = streaming.get("left_frames") if streaming.get("chunk_sizes") else None
        if left is None:
            left = round(DEFAULT_LEFT_SECONDS / step)
    elif left_s in UNBOUNDED_LEFT:
        left = None
    else:
        try:
            left_s = float(left_s)
        except (TypeError, ValueError):
            raise ValueError(f"left={left_s!r}; expected seconds of left context, auto, or all (or null): "
                             "every earlier frame") from None
        if left_s < 0 or not math.isfinite(left_s):
            raise ValueError(f"left={left_s}; expected seconds >= 0, auto, or all (or null): every earlier frame")
        left = round(left_s / step)
    return ChunkContext.with_left_frames(size, left)


class RecognitionStream:
    """One recording recognised as it arrives (``Recogniser.stream``).

    ``accept(samples)``: a piece of audio ``(T,)`` at the recogniser's rate (``features.sample_rate``),
    float in [-1, 1]; returns a :class:`Partial` when the piece completed a chunk, else None.
    ``finish()``: the :class:`Transcription` of the whole stream (words timed). The model is in eval
    mode while the stream is used.
    """

    def __init__(self, recogniser: Any, chunk: ChunkContext, decoding: str | Mapping[str, Any] | Any | None = None,
                 stream_id: str = "stream", audio_filepath: str | None = None) -> None:
        if recogniser.model is None:
            raise ValueError("stream: the recogniser has no model; get one from load_recogniser(ckpt_path)")
        self.recogniser, self.chunk = recogniser, chunk
        self.recording = Recording(stream_id, audio_filepath)
        self.decoder = recogniser.decoder(decoding)
        recogniser.model.eval()
        self.features = Fbank(recogniser.features).stream()
        self.encoder = recogniser.model.start_stream(chunk)
        self.search = self.decoder.stream()
        self.log_probs: list[torch.Tensor] = []
        self.samples = 0

    @property
    def chunk_seconds(self) -> float:
        return self.chunk.size * self.recogniser.frame_seconds

    @property
    def chunks(self) -> int:
        """Chunks encoded so far."""
        return math.ceil(self.encoder.position / self.chunk.size)

    @property
    def seconds(self) -> float:
        """Audio heard so far."""
        return self.samples / self.recogniser.features.sample_rate

    def accept(self, samples: Any) -> Partial | None:
        started = time.perf_counter()
        samples = torch.as_tensor(samples, dtype=torch.float32).reshape(-1)
        self.samples += samples.shape[0]
        frames = self.features.accept(samples)
        if not self._add(self.encoder.accept(frames)):
            return None
        hyp = self.search.partial()
        return Partial(" ".join(hyp.words), list(hyp.words), self.seconds, self.chunks,
                       time.perf_counter() - started)

    def finish(self) -> Transcription:
        """Encode what is left and end the search: the stream's words, timed."""
        self._add(self.encoder.accept(self.features.finish()))  # a recording shorter than one window
        self._add(self.encoder.finish())
        hyp = self.search.finish()
        log_probs = torch.cat(self.log_probs) if self.log_probs else torch.zeros(0, self.recogniser.vocab_size)
        return transcription_of(self.recogniser, self.recording, log_probs, self.seconds, self.decoder,
                                f"stream (chunks of {self.chunk_seconds:.2f} s)", hyp=hyp)

    def _add(self, log_probs: torch.Tensor) -> bool:
        if not log_probs.shape[0]:
            return False
        self.log_probs.append(log_probs)
        self.search.accept(log_probs)
        return True



@dataclass
class StreamedRecording:
    """A recording fed to a stream in pieces as a live source would give them: its
    :class:`Transcription`, the :class:`Partial` after each chunk, and the wall time ``finish`` took."""

    transcription: Transcription
    partials: list[Partial]
    finish_seconds: float

    @property
    def compute_seconds(self) -> float:
        """All the wall time the stream took (every ``accept`` and ``finish``)."""
        return sum(p.compute_seconds for p in self.partials) + self.finish_seconds


def stream_recording(recogniser: Any, recording: Any, chunk: float = 0.64, left: float | str | None = "auto",
                     decoding: str | Mapping[str, Any] | Any | None = None, piece: float | None = None,
                     on_partial: Any = None) -> StreamedRecording:
    """Stream one recording (a path, a waveform with its rate in a :class:`Recording`, ...) through
    ``recogniser.stream``, ``piece`` seconds at a time (None: a chunk's worth), calling
    ``on_partial(partial)`` after each chunk. Raises ``BadAudioError`` for unusable audio."""
    recording = Recording.of(recording)
    samples = recording_audio(recording, recogniser.features)
    stream = RecognitionStream(recogniser, chunk_context(recogniser, chunk, left), decoding, recording.id,
                               recording.audio_filepath)
    step = max(1, round((stream.chunk_seconds if piece is None else float(piece)) * recogniser.features.sample_rate))
    partials = []
    for start in range(0, samples.shape[0], step):
        partial = stream.accept(samples[start:start + step])
        if partial is not None:
            partials.append(partial)
            if on_partial is not None:
                on_partial(partial)
    started = time.perf_counter()
    transcription = stream.finish()
    return StreamedRecording(transcription, partials, time.perf_counter() - started)
