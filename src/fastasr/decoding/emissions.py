"""Decode and score a manifest: the model's log-probabilities (:func:`iter_emissions`), any
decoder over them (:func:`transcribe`), error rates with their breakdown (:func:`score`) and
the per-utterance files; :func:`decode_and_score` does all of it, one batch at a time, and is
what :func:`fastasr.recognition.scoring.decode_manifest` (so evaluate.py, the matrix and training's
final decoding) runs.

A tuning grid keeps the emissions (:func:`compute_emissions`) and re-runs only the search.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from fastasr.data.lexicon import Lexicon, words_of
from fastasr.data.tokenizer import Tokenizer
from fastasr.data.tokenizer import unit_metric as unit_metric_of
from fastasr.decoding.hypothesis import Hypothesis
from fastasr.decoding.metrics import Alignment, Transcript, align
from fastasr.decoding.recognition_files import write_recognition_files
from fastasr.progress import progress_bar

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


def decoding_device(accelerator: str = "auto") -> torch.device:
    """The device to decode on: ``cpu``; ``gpu``/``cuda`` (an error without one); ``auto``:
    the GPU when there is one, else the CPU."""
    if accelerator == "cpu":
        return torch.device("cpu")
    if accelerator in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"accelerator={accelerator}: no CUDA device; use accelerator=cpu or auto")
        return torch.device("cuda")
    if accelerator == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    raise ValueError(f"accelerator={accelerator!r}; expected cpu, gpu or auto")


def iter_emissions(model: torch.nn.Module, batches: Iterable[dict], tokenizer: Tokenizer,
                   device: str | torch.device = "cpu") -> Iterator[Emission]:
    """Run ``model`` (``forward(features, lengths) -> (log_probs (B,T',V), lengths (B,))``) over
    ``batches`` (the DataModule's batch dicts) and yield each utterance's log-probabilities,
    one batch at a time (the model is put in eval mode on ``device`` and restored after)."""
    was_training = model.training
    model.eval().to(device)
    try:
        for batch in batches:
            if not batch["ids"]:  # every utterance of it skipped for unusable audio (fastasr.data.bad_audio)
                continue
            with torch.inference_mode():
                log_probs, lengths = model(batch["features"].to(device), batch["feature_lengths"].to(device))
            yield from batch_emissions(batch, log_probs, lengths, tokenizer)
    finally:
        model.train(was_training)


def batch_emissions(batch: Mapping[str, Any], log_probs: torch.Tensor, lengths: torch.Tensor,
                    tokenizer: Tokenizer) -> list[Emission]:
    """Each utterance of a batch (the DataModule's batch dict) with the model's output for it:
    ``log_probs`` ``(B, T', V)`` and ``lengths`` ``(B,)``, as returned by the model (any device,
    any float type: each emission is float32 on the CPU). The one way model output meets its
    references: :func:`iter_emissions` (so evaluate.py) and the training module's validation and
    test (:class:`fastasr.training.lit.ASRLitModule`) both take it."""
    log_probs, lengths = log_probs.detach().float().cpu(), lengths.cpu()
    out = []
    for b, uid in enumerate(batch["ids"]):
        n = int(batch["target_lengths"][b])
        out.append(Emission(uid, batch["transcripts"][b], tokenizer.decode(batch["targets"][b, :n].tolist()),
                            log_probs[b, : int(lengths[b])].clone()))
    return out


def compute_emissions(model: torch.nn.Module, batches: Iterable[dict], tokenizer: Tokenizer,
                      device: str | torch.device = "cpu") -> list[Emission]:
    """Every utterance's :class:`Emission` (:func:`iter_emissions`), kept in memory for a
    search repeated over a grid (``(T, V)`` float32 each)."""
    return list(iter_emissions(model, batches, tokenizer, device))


def transcribe_one(emission: Emission, decoder: Decoder, tokenizer: Tokenizer) -> Transcript:
    """Decode one emission (:func:`transcript_of` its hypothesis)."""
    return transcript_of(emission, decoder(emission.log_probs), decoder, tokenizer)


def transcript_of(emission: Emission, hyp: Hypothesis, decoder: Decoder, tokenizer: Tokenizer) -> Transcript:
    """An emission's transcript with ``decoder``'s hypothesis of it. The reference words are real
    words (``words_of(transcript)``) when the decoder gives real words, else phonetic words (the
    reference units between boundaries)."""
    e = emission
    ref_words = words_of(e.transcript) if decoder.real_words else tokenizer.units_to_words(e.units)
    return Transcript(e.id, ref_words, hyp.words, e.units, hyp.units,
                      tokenizer.scored_units(e.units), tokenizer.scored_units(hyp.units), hyp.score)


def transcribe(emissions: Iterable[Emission], decoder: Decoder, tokenizer: Tokenizer) -> list[Transcript]:
    """:func:`transcribe_one` of every emission, searched by :func:`search_all`."""
    emissions = list(emissions)
    return [transcript_of(e, hyp, decoder, tokenizer)
            for e, hyp in zip(emissions, search_all(decoder, (e.log_probs for e in emissions)), strict=True)]


def search_all(decoder: Decoder, log_probs: Iterable[Any]) -> Iterator[Hypothesis]:
    """Each utterance's hypothesis, in order: by the decoder's own ``map`` where it has one (the
    beam search, over ``decoding.workers`` processes: :mod:`fastasr.decoding.parallel`), else
    one call each."""
    search = getattr(decoder, "map", None)
    return search(log_probs) if search is not None else (decoder(lp) for lp in log_probs)


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
                     device: str | torch.device = "cpu",
                     recognition_files: Mapping[str, str | os.PathLike] | None = None, *,
                     progress: bool = False, total: int | None = None, desc: str = "decode") -> dict[str, Any]:
    """Emissions → decoder → error rates, a batch at a time (→ the per-utterance files at
    ``recognition_files``, by kind, when given: :meth:`fastasr.rundir.RunDir.recognition_files`).
    ``progress``: a bar on stderr over the utterances (``total`` of them, ``desc`` before it),
    each step the model's forward pass when its batch comes up and the search
    (:func:`fastasr.progress.progress_bar`).

    Returns the :func:`score` result plus ``words`` ("real" | "phonetic"), ``decoding``
    (the decoder's settings), ``oov`` (when a lexicon is given: reference words it lacks),
    ``forward_seconds`` (model, features and data loading), ``search_seconds`` and
    ``decode_seconds`` (their sum), and for a decoder that scores its hypotheses (beam search)
    ``search_score``: the sum over utterances of the best hypothesis's score (emissions + LM
    weight × LM + word score). Two decodings of the same emissions with the same lexicon, LM
    and settings reach the same ``search_score`` even where they pick different hypotheses of
    equal score (the search breaks exact ties by memory order)."""
    unit_metric = unit_metric_of(tokenizer.kind)
    emissions = progress_bar(iter_emissions(model, batches, tokenizer, device), enabled=progress, total=total,
                             desc=desc, unit="utt")
    taken: deque[Emission] = deque()  # emissions whose hypotheses are still to come, in order
    forward = 0.0

    def log_probs() -> Iterator[torch.Tensor]:
        nonlocal forward
        while True:
            start = time.perf_counter()
            emission = next(emissions, None)
            forward += time.perf_counter() - start
            if emission is None:
                return
            taken.append(emission)
            yield emission.log_probs

    start = time.perf_counter()
    transcripts = [transcript_of(taken.popleft(), hyp, decoder, tokenizer) for hyp in search_all(decoder, log_probs())]
    search = time.perf_counter() - start - forward  # the search's own time, and its wait for its workers
    result, words, units = score(transcripts, unit_metric, keep_chunks=recognition_files is not None)
    result.update(words="real" if decoder.real_words else "phonetic", decoding=decoder.describe(),
                  forward_seconds=forward, search_seconds=search, decode_seconds=forward + search)
    if transcripts and all(t.score is not None for t in transcripts):
        result["search_score"] = math.fsum(t.score for t in transcripts)
    if decoder.lexicon is not None and decoder.real_words:
        oov = decoder.lexicon.oov(t.ref_words for t in transcripts)
        result["oov"] = {"words": oov.tokens, "missing": oov.oov_tokens, "rate": oov.rate,
                         "most_frequent": dict(oov.missing.most_common(20))}
        if oov.missing:
            log.warning("reference words: %s", oov.summary())
    if recognition_files is not None:
        paths = write_recognition_files({k: Path(p) for k, p in recognition_files.items()}, transcripts,
                                        words, units, unit_metric.upper())
        result["files"] = {k: str(p) for k, p in paths.items()}
    return result
