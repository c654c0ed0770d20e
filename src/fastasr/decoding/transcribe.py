"""Decode and score a manifest: the model's log-probabilities once (:func:`compute_emissions`),
then any decoder over them (:func:`transcribe`), error rates with their breakdown
(:func:`score`) and the per-utterance files (:func:`decode_and_score` does all four).

Computing the emissions once lets a tuning grid re-run only the search.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from fastasr.config import unit_metric as unit_metric_of
from fastasr.data.tokenizer import Tokenizer
from fastasr.decoding.hypothesis import Hypothesis
from fastasr.decoding.lexicon import Lexicon, words_of
from fastasr.decoding.metrics import Alignment, align
from fastasr.decoding.recognition_files import write_recognition_files

log = logging.getLogger(__name__)


class Decoder(Protocol):
    """What :func:`transcribe` needs of a decoder (``GreedyDecoder``, ``BeamSearchDecoder``)."""

    real_words: bool
    lexicon: Lexicon | None  # the words it can emit (None: any)

    def __call__(self, log_probs: torch.Tensor) -> Hypothesis: ...

    def describe(self) -> dict: ...


@dataclass
class Emission:
    """One utterance's model output: ``log_probs`` (T, V) float32 on the CPU, its reference
    ``transcript`` (the manifest text) and reference ``units`` (with word boundaries)."""

    id: str
    transcript: str
    units: list[str]
    log_probs: torch.Tensor


@dataclass
class Transcript:
    """One decoded utterance beside its reference. ``*_units`` keep their word boundaries (for
    reading); ``*_scored_units`` are what the unit error rate scores (:func:`scored_units`)."""

    id: str
    ref_words: list[str]
    hyp_words: list[str]
    ref_units: list[str]
    hyp_units: list[str]
    ref_scored_units: list[str]
    hyp_scored_units: list[str]


def scored_units(tokenizer: Tokenizer, units: list[str]) -> list[str]:
    """The units PER/CER is computed on: word boundaries dropped (as training's scoring)."""
    return [u for u in units if u != tokenizer.word_boundary]


@torch.inference_mode()
def compute_emissions(model: torch.nn.Module, batches: Iterable[dict], tokenizer: Tokenizer,
                      device: str | torch.device = "cpu") -> list[Emission]:
    """Run ``model`` (``forward(features, lengths) -> (log_probs (B,T',V), lengths (B,))``) over
    ``batches`` (the DataModule's batch dicts) and keep each utterance's log-probabilities."""
    was_training = model.training
    model.eval().to(device)
    out: list[Emission] = []
    try:
        for batch in batches:
            log_probs, lengths = model(batch["features"].to(device), batch["feature_lengths"].to(device))
            log_probs, lengths = log_probs.float().cpu(), lengths.cpu()
            for b, uid in enumerate(batch["ids"]):
                n = int(batch["target_lengths"][b])
                out.append(Emission(uid, batch["transcripts"][b], tokenizer.decode(batch["targets"][b, :n].tolist()),
                                    log_probs[b, : int(lengths[b])].clone()))
    finally:
        model.train(was_training)
    return out


def transcribe(emissions: Sequence[Emission], decoder: Decoder, tokenizer: Tokenizer) -> list[Transcript]:
    """Decode every emission. References are real words (``words_of(transcript)``) when the
    decoder gives real words, else phonetic words (the reference units between boundaries)."""
    out = []
    for e in emissions:
        hyp = decoder(e.log_probs)
        ref_words = words_of(e.transcript) if decoder.real_words else tokenizer.units_to_words(e.units)
        out.append(Transcript(e.id, ref_words, hyp.words, e.units, hyp.units,
                              scored_units(tokenizer, e.units), scored_units(tokenizer, hyp.units)))
    return out


def score(transcripts: Sequence[Transcript], unit_metric: str = "per",
          keep_chunks: bool = False) -> tuple[dict[str, Any], Alignment, Alignment]:
    """Corpus error rates: ``{unit_metric, "wer", "wer_breakdown", f"{unit_metric}_breakdown",
    "utterances"}`` (percentages; breakdown = substitutions, deletions, insertions, reference
    length), and the word and unit alignments."""
    words = align([t.ref_words for t in transcripts], [t.hyp_words for t in transcripts], keep_chunks)
    units = align([t.ref_scored_units for t in transcripts], [t.hyp_scored_units for t in transcripts], keep_chunks)
    result = {unit_metric: units.rate, "wer": words.rate, "wer_breakdown": words.breakdown(),
              f"{unit_metric}_breakdown": units.breakdown(), "utterances": len(transcripts)}
    return result, words, units


def decode_and_score(model: torch.nn.Module, batches: Iterable[dict], tokenizer: Tokenizer, decoder: Decoder,
                     device: str | torch.device = "cpu", out_dir: str | Path | None = None,
                     tag: str = "test") -> dict[str, Any]:
    """Emissions → decoder → error rates (→ recogs/errs files in ``out_dir`` when given).

    Returns the :func:`score` result plus ``words`` ("real" | "phonetic"), ``decoding``
    (the decoder's settings), ``oov`` (when a lexicon is given: reference words it lacks),
    ``forward_seconds``, ``search_seconds`` and ``decode_seconds`` (their sum)."""
    unit_metric = unit_metric_of(tokenizer.kind)
    start = time.perf_counter()
    emissions = compute_emissions(model, batches, tokenizer, device)
    forward = time.perf_counter() - start
    start = time.perf_counter()
    transcripts = transcribe(emissions, decoder, tokenizer)
    search = time.perf_counter() - start
    result, words, units = score(transcripts, unit_metric, keep_chunks=out_dir is not None)
    result.update(words="real" if decoder.real_words else "phonetic", decoding=decoder.describe(),
                  forward_seconds=forward, search_seconds=search, decode_seconds=forward + search)
    if decoder.lexicon is not None and decoder.real_words:
        oov = decoder.lexicon.oov(t.ref_words for t in transcripts)
        result["oov"] = {"words": oov.tokens, "missing": oov.oov_tokens, "rate": oov.rate,
                         "most_frequent": dict(oov.missing.most_common(20))}
        if oov.missing:
            log.warning("reference words: %s", oov.summary())
    if out_dir is not None:
        paths = write_recognition_files(out_dir, tag, transcripts, words, units, unit_metric.upper())
        result["files"] = {k: str(p) for k, p in paths.items()}
    return result
