"""Search the beam search's LM weight and word score over fixed emissions.

:func:`grid_search` decodes the same emissions (:func:`fastasr.decoding.emissions.compute_emissions`)
once per (lm_weight, word_score) and scores each; the model does not run again.
:func:`fastasr.recognition.scoring.tune_recogniser` runs a recogniser over a manifest and searches its grid;
``python -m fastasr.cli.tune`` is the command.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from fastasr.data.tokenizer import Tokenizer
from fastasr.data.tokenizer import unit_metric as unit_metric_of
from fastasr.decoding.emissions import Decoder, Emission, score, transcribe

log = logging.getLogger(__name__)


def grid_search(emissions: Sequence[Emission], tokenizer: Tokenizer,
                decoder_for: Callable[[float, float], Decoder], lm_weights: Sequence[float],
                word_scores: Sequence[float]) -> list[dict[str, float]]:
    """WER (and unit error rate) of the decoder ``decoder_for(lm_weight, word_score)`` gives, for
    every (lm_weight, word_score) of the grid, best first (lowest WER, then unit error rate).
    ``decoder_for``: e.g. a recogniser's :meth:`~fastasr.recognition.recogniser.Recogniser.decoder` with
    the two weights set and one lexicon shared by the grid."""
    unit_metric = unit_metric_of(tokenizer.kind)
    points = []
    for lm_weight in lm_weights:
        for word_score in word_scores:
            start = time.perf_counter()
            decoder = decoder_for(float(lm_weight), float(word_score))
            result, _, _ = score(transcribe(emissions, decoder, tokenizer), unit_metric)
            point = {"lm_weight": float(lm_weight), "word_score": float(word_score), "wer": result["wer"],
                     unit_metric: result[unit_metric], "seconds": time.perf_counter() - start}
            log.info("lm_weight=%g word_score=%g: WER %.2f", lm_weight, word_score, result["wer"])
            points.append(point)
    return sorted(points, key=lambda p: (p["wer"], p[unit_metric]))
