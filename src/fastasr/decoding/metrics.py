"""Corpus-level error rates (edit distance from jiwer), accumulated over batches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import jiwer
import torch


def _edits(refs: list[str], hyps: list[str]) -> tuple[int, int]:
    """(edit operations, reference length) over a list of space-separated sentences."""
    pairs = [(r, h) for r, h in zip(refs, hyps)]
    nonempty = [(r, h) for r, h in pairs if r.strip()]
    ref_len = sum(len(r.split()) for r, _ in nonempty)
    if not nonempty:
        return 0, 0
    out = jiwer.process_words([r for r, _ in nonempty], [h for _, h in nonempty])
    return out.substitutions + out.deletions + out.insertions, ref_len


@dataclass
class ErrorRates:
    """Accumulates unit (phoneme or character) and word edit distances.

    ``update`` takes references and hypotheses as lists of tokens per utterance;
    ``compute`` returns percentages: ``{"uer": ..., "wer": ...}`` where the unit error
    rate is the PER for phoneme models and the CER for character models.
    """

    unit_edits: int = 0
    unit_total: int = 0
    word_edits: int = 0
    word_total: int = 0
    utterances: int = 0
    examples: list[tuple[str, str]] = field(default_factory=list)

    def update(
        self,
        ref_units: list[list[str]],
        hyp_units: list[list[str]],
        ref_words: list[list[str]],
        hyp_words: list[list[str]],
        keep_examples: int = 0,
    ) -> None:
        e, n = _edits([" ".join(u) for u in ref_units], [" ".join(u) for u in hyp_units])
        self.unit_edits += e
        self.unit_total += n
        e, n = _edits([" ".join(w) for w in ref_words], [" ".join(w) for w in hyp_words])
        self.word_edits += e
        self.word_total += n
        self.utterances += len(ref_units)
        for r, h in zip(ref_words, hyp_words):
            if len(self.examples) >= keep_examples:
                break
            self.examples.append((" ".join(r), " ".join(h)))

    def summed_over_processes(self, all_reduce_sum: Callable[[torch.Tensor], torch.Tensor]) -> ErrorRates:
        """These counts summed over every process (DDP rank), so that :meth:`compute` gives the
        corpus-level rates of all ranks' utterances, not a mean of per-rank rates.

        Args:
            all_reduce_sum: sums an int64 tensor ``(5,)`` over processes (e.g.
                ``lambda t: trainer.strategy.reduce(t, reduce_op="sum")``).
        The examples stay this process's own.
        """
        counts = torch.tensor([self.unit_edits, self.unit_total, self.word_edits, self.word_total,
                               self.utterances], dtype=torch.int64)
        total = [int(x) for x in all_reduce_sum(counts).tolist()]
        return ErrorRates(*total, examples=list(self.examples))

    def compute(self) -> dict[str, float]:
        def rate(e: int, n: int) -> float:
            return 100.0 * e / n if n else float("nan")

        return {
            "uer": rate(self.unit_edits, self.unit_total),
            "wer": rate(self.word_edits, self.word_total),
        }
