"""Greedy (best-path) CTC decoding."""

from __future__ import annotations

import torch

from fastasr.data.tokenizer import Tokenizer
from fastasr.decoding.hypothesis import Hypothesis, tidy_boundaries, word_groups
from fastasr.decoding.lexicon import Lexicon


def ctc_greedy(log_probs: torch.Tensor, lengths: torch.Tensor, blank: int = 0) -> list[list[int]]:
    """Best-path decoding: argmax per frame, merge repeats, drop blanks.

    Args:
        log_probs: (B, T, V) frame scores (log-probabilities or logits).
        lengths: (B,) valid frames per utterance.
        blank: index of the CTC blank.

    Returns:
        One list of unit ids per utterance.
    """
    best = log_probs.argmax(dim=-1).cpu()  # (B, T)
    lengths = lengths.cpu()
    out: list[list[int]] = []
    for row, n in zip(best, lengths.tolist()):
        row = row[:n]
        keep = torch.ones_like(row, dtype=torch.bool)
        keep[1:] = row[1:] != row[:-1]
        keep &= row != blank
        out.append(row[keep].tolist())
    return out


class GreedyDecoder:
    """Greedy decoding of one utterance into a :class:`Hypothesis`.

    A phoneme model's phonetic words become real words through ``lexicon`` (each
    pronunciation → the word most often spoken with it); a phonetic word the lexicon does not
    know is kept as it is (and so scored as an error). Without a lexicon a phoneme model's
    words stay phonetic; a char model's words are real words either way.
    """

    def __init__(self, tokenizer: Tokenizer, lexicon: Lexicon | None = None) -> None:
        self.tokenizer = tokenizer
        self.lexicon = lexicon if tokenizer.kind == "phoneme" else None
        self._words = self.lexicon.inverse() if self.lexicon is not None else None

    @property
    def real_words(self) -> bool:
        """Whether ``Hypothesis.words`` are real words, not phonetic words."""
        return self._words is not None or self.tokenizer.kind != "phoneme"

    def describe(self) -> dict:
        """The settings, for results.json."""
        return {"name": "greedy", "lexicon_words": len(self.lexicon) if self.lexicon is not None else None}

    def __call__(self, log_probs: torch.Tensor) -> Hypothesis:
        """Decode one utterance's ``(T, V)`` log-probabilities."""
        tok = self.tokenizer
        ids = ctc_greedy(log_probs.unsqueeze(0), torch.tensor([log_probs.shape[0]]), tok.blank_id)[0]
        units = tidy_boundaries(tok.decode(ids), tok.word_boundary)
        if self._words is None:
            return Hypothesis(units=units, words=tok.units_to_words(units))
        words = [self._words.get(tuple(g), "".join(g)) for g in word_groups(units, tok.word_boundary)]
        return Hypothesis(units=units, words=words)
