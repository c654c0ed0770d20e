"""The recogniser bundle: what a trained model needs to decode, travelling as one piece.

A :class:`Recogniser` holds the model config (the ``CTCModel`` arguments other than
``vocab_size``, ``feat_in`` and ``attention``; the subsampling factor lives here, as
``model_config["subsampling"]``), the attention the model was trained with, the tokenizer,
the filterbank settings, and what word decoding needs: the lexicon (words and their unit
spellings, built from the training manifest) and the word n-gram LM (its ARPA text, or its
path and hash when large: :class:`fastasr.lm.BundledLM`). The global CMVN statistics are
buffers of the model, so they are in the checkpoint's weights and nowhere else.

* Training makes the bundle at its start (``fastasr.training.build_module``:
  :func:`with_decoding_data` adds the lexicon and the LM) and writes it into every checkpoint
  once, as plain data: ``checkpoint["recogniser"]`` (:meth:`Recogniser.to_dict`, by
  ``ASRLitModule.on_save_checkpoint``). Checkpoints written before the lexicon and LM travelled
  with the model load as before, without them (decoding then reads the training manifest, if given).
* :func:`load_recogniser` reads a checkpoint with ``torch.load(weights_only=True)`` and
  returns the bundle with its model (weights loaded, eval mode).
* :func:`decoding_loader` builds the dataloader of any manifest with the bundle's tokenizer,
  features and subsampling; :func:`decode_manifest` decodes (greedy or beam search,
  ``fastasr.decoding``) and scores a manifest.

A checkpoint plus a manifest is all decoding needs, beam search and LM included::

    rec = load_recogniser("best.ckpt", attention="i-clustered-100")
    result = decode_manifest(rec, "test.jsonl")      # {"per", "wer", "utterances", ...}
    result = decode_manifest(rec, "test.jsonl", decoding={"name": "beam", "lm": {"source": "auto"}})
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from fastasr.data.features import FeatureConfig
from fastasr.data.tokenizer import Tokenizer
from fastasr.decoding.lexicon import Lexicon
from fastasr.lm.bundled import BundledLM
from fastasr.model import CTCModel

log = logging.getLogger(__name__)

RECOGNISER_KEY = "recogniser"  # the checkpoint entry
FORMAT = 1  # version of the plain-data layout below
_MODEL_TARGETS = ("fastasr.model.CTCModel", "fastasr.model.ctc_model.CTCModel")
_DERIVED = ("vocab_size", "feat_in")  # come from the tokenizer and the features
# Batching keys of a data config (conf/data/*.yaml) that decoding uses.
_LOADER_KEYS = ("max_frames_per_batch", "max_batch_size", "num_workers", "on_bad_utterance")


@dataclass
class Recogniser:
    """A trained recogniser: configuration as plain data, plus the model once loaded.

    Attributes:
        model_config: ``CTCModel`` keyword arguments other than ``vocab_size``, ``feat_in``
            and ``attention`` (``d_model``, ``heads``, ``layers``, ``subsampling``, …).
        attention: the attention it was trained with: a spec string or a config mapping
            (``{"name": "clustered", "clusters": 100, ...}``).
        tokenizer: the output units (``vocab_size = len(tokenizer.vocab)``).
        features: the filterbank settings (``feat_in = features.num_mel_bins``).
        lexicon: the words and their unit spellings that decoding's ``lexicon.source=auto``
            uses (phoneme models: the pronunciations spoken in training; char models: the
            training words spelt); None: none (subword models; checkpoints written before).
        lexicon_source: what the lexicon was built from, e.g. ``train: /data/wsj/train.jsonl``.
        lm: the word LM that ``lm.source=auto`` (``decoding=beam_lm``) decodes with; None: none.
        model: the ``CTCModel`` with its weights (set by :func:`load_recogniser`, or by the
            LightningModule during training); None in a bare configuration.
    """

    model_config: dict[str, Any]
    attention: str | dict[str, Any]
    tokenizer: Tokenizer
    features: FeatureConfig
    lexicon: Lexicon | None = field(default=None, repr=False)
    lexicon_source: str | None = None
    lm: BundledLM | None = field(default=None, repr=False)
    model: CTCModel | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_model_config(cls, model_config: Mapping[str, Any], tokenizer: Tokenizer,
                          features: FeatureConfig | Mapping[str, Any]) -> Recogniser:
        """From a resolved ``cfg.model`` mapping (``conf/model/*.yaml``, with ``attention``).

        ``_target_``, when given, must name ``fastasr.model.CTCModel``; ``vocab_size`` and
        ``feat_in`` must not be given (they follow from the tokenizer and the features).
        """
        config = dict(model_config)
        target = config.pop("_target_", None)
        if target is not None and target not in _MODEL_TARGETS:
            raise ValueError(f"model._target_ {target!r}; a recogniser builds {_MODEL_TARGETS[0]}")
        given = sorted(set(_DERIVED) & set(config))
        if given:
            raise ValueError(f"model config sets {given}; they come from the tokenizer and the features")
        if "attention" not in config:
            raise ValueError("model config has no 'attention'; expected a spec string or mapping")
        attention = config.pop("attention")
        return cls(config, attention, tokenizer, FeatureConfig.from_dict(features))

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
        """``per`` for phoneme models, ``cer`` for character models."""
        return "per" if self.tokenizer.kind == "phoneme" else "cer"

    def build_model(self) -> CTCModel:
        """A new ``CTCModel`` of this configuration (fresh weights, CMVN at 0/1, train mode)."""
        return CTCModel(vocab_size=self.vocab_size, feat_in=self.feat_in, attention=self.attention,
                        **self.model_config)

    def with_model(self, model: CTCModel) -> Recogniser:
        """A copy of this bundle carrying ``model``."""
        return replace(self, model=model)

    # ------------------------------------------------------------------ plain data
    def to_dict(self) -> dict[str, Any]:
        """The bundle as plain data (str/int/float/bool/None/list/dict), as written into
        checkpoints under ``checkpoint["recogniser"]``; the model's weights are not in it.

        ``lexicon``: ``{"source", "entries": ["word<TAB>units<TAB>count", ...]}`` or None;
        ``lm``: :meth:`fastasr.lm.BundledLM.to_dict` (path, sha256, size, the ARPA text when
        embedded) or None. Both keys are optional on reading (older checkpoints lack them)."""
        lexicon = None
        if self.lexicon is not None:
            lexicon = {"source": self.lexicon_source, "entries": self.lexicon.lines(with_counts=True)}
        return {
            "format": FORMAT,
            "model": _plain(self.model_config, "model"),
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
        if state.get("format", FORMAT) > FORMAT:
            raise ValueError(f"{source}: recogniser format {state['format']}; this fastasr reads up to {FORMAT}")
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
        lm = None if state.get("lm") is None else BundledLM.from_dict(state["lm"], source)
        return cls(dict(state["model"]), state["attention"], tokenizer, features, lexicon, lexicon_source, lm)


def with_decoding_data(recogniser: Recogniser, train_manifest: str | os.PathLike | None, *,
                       lm_path: str | os.PathLike | None = None,
                       lm_dir: str | os.PathLike | None = None) -> Recogniser:
    """``recogniser`` with the lexicon and word LM of its training data (training calls this at
    its start, so that checkpoints decode by beam search + LM without the training data).

    The lexicon is what decoding's ``lexicon.source=auto`` builds from ``train_manifest``
    (``fastasr.decoding.builder``: a phoneme model's pronunciations spoken in training, a char
    model's training words spelt, CMUdict for ARPAbet units); none for a subword model. The LM
    (only with a lexicon) is ``lm_path`` when given, else the corpus's word 3-gram
    ``lm/words-3gram.arpa`` beside the manifest, estimated from its transcripts when it does
    not exist (in ``lm_dir/lm/`` when the corpus directory is read-only:
    :func:`fastasr.lm.ensure_corpus_lm`); embedded when small (:class:`fastasr.lm.BundledLM`).
    An LM that cannot be had is left out with a warning (training goes on)."""
    from fastasr.decoding.builder import build_lexicon, resolve_source
    from fastasr.lm.bundled import ensure_corpus_lm

    if not train_manifest:
        return recogniser
    source = resolve_source("auto", recogniser.tokenizer, train_manifest)
    if source == "none":
        log.info("no lexicon for this %s model: the recogniser carries no lexicon nor word LM",
                 recogniser.tokenizer.kind)
        return recogniser
    lexicon = build_lexicon({"source": source}, recogniser.tokenizer, train_manifest)
    lm = None
    try:
        lm = BundledLM.from_file(lm_path if lm_path else ensure_corpus_lm(train_manifest, lm_dir))
    except (OSError, ValueError) as err:
        log.warning("the recogniser carries no word LM (decoding=beam_lm will need decoding.lm.path): %s", err)
    if lm is not None:
        log.info("recogniser: lexicon of %d words (%s), word LM %s (%s)", len(lexicon), source, lm.path,
                 "embedded" if lm.embedded else f"{lm.size / 2**20:.0f} MiB, referenced by path and sha256")
    return replace(recogniser, lexicon=lexicon, lexicon_source=f"{source}: {Path(train_manifest).resolve()}", lm=lm)


def _plain(value: Any, where: str) -> Any:
    """``value`` as plain containers, or a ValueError naming the first non-plain entry."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise ValueError(f"recogniser {where}: {type(value).__name__} {value!r}; expected plain data")


def _legacy_state(hparams: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The recogniser entry of a checkpoint written before ``checkpoint["recogniser"]``
    existed (then the LightningModule's hyper-parameters held model, tokenizer, feat_in, features)."""
    if not hparams or not {"model", "tokenizer", "feat_in"} <= set(hparams):
        return None
    features = dict(hparams.get("features") or {"num_mel_bins": int(hparams["feat_in"])})
    tokenizer = Tokenizer.from_state_dict(dict(hparams["tokenizer"]))
    return Recogniser.from_model_config(hparams["model"], tokenizer, features).to_dict()


# ---------------------------------------------------------------------- loading
def load_recogniser(ckpt_path: str | os.PathLike, attention: str | Mapping[str, Any] | None = None,
                    map_location: str | torch.device = "cpu") -> Recogniser:
    """Read a training checkpoint (``torch.load(weights_only=True)``) into a :class:`Recogniser`
    whose ``model`` carries the trained weights (CMVN included), in eval mode, on ``map_location``.

    ``attention``: decode with another attention (spec string or mapping) instead of the
    one the model was trained with; the weights are the same.
    """
    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"ckpt_path={ckpt_path}: no such checkpoint file")
    checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    state = checkpoint.get(RECOGNISER_KEY) or _legacy_state(checkpoint.get("hyper_parameters"))
    if state is None:
        raise ValueError(f"{path}: no '{RECOGNISER_KEY}' entry; expected a checkpoint written by fastasr training")
    recogniser = Recogniser.from_dict(state, source=str(path))
    model = recogniser.build_model()
    weights = {k.removeprefix("model."): v for k, v in checkpoint.get("state_dict", {}).items()
               if k.startswith("model.")}
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:
        raise ValueError(f"{path}: the weights do not fit the recogniser's model config: {err}") from err
    if attention is not None:
        model.set_attention(attention)
    return recogniser.with_model(model.to(map_location).eval())


# ---------------------------------------------------------------------- decoding
def decoding_options(data_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The batching options of a data config (``conf/data/*.yaml``) that
    :func:`decoding_loader` takes: frame budget, batch cap, workers, bad-utterance policy."""
    return {k: data_cfg[k] for k in _LOADER_KEYS if data_cfg.get(k) is not None}


def training_manifest(data_cfg: Mapping[str, Any]) -> str | None:
    """The training manifest of a data config (``data.train_manifest``), or None when it is
    unset (null or ``???``): training builds the recogniser's lexicon and LM from it; decoding
    reads it only for ``decoding.lexicon.source`` train/spelling, and for checkpoints that carry
    no lexicon or LM (``auto``); the vocabulary is the checkpoint's."""
    value = data_cfg.get("train_manifest")
    return None if value in (None, "???") else str(value)


def decoding_loader(recogniser: Recogniser, manifest: str | os.PathLike, *, max_frames_per_batch: int = 16000,
                    max_batch_size: int | None = None, num_workers: int = 0,
                    on_bad_utterance: str = "skip") -> torch.utils.data.DataLoader:
    """The evaluation dataloader of ``manifest`` with the recogniser's tokenizer, features and
    subsampling: batches as described in ``fastasr.data.datamodule`` (no shuffling, no
    filtering; utterances with units unknown to the tokenizer are skipped or raise)."""
    from fastasr.data.datamodule import ASRDataModule

    datamodule = ASRDataModule(
        tokenizer=recogniser.tokenizer.kind, vocab=recogniser.tokenizer, features=recogniser.features,
        subsampling_factor=recogniser.subsampling, max_frames_per_batch=max_frames_per_batch,
        max_batch_size=max_batch_size, num_workers=num_workers, on_bad_utterance=on_bad_utterance,
    )
    return datamodule.dataloader_for(manifest)


def decode_manifest(recogniser: Recogniser, manifest: str | os.PathLike, *, accelerator: str = "auto",
                    seed: int = 1234, decoding: Mapping[str, Any] | None = None,
                    train_manifest: str | os.PathLike | None = None, out_dir: str | os.PathLike | None = None,
                    **loader_options: Any) -> dict[str, Any]:
    """Decode and score ``manifest`` with ``recogniser.model`` (its current attention): the one
    decoding path of evaluate.py, the decoding tuner, the matrix and training's final decoding.

    Args:
        accelerator: ``cpu``, ``gpu`` or ``auto`` (the GPU when there is one).
        seed: fixes the randomised attentions' hashing.
        decoding: a ``conf/decoding`` mapping (``{"name": "beam", "lexicon": ..., "lm": ...,
            "beam_size": ...}``); None: greedy. ``lexicon.source`` / ``lm.source`` ``auto`` use
            the recogniser's own lexicon and word LM (``recogniser.lexicon`` / ``.lm``).
        train_manifest: where the lexicon of ``lexicon.source: train | spelling`` comes from (the
            words and pronunciations spoken in training), and ``auto``'s lexicon and LM for a
            recogniser that carries none (older checkpoints); None: no such lexicon.
        out_dir: a run directory to write the per-utterance ``recogs-*`` / ``errs-*`` files
            to (tag: the manifest's stem and the decoder's name, e.g. ``test-beam``); None: none.
        loader_options: the batching keyword arguments of :func:`decoding_loader`.

    Returns ``{"per" (or "cer"), "wer"`` (%), their ``*_breakdown`` (substitutions, deletions,
    insertions, reference length), ``"words"`` (``real`` or ``phonetic``), ``"decoding"`` (the
    decoder's settings), ``"oov"`` (with a lexicon), ``"utterances", "forward_seconds",
    "search_seconds", "decode_seconds", "attention"`` (spec string), ``"manifest"``, and
    ``"files"`` (with ``out_dir``), ``"skipped_utterances"`` and ``"skipped_audio"``
    (``{"id", "path", "reason"}`` of each utterance left out for unusable audio, by id)``}``.

    Unusable audio (``fastasr.data.bad_audio``) is skipped, counted and named in the result
    and the log (``on_bad_utterance="raise"``: the first one raises ``BadAudioError``); a
    manifest with no usable audio raises ``AllAudioBadError``.
    """
    import lightning as L

    from fastasr.data.bad_audio import SkippedAudio
    from fastasr.decoding.builder import build_decoder
    from fastasr.decoding.transcribe import decode_and_score, decoding_device
    from fastasr.rundir import RunDir

    if recogniser.model is None:
        raise ValueError("decode_manifest: the recogniser has no model; get one from load_recogniser(ckpt_path)")
    L.seed_everything(seed, workers=True)
    device = decoding_device(accelerator)
    decoder, _ = build_decoder(decoding, recogniser.tokenizer, train_manifest,
                               bundled_lexicon=recogniser.lexicon, bundled_lm=recogniser.lm)
    loader = decoding_loader(recogniser, manifest, **loader_options)
    tag = f"{Path(manifest).stem}-{decoder.describe()['name']}"
    files = RunDir(out_dir).recognition_files(tag) if out_dir is not None else None
    skipped = SkippedAudio(loader_options.get("on_bad_utterance", "skip"))
    result = decode_and_score(recogniser.model, skipped.batches(loader), recogniser.tokenizer, decoder, device, files)
    skipped_audio = skipped.finish(str(manifest))
    return dict(result, attention=recogniser.model.attention_spec, manifest=str(manifest),
                skipped_utterances=len(skipped_audio), skipped_audio=skipped_audio)
