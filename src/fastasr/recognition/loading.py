"""Loading a recogniser from a training checkpoint, and the decoding data of its training manifest
(the lexicon and the word LM) that training attaches.

:func:`load_recogniser` reads a checkpoint with ``torch.load(weights_only=True)`` and returns the
bundle (``checkpoint["recogniser"]``: :class:`fastasr.recognition.recogniser.Recogniser`) with its
model (weights loaded, eval mode), optionally with another attention. :func:`with_decoding_data`
is what training calls at its start, so that checkpoints decode by beam search + LM without the
training data; :func:`with_training_manifest` tells a loaded recogniser the manifest it was
trained on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from fastasr.data.lexicon import Lexicon
from fastasr.data.tokenizer import Tokenizer
from fastasr.decoding.builder import build_lexicon, resolve_source
from fastasr.lm.bundled import BundledLM, ensure_corpus_lm
from fastasr.recognition.bundle_format import check_checkpoint_entry
from fastasr.recognition.recogniser import RECOGNISER_KEY, Recogniser

log = logging.getLogger(__name__)


def _manifest_lexicon(tokenizer: Tokenizer, train_manifest: str | os.PathLike) -> tuple[Lexicon, str] | None:
    """The lexicon decoding's ``lexicon.source=auto`` builds from ``train_manifest`` for a
    recogniser that carries none, with what it was built from (``Recogniser.lexicon_source``,
    e.g. ``train: /data/wsj/train.jsonl``); None where ``auto`` gives no lexicon (subword units)."""
    source = resolve_source("auto", tokenizer, train_manifest)
    if source == "none":
        return None
    return (build_lexicon({"source": source}, tokenizer, train_manifest),
            f"{source}: {Path(train_manifest).resolve()}")


def with_training_manifest(recogniser: Recogniser, train_manifest: str | os.PathLike | None) -> Recogniser:
    """``recogniser`` knowing the manifest it was trained on (:attr:`Recogniser.training_manifest`),
    which the lexicon sources ``train`` and ``spelling`` read (``decoding.lexicon.source``); the
    lexicon and LM it carries are unchanged."""
    if not train_manifest:
        return recogniser
    return replace(recogniser, training_manifest=str(train_manifest))


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
    if not train_manifest:
        return recogniser
    built = _manifest_lexicon(recogniser.tokenizer, train_manifest)
    if built is None:
        log.info("no lexicon for this %s model: the recogniser carries no lexicon nor word LM",
                 recogniser.tokenizer.kind)
        return recogniser
    lexicon, lexicon_source = built
    lm = None
    try:
        lm = BundledLM.from_file(lm_path if lm_path else ensure_corpus_lm(train_manifest, lm_dir))
    except (OSError, ValueError) as err:
        log.warning("the recogniser carries no word LM (decoding=beam_lm will need decoding.lm.path): %s", err)
    if lm is not None:
        log.info("recogniser: lexicon of %d words (%s), word LM %s (%s)", len(lexicon), lexicon_source, lm.path,
                 "embedded" if lm.embedded else f"{lm.size / 2**20:.0f} MiB, referenced by path and sha256")
    return replace(recogniser, lexicon=lexicon, lexicon_source=lexicon_source, lm=lm,
                   training_manifest=str(train_manifest))


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu"
                    ) -> tuple[Recogniser, dict[str, torch.Tensor]]:
    """A training checkpoint read with ``torch.load(weights_only=True)``: its recogniser bundle
    (no model yet) and its model's weights by parameter name (``state_dict``'s ``model.*``
    entries, the prefix dropped; empty when it holds none)."""
    checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    state = check_checkpoint_entry(checkpoint, RECOGNISER_KEY, str(path))
    weights = {k.removeprefix("model."): v for k, v in checkpoint.get("state_dict", {}).items()
               if k.startswith("model.")}
    return Recogniser.from_dict(state, source=str(path)), weights


def load_recogniser(ckpt_path: str | os.PathLike, attention: str | Mapping[str, Any] | None = None,
                    map_location: str | torch.device = "cpu", *,
                    training_manifest: str | os.PathLike | None = None) -> Recogniser:
    """Read a training checkpoint (``torch.load(weights_only=True)``) into a :class:`Recogniser`
    whose ``model`` carries the trained weights (CMVN included), in eval mode, on ``map_location``.

    ``attention``: decode with another attention (spec string or mapping) instead of the
    one the model was trained with; the weights are the same. ``training_manifest``: the
    manifest it was trained on (``data.train_manifest``), for the lexicon sources that read it
    (:func:`with_training_manifest`).
    """
    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"ckpt_path={ckpt_path}: no such checkpoint file")
    recogniser, weights = read_checkpoint(path, map_location)
    model = recogniser.build_model()
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:
        raise ValueError(f"{path}: the weights do not fit the recogniser's model config: {err}") from err
    if attention is not None:
        model.set_attention(attention)
    return with_training_manifest(recogniser, training_manifest).with_model(model.to(map_location).eval())
