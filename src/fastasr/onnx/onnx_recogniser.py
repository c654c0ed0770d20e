"""The ONNX recogniser: an exported recogniser (:mod:`fastasr.deploy.export`'s folder) run by
onnxruntime, without PyTorch (the PyTorch one is :mod:`fastasr.recognition.recogniser`).

:class:`OnnxRecogniser` reads the folder: ``model.onnx`` (or ``model.int8.onnx``), the units
and feature settings of ``recogniser.json``, and the lexicon it carries. It computes the
training's Kaldi filterbanks in numpy (:func:`fbank`: the same settings as
``fastasr.data.features.Fbank``, int16-scaled samples, no dither; :mod:`fastasr.onnx.filterbank`;
or sherpa-onnx's default one, ``filterbank="sherpa-onnx"``, for sherpa-onnx's words), runs the model over a
recording in one pass or in the same overlapping windows as ``fastasr-transcribe``
(:func:`fastasr.decoding.windows.plan_windows`), and decodes greedily by the same rules as
``fastasr.decoding.greedy.GreedyDecoder``: the argmax path, repeats merged, blanks dropped, a
phoneme model's phonetic words looked up in the lexicon; or by the beam search with the folder's
lexicon and LM (:meth:`OnnxRecogniser.beam_decoder`: ``fastasr.decoding.beam``, torch-free). A word's time spans its units' argmax
runs on that path (``fastasr-transcribe`` times words by a forced alignment of the
same units instead: the two agree within a few output frames).

Imports: numpy, onnxruntime, soundfile, sentencepiece (subword units) and fastasr's
PyTorch-free modules (units, lexicon, word grouping, windows, the numpy filterbank);
:meth:`OnnxRecogniser.beam_decoder` alone imports the beam search (``fastasr.decoding.beam``:
flashlight-text, the ``beam`` extra of ``fastasr-runtime``). Tests hold that importing it and
decoding greedily load no torch, omegaconf or flashlight, in the full environment and in one
without torch (docs/DEPLOY.md).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime
import soundfile as sf
from numpy.lib.stride_tricks import sliding_window_view

from fastasr.data.lexicon import Lexicon
from fastasr.data.subword import WORD_START
from fastasr.data.tokenizer import Tokenizer
from fastasr.decoding.hypothesis import tidy_boundary_indices, word_frames, word_groups
from fastasr.decoding.transcript_formats import Transcription, Word
from fastasr.decoding.windows import LongFormConfig, output_frames, plan_windows
from fastasr.onnx.filterbank import KALDI_FEATURES, SHERPA_ONNX_FEATURES, FilterbankOptions, log_mel

if TYPE_CHECKING:  # the beam search (flashlight-text) is imported by beam_decoder alone: greedy needs none
    from fastasr.decoding.beam import BeamSearchDecoder, BeamSearchOptions

__all__ = ["OnnxRecogniser", "fbank", "INT16_SCALE"]

INT16_SCALE = 32768.0  # Kaldi works on int16-scaled samples (as fastasr.data.features)
#: What int16-scaled samples add to a log-mel energy (fastasr.deploy.export.SAMPLE_SCALE_LOG): a graph
#: that reads the filterbank of samples in [-1, 1] (sherpa-onnx's) gets training's minus this.
SAMPLE_SCALE_LOG = np.float32(2.0 * math.log(INT16_SCALE))


def fbank(waveform: np.ndarray, features: dict[str, Any]) -> np.ndarray:
    """``(frames, num_mel_bins)`` float32 log-mel filterbanks of a mono ``waveform`` in [-1, 1] at
    ``features["sample_rate"]``: Kaldi's, as training computed them (``fastasr.data.features.Fbank``:
    povey window, pre-emphasis 0.97, DC removal, power spectrum, no dither, training's
    ``sample_scale``, ``snip_edges`` and ``high_freq`` (Kaldi's where ``features`` predates them);
    input shorter than one window zero-padded to one), computed in numpy on
    whole arrays (:func:`fastasr.onnx.filterbank.log_mel`)."""
    options = filterbank_options(features)
    samples = np.asarray(waveform, dtype=np.float32).reshape(-1)
    if samples.shape[0] < options.window:
        samples = np.pad(samples, (0, options.window - samples.shape[0]))
    return log_mel(samples, options)


def filterbank_options(features: dict[str, Any]) -> FilterbankOptions:
    """Training's filterbank settings (``recogniser.json``'s ``features``) as the runtime's."""
    return FilterbankOptions(sample_rate=int(features["sample_rate"]), num_mel_bins=int(features["num_mel_bins"]),
                             frame_length_ms=float(features["frame_length_ms"]),
                             frame_shift_ms=float(features["frame_shift_ms"]),
                             scale=float(features.get("sample_scale", KALDI_FEATURES["sample_scale"])),
                             snip_edges=bool(features.get("snip_edges", KALDI_FEATURES["snip_edges"])),
                             high_freq=float(features.get("high_freq", KALDI_FEATURES["high_freq"])))


