"""Greedy (best-path) CTC decoding."""

from __future__ import annotations

import torch

from fastasr.data.lexicon import Lexicon
from fastasr.data.tokenizer import Tokenizer
from fastasr.decoding.hypothesis import Hypothesis, PathWords, tidy_boundary_indices, word_groups


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
        """Decode one utterance's ``(T, V)`` log-probabilities (``frames``: where each unit's
        argmax run starts)."""
        return self.decode_path(log_probs.detach().argmax(dim=-1).cpu())  # (T,): ctc_greedy's path

    def decode_path(self, best: torch.Tensor) -> Hypothesis:
        """The :class:`Hypothesis` of a best path ``(T,)`` of unit ids (one argmax a frame)."""
        tok = self.tokenizer
        starts = torch.ones_like(best, dtype=torch.bool)
        starts[1:] = best[1:] != best[:-1]
        starts &= best != tok.blank_id
        frames = starts.nonzero().flatten().tolist()
        raw = tok.decode(best[frames].tolist())
        kept = tidy_boundary_indices(raw, tok.word_boundary)
        units, frames = [raw[i] for i in kept], [frames[i] for i in kept]
        return Hypothesis(units=units, words=self.words_of(units), frames=frames)

    def words_of(self, units: list[str]) -> list[str]:
        """The words of ``units``: through the lexicon for a phoneme model that has one (a
        pronunciation it does not know stays a phonetic word), else the tokenizer's."""
        if self._words is None:
            return self.tokenizer.units_to_words(units)
        return [self._words.get(tuple(g), "".join(g)) for g in word_groups(units, self.tokenizer.word_boundary)]

    def stream(self) -> GreedyStream:
        """Decoding of log-probabilities that arrive chunk by chunk (:class:`GreedyStream`)."""
        return GreedyStream(self)


class GreedyStream:
    """Greedy decoding of a stream: ``accept(log_probs)`` per chunk, ``partial()`` the hypothesis
    so far, ``finish()`` the final one, equal to the decoder's over the whole ``(T, V)``.

    Each chunk's best path is read once: its units are appended to what the earlier chunks gave
    (:class:`~fastasr.decoding.hypothesis.PathWords`), so a chunk costs the same at any point of
    the stream (what grows is the list of words so far that ``partial()`` copies out)."""

    def __init__(self, decoder: GreedyDecoder) -> None:
        self.decoder = decoder
        self.path = PathWords(decoder.tokenizer, decoder.words_of)
        self.frames = 0  # frames accepted
        self.last: int | None = None  # the last frame's argmax

    def accept(self, log_probs: torch.Tensor) -> None:
        best = log_probs.detach().argmax(dim=-1).cpu()  # (T,)
        if not best.shape[0]:
            return
        tok = self.decoder.tokenizer
        starts = torch.ones_like(best, dtype=torch.bool)
        starts[1:] = best[1:] != best[:-1]
        if self.last is not None:
            starts[0] = bool(best[0] != self.last)
        starts &= best != tok.blank_id
        frames = starts.nonzero().flatten().tolist()
        for frame, unit in zip(frames, tok.decode(best[frames].tolist())):
            self.path.add(unit, self.frames + frame)
        self.last = int(best[-1])
        self.frames += best.shape[0]

    def partial(self) -> Hypothesis:
        return self.path.hypothesis()

    def finish(self) -> Hypothesis:
        return self.partial()
