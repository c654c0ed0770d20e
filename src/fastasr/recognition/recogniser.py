"""The recogniser: the inference object a trained model is, travelling as one piece in its checkpoint.

A :class:`Recogniser` holds the model config (the class its ``_target_`` names and its arguments
other than ``vocab_size``, ``feat_in`` and ``attention``; the subsampling factor lives here, as
``model_config["subsampling"]``), the attention the model was trained with, the tokenizer,
the filterbank settings, and what word decoding needs: the lexicon (words and their unit
spellings, built from the training manifest) and the word n-gram LM (its ARPA text, or its
path and hash when large: :class:`fastasr.lm.BundledLM`). The global CMVN statistics are
buffers of the model, so they are in the checkpoint's weights and nowhere else.

* The model config is what ``conf/model`` says: a Hydra partial (``_partial_: true``) of the class
  ``_target_`` names, ``fastasr.model.CTCModel`` or a subclass. :meth:`Recogniser.build_model`
  instantiates it with Hydra and completes it with ``vocab_size`` (the tokenizer's) and
  ``feat_in`` (the filterbank bins), in training and when a checkpoint is loaded alike, so a new
  encoder is a config change.
* Training makes the bundle at its start (``fastasr.training.fit.build_module``:
  ``fastasr.recognition.loading.with_decoding_data`` adds the lexicon and the LM) and writes it into every checkpoint
  once, as plain data: ``checkpoint["recogniser"]`` (:meth:`Recogniser.to_dict`, by
  ``ASRLitModule.on_save_checkpoint``; its layout's version and checks:
  :mod:`fastasr.recognition.bundle_format`).
* ``fastasr.recognition.loading.load_recogniser`` reads a checkpoint with
  ``torch.load(weights_only=True)`` and returns the bundle with its model (weights loaded, eval
  mode), optionally with another attention (:meth:`fastasr.model.CTCModel.set_attention` swaps
  it later). A checkpoint of an older layout gets a one-line error naming its version and how
  to replace it.
* :meth:`Recogniser.transcribe` turns audio files or waveforms (no reference needed, any length,
  any rate, any channel count) into ``Transcription`` s with timed ``Word`` s
  (:mod:`fastasr.recognition.audio_decoding`): the API of ``fastasr-transcribe``
  (``fastasr.recognition.transcription_job``, docs/TRANSCRIBE.md).
  :meth:`Recogniser.decoder` picks the decoder (greedy, beam, beam + LM).

Scoring a labelled manifest (error rates against its transcripts) is the evaluation layer's:
``fastasr.recognition.scoring.decode_manifest``.

A checkpoint and audio are all transcription needs, beam search and LM included::

    rec = load_recogniser("best.ckpt", attention="i-clustered-100")
    texts = [t.text for t in rec.transcribe(["a.wav", "b.flac"], decoding="beam_lm")]
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from hydra.utils import get_class, instantiate

from fastasr.data.features import FeatureConfig
from fastasr.data.lexicon import Lexicon
from fastasr.data.tokenizer import Tokenizer, unit_metric
from fastasr.decoding.builder import build_decoder, build_lexicon, resolve_lm, resolve_source
from fastasr.lm.bundled import BundledLM
from fastasr.model import CTCModel
from fastasr.recognition.audio_decoding import Transcription, iter_transcriptions
from fastasr.recognition.bundle_format import (
    FORMAT,
    check_format,
    split_attention,
)
from fastasr.recognition.streaming import RecognitionStream, chunk_context

log = logging.getLogger(__name__)

RECOGNISER_KEY = "recogniser"  # the checkpoint entry
DEFAULT_MODEL_TARGET = "fastasr.model.CTCModel"  # the class of a training model config that names none


def model_class(target: str, where: str = "model._target_") -> type[CTCModel]:
    """The class a model config's ``_target_`` names: ``fastasr.model.CTCModel`` or a subclass
    (the interface training and decoding use), else a ValueError naming ``where``. Nothing else
    is ever built from a config or a checkpoint."""
    try:
        cls = get_class(str(target))
    except (ImportError, ValueError) as err:
        raise ValueError(f"{where} {target!r}: {err}; a recogniser builds {DEFAULT_MODEL_TARGET} "
                         "or a subclass of it") from None
    if not issubclass(cls, CTCModel):
        raise ValueError(f"{where} {target!r} is not a {DEFAULT_MODEL_TARGET} subclass; a recogniser builds "
                         f"{DEFAULT_MODEL_TARGET} or a subclass of it")
    return cls


@dataclass
class Recogniser:
    """A trained recogniser: configuration as plain data, plus the model once loaded.

    Attributes:
        model_config: the model's keyword arguments other than ``vocab_size``, ``feat_in``
            and ``attention`` (``d_model``, ``heads``, ``layers``, ``subsampling``, …).
        attention: the attention it was trained with: a spec string or a config mapping
            (``{"name": "clustered", "clusters": 100, ...}``).
        tokenizer: the output units (``vocab_size = len(tokenizer.vocab)``).
        features: the filterbank settings (``feat_in = features.num_mel_bins``).
        lexicon: the words and their unit spellings that decoding's ``lexicon.source=auto``
            uses (phoneme models: the pronunciations spoken in training; char models: the
            training words spelt); None: none (subword models).
        lexicon_source: what the lexicon was built from, e.g. ``train: /data/wsj/train.jsonl``.
        lm: the word LM that ``lm.source=auto`` (``decoding=beam_lm``) decodes with; None: none.
        model_target: the model class, as the model config's ``_target_`` names it
            (``fastasr.model.CTCModel`` or a subclass).
        training_manifest: the manifest it was trained on, where it is known here
            (``load_recogniser``'s ``training_manifest``; not written into checkpoints):
            what the lexicon sources ``train`` and ``spelling`` read, and what a checkpoint
            that carries no lexicon took its lexicon and LM from at load.
        model: the ``CTCModel`` with its weights (set by ``load_recogniser``, or by the
            LightningModule during training); None in a bare configuration.
    """

    model_config: dict[str, Any]
    attention: str | dict[str, Any]
    tokenizer: Tokenizer
    features: FeatureConfig
    lexicon: Lexicon | None = field(default=None, repr=False)
    lexicon_source: str | None = None
    lm: BundledLM | None = field(default=None, repr=False)
    model_target: str = DEFAULT_MODEL_TARGET
    model: CTCModel | None = field(default=None, repr=False, compare=False)
    training_manifest: str | None = field(default=None, compare=False)

    @classmethod
    def from_model_config(cls, model_config: Mapping[str, Any], tokenizer: Tokenizer,
                          features: FeatureConfig | Mapping[str, Any]) -> Recogniser:
        """From a resolved ``cfg.model`` mapping (``conf/model/*.yaml``, with ``attention``).

        The mapping is a Hydra partial: ``_target_`` names the model class (``fastasr.model.CTCModel``
        when absent; another must subclass it), ``_partial_`` says that ``vocab_size`` and
        ``feat_in`` are left out: they follow from the tokenizer and the features, and must not be
        given. :meth:`build_model` instantiates it.
        """
        config = dict(model_config)
        target = str(config.pop("_target_", None) or DEFAULT_MODEL_TARGET)
        config.pop("_partial_", None)  # always a partial: the sizes come from the data
        model_class(target)
        attention = split_attention(config)
        return cls(config, attention, tokenizer, FeatureConfig.from_dict(features), model_target=target)

    # ------------------------------------------------------------------ derived values
    @property
    def subsampling(self) -> int:
        """The model's frame-rate reduction (1 = none); the only home of this number."""
        return int(self.model_config.get("subsampling", 1))

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer.vocab)

    @property
    def feat_in(self) -> int:
        return self.features.num_mel_bins

    @property
    def unit_metric(self) -> str:
        """``per`` for phoneme models, ``cer`` for character (and subword) models."""
        return unit_metric(self.tokenizer.kind)

    def build_model(self) -> CTCModel:
        """A new model of this configuration (fresh weights, CMVN at 0/1, train mode): Hydra
        instantiates ``model_target`` with ``model_config`` and ``attention`` as a partial, which
        is completed with ``vocab_size`` (the tokenizer's) and ``feat_in`` (the features' bins).
        The config's values are passed as they are (``_recursive_=False``): a checkpoint names one
        class, which must be a ``CTCModel`` subclass (:func:`model_class`)."""
        model_class(self.model_target)
        config = {"_target_": self.model_target, **self.model_config, "attention": self.attention}
        build = instantiate(config, _partial_=True, _recursive_=False, _convert_="all")
        return build(vocab_size=self.vocab_size, feat_in=self.feat_in)

    def with_model(self, model: CTCModel) -> Recogniser:
        """A copy of this bundle carrying ``model``."""
        return replace(self, model=model)

    # ------------------------------------------------------------------ plain data
    def to_dict(self) -> dict[str, Any]:
        """The bundle as plain data (str/int/float/bool/None/list/dict), as written into
        checkpoints under ``checkpoint["recogniser"]``; the model's weights are not in it.

        ``model``: the model config with its class, ``{"_target_", **model_config}``;
        ``lexicon``: ``{"source", "entries": ["word<TAB>units<TAB>count", ...]}`` or None;
        ``lm``: :meth:`fastasr.lm.BundledLM.to_dict` (path, sha256, size, the ARPA text when
        embedded) or None: None where the run had none."""
        lexicon = None
        if self.lexicon is not None:
            lexicon = {"source": self.lexicon_source, "entries": self.lexicon.lines(with_counts=True)}
        return {
            "format": FORMAT,
            "model": {"_target_": self.model_target, **_plain(self.model_config, "model")},
            "attention": _plain(self.attention, "attention"),
            "tokenizer": self.tokenizer.state_dict(),
            "features": asdict(self.features),
            "lexicon": lexicon,
            "lm": None if self.lm is None else self.lm.to_dict(),
        }

    @classmethod
    def from_dict(cls, state: Mapping[str, Any], source: str = "recogniser") -> Recogniser:
        """Inverse of :meth:`to_dict`; errors name ``source`` (e.g. the checkpoint path) and the field."""
        missing = [k for k in ("model", "attention", "tokenizer", "features") if k not in state]
        if missing:
            raise ValueError(f"{source}: recogniser entry lacks {missing}; expected the keys of Recogniser.to_dict()")
        check_format(state, source)
        model_config = dict(state["model"])
        target = model_config.pop("_target_", None)
        if not target:
            raise ValueError(f"{source}: recogniser model entry names no class (_target_)")
        target = str(target)
        model_config.pop("_partial_", None)
        model_class(target, f"{source}: recogniser model._target_")
        lm = None if state.get("lm") is None else BundledLM.from_dict(state["lm"], source)
        try:
            tokenizer = Tokenizer.from_state_dict(dict(state["tokenizer"]))
            features = FeatureConfig.from_dict(state["features"])
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{source}: bad recogniser entry: {err}") from err
        lexicon, lexicon_source = None, None
        if state.get("lexicon") is not None:
            entry = state["lexicon"]
            if not isinstance(entry, Mapping) or not isinstance(entry.get("entries"), (list, tuple)):
                raise ValueError(f"{source}: bad recogniser lexicon entry; expected {{'source', 'entries': [lines]}}")
            lexicon = Lexicon.from_lines(entry["entries"], where=f"{source}: recogniser lexicon")
            lexicon_source = entry.get("source")
        return cls(model_config, state["attention"], tokenizer, features, lexicon, lexicon_source, lm,
                   model_target=target)

    # ------------------------------------------------------------------ transcription
    @property
    def frame_seconds(self) -> float:
        """Seconds per output frame of the model: subsampling × the features' frame shift."""
        return self.subsampling * self.features.frame_shift_ms / 1000.0

    def decoder(self, decoding: str | Mapping[str, Any] | Any | None = None, *, lexicon: Lexicon | None = None):
        """The decoder ``decoding`` names, with this recogniser's own lexicon and word LM: the one
        way every decoding path (evaluate.py, transcription, the tuner, the matrix, training's
        final decoding) gets its decoder (:func:`fastasr.decoding.builder.build_decoder`).

        ``decoding``: None or ``"greedy"``; ``"beam"`` (lexicon, no LM); ``"beam_lm"`` (lexicon
        and the word LM the checkpoint carries); a ``conf/decoding`` mapping; or a decoder
        already built (returned as it is: build a beam search once, decode many times).
        ``lexicon``: one already built (:meth:`decoding_lexicon`) instead of the spec's, so a
        grid of decoders shares it."""
        if callable(decoding) and hasattr(decoding, "describe"):
            return decoding
        decoder, _ = build_decoder(self.decoding_spec(decoding), self.tokenizer, self.training_manifest,
                                   lexicon=lexicon, bundled_lexicon=self.lexicon, bundled_lm=self.lm)
        return decoder

    def decoding_lexicon(self, spec: Mapping[str, Any] | None) -> Lexicon | None:
        """The lexicon a ``decoding.lexicon`` spec gives with this recogniser (None: none)."""
        return build_lexicon(spec, self.tokenizer, self.training_manifest, self.lexicon)

    def resolved_lexicon_source(self, spec: Mapping[str, Any] | None) -> str:
        """The source a ``decoding.lexicon`` spec's ``source`` stands for with this recogniser
        (``auto`` resolved: ``recogniser``, ``train``, ``spelling``, ``cmudict`` or ``none``)."""
        return resolve_source(dict(spec or {}).get("source", "auto"), self.tokenizer, self.training_manifest,
                              self.lexicon)

    def decoding_lm(self, spec: Mapping[str, Any] | None) -> str | BundledLM | None:
        """The word LM a ``decoding.lm`` spec gives with this recogniser: a file path, its own
        :class:`~fastasr.lm.BundledLM`, or None; ``FileNotFoundError`` when it asks for one
        this recogniser cannot have (:func:`fastasr.decoding.builder.resolve_lm`)."""
        return resolve_lm(spec, self.training_manifest, self.lm)

    @property
    def words_decoding(self) -> str:
        """The preset that gives real words with what this recogniser carries, as training's
        final decoding chooses: ``beam_lm`` with a lexicon and a word LM, ``beam`` with a lexicon
        alone, else ``greedy`` (a char model's words are real words either way; a subword or
        phoneme model without a lexicon has no other)."""
        if self.lexicon is None:
            return "greedy"
        return "beam_lm" if self.lm is not None else "beam"

    def decoding_spec(self, decoding: str | Mapping[str, Any] | None) -> dict[str, Any]:
        """A ``conf/decoding`` mapping for ``decoding``: a preset name (``greedy``, ``beam``,
        ``beam_lm``, or ``auto``: :attr:`words_decoding`), a mapping (``name: auto`` becomes
        :attr:`words_decoding`'s preset), or None (greedy)."""
        if decoding is None or isinstance(decoding, str):
            name = decoding or "greedy"
            if name not in DECODING_PRESETS and name != "auto":
                raise ValueError(f"decoding={name!r}; expected one of {sorted([*DECODING_PRESETS, 'auto'])}, a "
                                 "conf/decoding mapping or a decoder")
            decoding = {"name": name}
        decoding = dict(decoding)
        if decoding.get("name") != "auto":
            return dict(DECODING_PRESETS[decoding["name"]]) if set(decoding) == {"name"} else decoding
        # auto: conf/decoding/auto.yaml's keys (beam_lm's, maybe overridden) for the decoding chosen
        lexicon = dict(decoding.get("lexicon") or {})
        no_lexicon = lexicon.get("source") == "none" and not lexicon.get("path")
        chosen = "greedy" if no_lexicon else self.words_decoding
        if chosen == "greedy":
            return {"name": "greedy", **({"lexicon": lexicon} if lexicon else {})}
        spec = {**DECODING_PRESETS[chosen], **{k: v for k, v in decoding.items() if k != "name"}, "name": "beam"}
        if chosen == "beam":  # a lexicon, no LM
            spec["lm"] = {"source": "none", "path": None}
        return spec

    def transcribe(self, audio: Any, batch_size: int = 4, *, sample_rate: int | None = None,
                   decoding: str | Mapping[str, Any] | Any | None = None,
                   long_form: Mapping[str, Any] | Any | None = None, device: str | torch.device | None = None,
                   num_workers: int = 0, progress: bool = False, on_bad_audio: str = "skip",
                   seed: int | None = None) -> list[Transcription]:
        """Transcribe audio files or waveforms: one :class:`Transcription` per input, in order.

            rec = load_recogniser("best.ckpt")
            for t in rec.transcribe(["a.wav", "b.flac"], batch_size=8, decoding="beam_lm"):
                print(t.text, [(w.word, w.start, w.end) for w in t.words])
            rec.transcribe(waveform, sample_rate=8000)   # (T,) or (C, T) tensor / numpy array

        Args:
            audio: a path, a waveform (``torch.Tensor`` / ``numpy`` array, with ``sample_rate``),
                a :class:`fastasr.data.recordings.Recording`, or a list of them. Audio of any rate
                is resampled to the recogniser's; any channel count is mixed down to mono.
            batch_size: recordings (or windows of long ones) run through the model together.
            sample_rate: the rate (Hz) of the waveforms given.
            decoding: greedy (default), ``beam``, ``beam_lm``, a ``conf/decoding`` mapping or a
                decoder (:meth:`decoder`).
            long_form: how a recording reaches the model, ``{"mode": auto | one_pass |
                windowed, "window_s", "overlap_s"}`` (:class:`fastasr.decoding.long_form.LongFormConfig`).
            device: ``cpu``, ``gpu``/``cuda`` or ``auto``; None: where the model is. The model
                is moved there.
            num_workers: processes reading audio and computing features.
            progress: show a progress bar (stderr).
            on_bad_audio: ``skip``: an unusable input gives a Transcription whose ``error`` says
                why (the others are transcribed); ``raise``: it raises ``BadAudioError``.
            seed: seeds torch's RNG first (the randomised attentions' hashing).

        Word times come from a forced alignment of the hypothesis' units against the
        log-probabilities (:mod:`fastasr.decoding.alignment`).
        """
        return list(self.iter_transcribe(audio, batch_size, sample_rate=sample_rate, decoding=decoding,
                                         long_form=long_form, device=device, num_workers=num_workers,
                                         progress=progress, on_bad_audio=on_bad_audio, seed=seed))

    def iter_transcribe(self, audio: Any, batch_size: int = 4, *, sample_rate: int | None = None,
                        decoding: str | Mapping[str, Any] | Any | None = None,
                        long_form: Mapping[str, Any] | Any | None = None, device: str | torch.device | None = None,
                        num_workers: int = 0, progress: bool = False, on_bad_audio: str = "skip",
                        seed: int | None = None) -> Iterator[Transcription]:
        """:meth:`transcribe`, yielding each :class:`Transcription` as soon as its batch is decoded
        (in input order): what ``fastasr-transcribe`` prints and writes as it goes."""
        return iter_transcriptions(self, audio, batch_size, sample_rate=sample_rate, decoding=decoding,
                                   long_form=long_form, device=device, num_workers=num_workers, progress=progress,
                                   on_bad_audio=on_bad_audio, seed=seed)


    def stream(self, chunk: float = 0.64, left: float | str | None = "auto",
               decoding: str | Mapping[str, Any] | Any | None = None, stream_id: str = "stream") -> RecognitionStream:
        """Recognise audio as it arrives, ``chunk`` seconds at a time (a
        :class:`fastasr.recognition.streaming.RecognitionStream`)::

            stream = rec.stream(chunk=0.64, decoding="beam_lm")
            for piece in microphone():                  # (T,) float at rec.features.sample_rate
                if (partial := stream.accept(piece)):
                    print(partial.text)
            print(stream.finish().text)                 # the final words, timed

        ``left``: seconds of left context (rounded up to whole chunks); ``"auto"``: the model's
        training left context when it trained with chunks, else 10 s
        (:data:`fastasr.recognition.streaming.DEFAULT_LEFT_SECONDS`), so a chunk costs the same
        however long the stream; ``"all"`` or None: every earlier frame
        (:func:`fastasr.recognition.streaming.chunk_context`). The final words equal the
        simulated chunked decoding's (:meth:`set_chunked_decoding`). ``attention=auto`` is refused
        (:meth:`check_chunked_attention`)."""
        self.check_chunked_attention()
        return RecognitionStream(self, chunk_context(self, chunk, left), decoding, stream_id)

    def set_chunked_decoding(self, chunk: float | None, left: float | str | None = "auto") -> None:
        """Decode whole recordings as a stream of ``chunk`` seconds would see them, batched
        (``CTCModel.set_decoding_context``): what ``evaluate.py chunk=...`` scores; None: full context.
        ``attention=auto`` is refused (:meth:`check_chunked_attention`)."""
        if self.model is None:
            raise ValueError("set_chunked_decoding: the recogniser has no model; get one from load_recogniser(ckpt_path)")
        if chunk is not None:
            self.check_chunked_attention()
        self.model.set_decoding_context(None if chunk is None else chunk_context(self, chunk, left))

    def check_chunked_attention(self) -> None:
        """Raise ``ValueError`` (one line) when the model's attention is ``auto``: it picks full or
        i-clustered attention by each call's padded length, which in a chunked context is the
        batch's longest window when simulated and the frames seen so far when streamed, so the two
        would decode differently."""
        inner = self.model.attention_layers()[0].inner if self.model is not None else None
        if inner is not None and inner.name == "auto":
            raise ValueError(f"attention {inner.spec} in a chunked context: auto picks full or "
                             f"{inner.approximate.spec} by each call's padded length (the batch's longest window "
                             "when simulated, the frames seen so far when streamed), so the two would differ; "
                             f"decode in chunks with attention=full or attention={inner.approximate.spec}")


# Decoders by name (Recogniser.decoder), as conf/decoding/{greedy,beam,beam_lm}.yaml with their defaults.
DECODING_PRESETS: dict[str, dict[str, Any]] = {
    "greedy": {"name": "greedy"},
    "beam": {"name": "beam"},
    "beam_lm": {"name": "beam", "lm": {"source": "auto"}},
}





def _plain(value: Any, where: str) -> Any:
    """``value`` as plain containers, or a ValueError naming the first non-plain entry."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise ValueError(f"recogniser {where}: {type(value).__name__} {value!r}; expected plain data")