def scale_log(features: dict[str, Any]) -> np.float32:
    """What training's sample scale (``features["sample_scale"]``, int16's where absent) adds to every
    log-mel energy against samples in [-1, 1]: ``ln(scale²)`` (0 for a model trained on [-1, 1])."""
    return np.float32(2.0 * math.log(float(features.get("sample_scale", KALDI_FEATURES["sample_scale"]))))


def sherpa_onnx_options(features: dict[str, Any]) -> FilterbankOptions:
    """sherpa-onnx's default filterbank at the model's rate and dimension (``FeatureExtractorConfig``'s,
    lhotse's and icefall's): samples in [-1, 1], edges not snipped, the top 400 Hz below the Nyquist
    frequency."""
    sherpa = SHERPA_ONNX_FEATURES
    return replace(filterbank_options(features), scale=sherpa["sample_scale"], snip_edges=sherpa["snip_edges"],
                   high_freq=sherpa["high_freq"])


#: The filterbanks :class:`OnnxRecogniser` computes: ``training``, training's (``fastasr-transcribe``'s
#: words); ``sherpa-onnx``, sherpa-onnx's default one (:func:`sherpa_onnx_options`: sherpa-onnx's words).
FILTERBANKS = ("training", "sherpa-onnx")


def read_audio(path: str | os.PathLike, sample_rate: int, channels: int | None = None) -> np.ndarray:
    """A mono float32 waveform of an audio file at ``sample_rate`` (channels averaged; another rate
    resampled as training resamples: :func:`resample`). Raises ``ValueError`` naming the file for
    unreadable or empty audio, non-finite samples, or another channel count than ``channels``."""
    try:
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except (RuntimeError, OSError, EOFError, ValueError) as err:
        raise ValueError(f"{path}: unreadable ({str(err).strip()}); expected audio soundfile can decode") from None
    if data.shape[0] == 0:
        raise ValueError(f"{path}: 0 samples; expected non-empty audio")
    if channels is not None and data.shape[1] != channels:
        raise ValueError(f"{path}: {data.shape[1]} channels; expected {channels} (the model's features.channels)")
    if not np.isfinite(data).all():
        raise ValueError(f"{path}: NaN or infinite samples")
    mono = data.mean(axis=1)
    if rate != sample_rate:
        mono = resample(mono, rate, sample_rate)
    return mono


def resample(samples: np.ndarray, orig_rate: int, new_rate: int, zero_crossings: int = 6,
             rolloff: float = 0.99) -> np.ndarray:
    """``samples (T,)`` at ``orig_rate`` → float32 at ``new_rate``, by the resampling training uses
    (``fastasr.data.audio.resample``: torchaudio's default): a low-pass at ``rolloff`` × the lower
    Nyquist frequency, a sinc with ``zero_crossings`` crossings each side under a Hann window,
    applied polyphase (one filter per output phase of the reduced rate ratio); the output has
    ``ceil(T × new / orig)`` samples."""
    ratio = math.gcd(int(orig_rate), int(new_rate))
    orig, new = int(orig_rate) // ratio, int(new_rate) // ratio
    cutoff = min(orig, new) * rolloff
    width = math.ceil(zero_crossings * orig / cutoff)
    offsets = np.arange(-width, width + orig) / orig  # the input samples one output frame reads
    t = np.clip((offsets[None, :] - np.arange(new)[:, None] / new) * cutoff, -zero_crossings, zero_crossings)
    window = np.cos(t * np.pi / zero_crossings / 2) ** 2
    x = t * np.pi
    taps = np.where(x == 0, 1.0, np.sin(x) / np.where(x == 0, 1.0, x)) * window * (cutoff / orig)  # (new, K)
    padded = np.pad(np.asarray(samples, dtype=np.float64).reshape(-1), (width, width + orig))
    frames = sliding_window_view(padded, taps.shape[1])[::orig]  # (M, K): frame m starts at m × orig
    out = (frames @ taps.T).reshape(-1)  # output m × new + j: phase j of frame m
    return out[:math.ceil(new * samples.shape[0] / orig)].astype(np.float32)


