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
                word_scores: Sequence[float], extend_edges: int = 0) -> list[dict[str, float]]:
    """WER (and unit error rate) of the decoder ``decoder_for(lm_weight, word_score)`` gives, for
    every (lm_weight, word_score) of the grid, best first (lowest WER, then unit error rate; on a
    full tie the point searched first).
    ``decoder_for``: e.g. a recogniser's :meth:`~fastasr.recognition.recogniser.Recogniser.decoder` with
    the two weights set and one lexicon shared by the grid.

    ``extend_edges``: a best point on the edge of an axis of two values or more, with a lower WER
    than its neighbour on that axis, has not bracketed the optimum, so that axis grows by one
    value beyond the edge (by the spacing of its two outermost values there; an LM weight never
    below 0), and the new row or column is searched against every value of the other axis; again
    while the best stays on such an edge, up to ``extend_edges`` new values per axis (0: the grid
    as given). An axis along which the WER is flat (a tie with the neighbour) does not grow."""
    if extend_edges < 0:
        raise ValueError(f"extend_edges={extend_edges}; expected how many values each axis may grow past an "
                         "edge its best point sits on: an integer ≥ 0 (0: the grid as given)")
    unit_metric = unit_metric_of(tokenizer.kind)

    def rank(point: dict[str, float]) -> tuple[float, float]:
        return point["wer"], point[unit_metric]

    points: list[dict[str, float]] = []
    searched: set[tuple[float, float]] = set()

    def search(lms: Sequence[float], wss: Sequence[float]) -> None:
        for lm_weight in lms:
            for word_score in wss:
                if (lm_weight, word_score) in searched:
                    continue
                searched.add((lm_weight, word_score))
                start = time.perf_counter()
                decoder = decoder_for(lm_weight, word_score)
                result, _, _ = score(transcribe(emissions, decoder, tokenizer), unit_metric)
                points.append({"lm_weight": lm_weight, "word_score": word_score, "wer": result["wer"],
                               unit_metric: result[unit_metric], "seconds": time.perf_counter() - start})
                log.info("lm_weight=%g word_score=%g: WER %.2f", lm_weight, word_score, result["wer"])

    lms = list(dict.fromkeys(float(v) for v in lm_weights))
    wss = list(dict.fromkeys(float(v) for v in word_scores))
    search(lms, wss)
    grown = {"lm_weight": 0, "word_score": 0}
    while True:
        best = min(points, key=rank)
        lm, ws = best["lm_weight"], best["word_score"]
        wer = {(p["lm_weight"], p["word_score"]): p["wer"] for p in points}
        new_lm = (_beyond_edge({v: wer[v, ws] for v in lms}, lm, floor=0.0)
                  if grown["lm_weight"] < extend_edges else None)
        new_ws = _beyond_edge({v: wer[lm, v] for v in wss}, ws) if grown["word_score"] < extend_edges else None
        if new_lm is None and new_ws is None:
            break
        if new_lm is not None:
            grown["lm_weight"] += 1
            lms.append(new_lm)
            search([new_lm], wss)
        if new_ws is not None:
            grown["word_score"] += 1
            wss.append(new_ws)
            search(lms, [new_ws])
        log.info("grid extended past its edge: lm_weight %s, word_score %s", sorted(lms), sorted(wss))
    return sorted(points, key=rank)


def _beyond_edge(wer_along: dict[float, float], best: float, floor: float | None = None) -> float | None:
    """The next value past the edge of an axis that ``best`` sits on (the spacing of the two
    outermost values on that side; not below ``floor``), where the WER at ``best`` is lower than
    at its neighbour. ``wer_along``: value -> WER along the axis through the best point. None:
    ``best`` is inside, the axis has fewer than two values, the WER is flat towards the edge, or
    the edge is at the floor."""
    ordered = sorted(wer_along)
    if len(ordered) < 2 or best not in (ordered[0], ordered[-1]):
        return None
    if best == ordered[-1]:
        neighbour, beyond = ordered[-2], ordered[-1] + (ordered[-1] - ordered[-2])
    else:
        neighbour, beyond = ordered[1], ordered[0] - (ordered[1] - ordered[0])
        if floor is not None:
            beyond = max(beyond, floor)
        if beyond >= ordered[0]:
            return None
    return round(beyond, 6) if wer_along[best] < wer_along[neighbour] else None
