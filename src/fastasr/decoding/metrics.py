"""Error rates from edit distances (jiwer): what is scored (:class:`Transcript`: one decoded
utterance beside its reference), corpus-level alignments and a per-batch accumulator."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import jiwer
import torch


@dataclass
class Transcript:
    """One decoded utterance beside its reference. ``*_units`` keep their word boundaries (for
    reading); ``*_scored_units`` are what the unit error rate scores (``Tokenizer.scored_units``:
    no boundaries, the scoring phone folding, a subword model's characters)."""

    id: str
    ref_words: list[str]
    hyp_words: list[str]
    ref_units: list[str]
    hyp_units: list[str]
    ref_scored_units: list[str]
    hyp_scored_units: list[str]
    score: float | None = None  # the decoder's score of the hypothesis (beam search); None: greedy


@dataclass
class Alignment:
    """Edit operations between reference and hypothesis token lists.

    ``chunks[i]`` holds utterance i's jiwer ``AlignmentChunk`` list (``type`` in
    equal/substitute/delete/insert, with reference and hypothesis index ranges)."""

    substitutions: int = 0
    deletions: int = 0
    insertions: int = 0
    reference_length: int = 0
    chunks: list[list] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def rate(self) -> float:
        """Errors per reference token, in percent (NaN with no reference tokens)."""
        return 100.0 * self.errors / self.reference_length if self.reference_length else float("nan")

    def breakdown(self) -> dict[str, float | int]:
        """``{"substitutions", "deletions", "insertions", "reference", "rate"}``."""
        return {"substitutions": self.substitutions, "deletions": self.deletions,
                "insertions": self.insertions, "reference": self.reference_length, "rate": self.rate}


def align(refs: list[list[str]], hyps: list[list[str]], keep_chunks: bool = False) -> Alignment:
    """Align each reference token list with its hypothesis (Levenshtein, jiwer).

    An empty reference counts its hypothesis as insertions."""
    if len(refs) != len(hyps):
        raise ValueError(f"{len(refs)} references but {len(hyps)} hypotheses")
    if not refs:
        return Alignment()
    out = jiwer.process_words([" ".join(r) for r in refs], [" ".join(h) for h in hyps])
    return Alignment(out.substitutions, out.deletions, out.insertions, sum(len(r) for r in refs),
                     out.alignments if keep_chunks else [])


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
        units = align(ref_units, hyp_units)
        self.unit_edits += units.errors
        self.unit_total += units.reference_length
        words = align(ref_words, hyp_words)
        self.word_edits += words.errors
        self.word_total += words.reference_length
        self.utterances += len(ref_units)
        for r, h in zip(ref_words, hyp_words):
            if len(self.examples) >= keep_examples:
                break
            self.examples.append((" ".join(r), " ".join(h)))

    def add(self, transcripts: Sequence[Transcript], keep_examples: int = 0) -> None:
        """Add decoded utterances (:func:`fastasr.decoding.emissions.transcribe_one`): the same
        units and words that :func:`fastasr.decoding.emissions.score` scores for evaluate.py."""
        self.update([t.ref_scored_units for t in transcripts], [t.hyp_scored_units for t in transcripts],
                    [t.ref_words for t in transcripts], [t.hyp_words for t in transcripts], keep_examples)

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