def beam_search() -> tuple[type[BeamSearchDecoder], type[BeamSearchOptions]]:
    """``(BeamSearchDecoder, BeamSearchOptions)`` of :mod:`fastasr.decoding.beam`, imported on first
    use; ``ValueError`` in one line when flashlight-text (the search) is not installed."""
    try:
        from fastasr.decoding.beam import (  # flashlight-text: beam decoding alone
            BeamSearchDecoder,
            BeamSearchOptions,
        )
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith("flashlight"):
            raise
        raise ValueError("the beam search needs flashlight-text, which is not installed: pip install "
                         "'fastasr-runtime[beam]' (or flashlight-text); decoding=greedy needs none") from None
    return BeamSearchDecoder, BeamSearchOptions


@dataclass
class OnnxRecogniser:
    """An exported folder loaded for decoding (module docstring).

    ``OnnxRecogniser.load(folder, int8=False, threads=None, filterbank="training")``; :meth:`transcribe` gives a
    :class:`~fastasr.decoding.transcript_formats.Transcription` per input (the transcription
    command's), :meth:`log_probs` the model's output per recording.
    """

    folder: Path
    session: Any
    tokenizer: Tokenizer
    features: dict[str, Any]
    subsampling: int
    frame_seconds: float
    lexicon: Lexicon | None = None
    export: dict[str, Any] = field(default_factory=dict)
    filterbank: str = "training"

    def __post_init__(self) -> None:
        # a phoneme model's words: each pronunciation's most frequent word, built once (GreedyDecoder's rule)
        self._words = (self.lexicon.inverse() if self.lexicon is not None and self.tokenizer.kind == "phoneme"
                       else None)

    @classmethod
    def load(cls, folder: str | os.PathLike, *, int8: bool = False, threads: int | None = None,
             filterbank: str = "training") -> OnnxRecogniser:
        """Read an exported folder; ``int8``: its quantised model; ``filterbank``: the features it
        computes (:data:`FILTERBANKS`). Raises ``FileNotFoundError`` naming a missing file."""
        if filterbank not in FILTERBANKS:
            raise ValueError(f"filterbank={filterbank!r}; expected one of {', '.join(FILTERBANKS)}")
        folder = Path(folder)
        model = folder / ("model.int8.onnx" if int8 else "model.onnx")
        for path in (model, folder / "recogniser.json"):
            if not path.is_file():
                raise FileNotFoundError(f"{path}: no such file; expected a folder written by "
                                        "fastasr-export ckpt_path=CKPT out=DIR")
        state = json.loads((folder / "recogniser.json").read_text(encoding="utf-8"))
        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = int(threads)
        session = onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        lexicon = None
        if state.get("lexicon"):
            lexicon = Lexicon.from_lines(state["lexicon"]["entries"], where=f"{folder}/recogniser.json lexicon")
        export = state.get("export") or {}
        return cls(folder, session, Tokenizer.from_state_dict(state["tokenizer"]), dict(state["features"]),
                   int(export["subsampling"]), float(export["frame_seconds"]), lexicon, export, filterbank)

    # ------------------------------------------------------------------ the model
    @property
    def dropped(self) -> int:
        """Frames the graph drops at the start of its input (``recogniser.json``'s
        ``export.dropped_frames``: sherpa-onnx's first, :func:`fastasr.deploy.export.dropped_frames`;
        none in older exports)."""
        return int(self.export.get("dropped_frames", 0))

    def graph_features(self, waveform: np.ndarray) -> np.ndarray:
        """The frames the graph's model reads for a waveform in [-1, 1], by :attr:`filterbank`
        (:data:`FILTERBANKS`), at the sample scale the graph reads (``recogniser.json``'s
        ``export.input_samples``: [-1, 1]; older exports read int16-scaled samples' filterbank):
        training's frames, or sherpa-onnx's less the :attr:`dropped` first ones, which the graph
        drops (:meth:`run` puts as many back before each input)."""
        scaled = self.export.get("input_samples") != "[-1, 1]"
        if self.filterbank == "sherpa-onnx":
            options = replace(sherpa_onnx_options(self.features), scale=INT16_SCALE if scaled else 1.0)
            samples = np.asarray(waveform, dtype=np.float32).reshape(-1)
            if samples.shape[0] < (options.shift + 1) // 2:  # no frame: one, as for training's
                samples = np.pad(samples, (0, options.shift - samples.shape[0]))
            frames = log_mel(samples, options)
            return frames[min(self.dropped, frames.shape[0] - 1):]  # the graph keeps one at least
        features = fbank(waveform, self.features)
        if not scaled:
            features -= scale_log(self.features)
        return features

    def run(self, features: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``(T'_i, V)`` log-probabilities of a batch of ``(frames_i, bins)`` filterbanks
        (:meth:`graph_features`): each goes to the graph with :attr:`dropped` zero frames before
        it, in place of those of sherpa-onnx's that the graph drops."""
        d = self.dropped
        lengths = np.array([f.shape[0] + d for f in features], dtype=np.int64)
        padded = np.zeros((len(features), int(lengths.max()), features[0].shape[1]), np.float32)
        for i, f in enumerate(features):
            padded[i, d:d + f.shape[0]] = f
        log_probs, out_lengths = self.session.run(None, {"x": padded, "x_lens": lengths})
        return [log_probs[i, :n] for i, n in enumerate(out_lengths.tolist())]

    def log_probs(self, features: np.ndarray, long_form: LongFormConfig | None = None,
                  batch_size: int = 8) -> tuple[np.ndarray, str]:
        """A recording's ``(T', V)`` log-probabilities and how it was read: ``one_pass``, or
        ``windowed`` as :func:`fastasr.decoding.long_form.long_form_log_probs` cuts it (``auto``:
        windows, the exported graph's full attention being quadratic in length)."""
        config = long_form or LongFormConfig()
        mode = "one_pass" if config.mode == "one_pass" else "windowed"
        frames = features.shape[0]
        total = output_frames(frames, self.subsampling)
        if mode == "one_pass":
            return self.run([features])[0], mode
        shift = float(self.features["frame_shift_ms"])
        windows = plan_windows(frames, self.subsampling, int(round(config.window_s * 1000.0 / shift)),
                               int(round(config.overlap_s * 1000.0 / shift)))
        out = None
        for first in range(0, len(windows), max(1, batch_size)):
            batch = windows[first:first + max(1, batch_size)]
            for w, lp in zip(batch, self.run([features[w.start:w.end] for w in batch])):
                if out is None:
                    out = np.empty((total, lp.shape[-1]), np.float32)
                out[w.to:w.to + w.keep_end - w.keep_start] = lp[w.keep_start:w.keep_end]
        return out, mode

    # ------------------------------------------------------------------ decoding
    @property
    def lm_path(self) -> Path | None:
        """The folder's word LM (``lm.arpa``), or None when the checkpoint carried none."""
        path = self.folder / "lm.arpa"
        return path if path.is_file() else None

    def beam_decoder(self, lm: bool = True, options: BeamSearchOptions | None = None) -> BeamSearchDecoder:
        """The beam search over the folder's units with its lexicon and, with ``lm``, its word LM
        (:class:`fastasr.decoding.beam.BeamSearchDecoder`, the one ``fastasr-transcribe
        decoding=beam_lm`` uses: the same words for the same log-probabilities). Raises ValueError
        when the folder has no lexicon, or no LM and ``lm`` is asked for, or flashlight-text is not installed."""
        BeamSearchDecoder, _ = beam_search()
        if self.lexicon is None:
            raise ValueError(f"{self.folder}: the exported recogniser carries no lexicon; decode with decoding=greedy")
        if lm and self.lm_path is None:
            raise ValueError(f"{self.folder}: the exported recogniser carries no word LM (lm.arpa); decode with "
                             "decoding=beam or decoding=greedy")
        return BeamSearchDecoder(self.tokenizer, self.lexicon, self.lm_path if lm else None, options)

    def decode(self, log_probs: np.ndarray, seconds: float,
               decoder: BeamSearchDecoder | None = None) -> tuple[list[str], list[str], list[Word], bool]:
        """Greedy decoding of ``(T', V)`` log-probabilities, or ``decoder``'s (:meth:`beam_decoder`):
        ``(units, words, timed words, real words)`` (module docstring). A beam search's words are
        timed by the frames its path emits their units at."""
        if decoder is not None:
            hyp = decoder(log_probs)
            spans = [(f, f + 1) for f in hyp.frames or []]
            timed = self._timed(hyp.units, hyp.words, spans, log_probs.shape[0], seconds)
            return hyp.units, hyp.words, timed, decoder.real_words
        tok = self.tokenizer
        best = log_probs.argmax(axis=-1)
        changes = np.nonzero(best[1:] != best[:-1])[0] + 1  # where an argmax run starts (past frame 0)
        run_ends = np.append(changes, best.shape[0])
        starts = np.zeros_like(best, dtype=bool)
        starts[0], starts[changes] = best.shape[0] > 0, True
        starts &= best != tok.blank_id
        frames = np.nonzero(starts)[0].tolist()
        ends = [int(run_ends[np.searchsorted(run_ends, f, side="right")]) for f in frames]  # each unit's run end
        raw = tok.decode(best[frames].tolist())
        kept = tidy_boundary_indices(raw, tok.word_boundary)
        units = [raw[i] for i in kept]
        spans = [(frames[i], ends[i]) for i in kept]
        inverse = self._words
        if inverse is None:
            words = tok.units_to_words(units)
        else:
            words = [inverse.get(tuple(g), "".join(g)) for g in word_groups(units, tok.word_boundary)]
        real = tok.kind != "phoneme" or (inverse is not None and all(w in self.lexicon for w in words))
        return units, words, self._timed(units, words, spans, log_probs.shape[0], seconds), real

    def _timed(self, units: list[str], words: list[str], spans: list[tuple[int, int]], frames: int,
               seconds: float) -> list[Word]:
        """``words`` with times: each spans its units' ``spans`` (output frames, end exclusive), cut
        to the recording's ``seconds``; the whole recording each when units and words do not pair up."""
        tok = self.tokenizer
        subword = tok.kind in ("bpe", "unigram")
        groups = word_frames(units, spans, None if subword else tok.word_boundary, WORD_START if subword else None)
        if len(groups) != len(words):
            groups = [(0, frames)] * len(words)
        timed = []
        for word, (a, b) in zip(words, groups):
            end = round(min(b * self.frame_seconds, seconds), 3)
            timed.append(Word(word, round(min(a * self.frame_seconds, end), 3), end))
        return timed

    def transcribe_waveform(self, waveform: np.ndarray, *, id: str = "waveform-0", audio_filepath: str | None = None,
                            long_form: LongFormConfig | None = None, batch_size: int = 8,
                            decoder: BeamSearchDecoder | None = None) -> Transcription:
        """One recording at the model's sample rate, in [-1, 1]; ``decoder``: a beam search
        (:meth:`beam_decoder`), None: greedy."""
        seconds = waveform.shape[0] / float(self.features["sample_rate"])
        log_probs, mode = self.log_probs(self.graph_features(waveform), long_form, batch_size)
        units, words, timed, real = self.decode(log_probs, seconds, decoder)
        return Transcription(id, audio_filepath, " ".join(words), timed, units, round(seconds, 3),
                             real_words=real, mode=mode)

    def transcribe(self, paths: Sequence[str | os.PathLike], *, long_form: LongFormConfig | None = None,
                   batch_size: int = 8, decoder: BeamSearchDecoder | None = None) -> Iterator[Transcription]:
        """Each audio file's transcription, in order; an unusable file gives one with ``error`` set.
        ``decoder``: a beam search (:meth:`beam_decoder`), None: greedy."""
        for path in paths:
            name = Path(path).stem
            try:
                waveform = read_audio(path, int(self.features["sample_rate"]), self.features.get("channels"))
            except ValueError as err:
                yield Transcription(name, str(path), "", [], [], 0.0, error=str(err))
                continue
            yield self.transcribe_waveform(waveform, id=name, audio_filepath=str(path), long_form=long_form,
                                           batch_size=batch_size, decoder=decoder)
