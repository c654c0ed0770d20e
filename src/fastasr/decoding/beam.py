"""CTC beam search with torchaudio's ``ctc_decoder`` (flashlight-text): lexicon-constrained
word decoding (phoneme and char models) or lexicon-free decoding, with an optional KenLM
n-gram LM (ARPA or KenLM binary).

The lexicon spells every word as its units followed by the word boundary ``|`` (the
decoder's silence token). Our tokenizers put ``|`` *between* words only, so the last word of
an utterance has no boundary to end on: the decoder appends one frame on which ``|`` has
probability 1 (a constant for every hypothesis) so that the final word can close.

Without an LM, words spelt with the same units (homophones) score exactly alike; the search
then keeps, for each spelling, the word said most often with it in the lexicon's counts
(equal counts: the alphabetically first), :meth:`Lexicon.one_word_per_pronunciation`, so the
same emissions give the same words in every process. With an LM all words stay and the LM
decides between them.

Scores: flashlight adds ``lm_weight × log10 p_LM(word | history) + word_score`` per word
(KenLM scores are log10) to the acoustic log-probabilities (natural log).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from fastasr.data.lexicon import Lexicon
from fastasr.data.tokenizer import BLANK, Tokenizer
from fastasr.decoding.hypothesis import Hypothesis, tidy_boundary_indices
from fastasr.lm.bundled import BundledLM

log = logging.getLogger(__name__)

IMPOSSIBLE = -1e9  # log-probability of the non-boundary units on the appended frame
UNK_WORD = "<unk>"


@dataclass
class BeamSearchOptions:
    """Search settings (the ``decoding=beam`` config; names follow torchaudio's ``ctc_decoder``)."""

    beam_size: int = 500                # hypotheses kept after each frame (wav2letter's LibriSpeech width)
    beam_size_token: int | None = None  # units tried per frame (None: all)
    beam_threshold: float = 25.0        # drop hypotheses scoring this far below the best
    lm_weight: float = 2.0              # weight of the LM's log10 probabilities
    word_score: float = 0.0             # added per emitted word (insertion bonus / penalty)
    unk_score: float = -math.inf        # added per out-of-lexicon word (-inf: never emitted)
    sil_score: float = 0.0              # added per word-boundary token
    log_add: bool = False               # merge equal hypotheses by log-add instead of max

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"beam_size {self.beam_size}; expected >= 1")
        if self.beam_threshold <= 0:
            raise ValueError(f"beam_threshold {self.beam_threshold}; expected > 0")


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """KenLM prints a progress bar on file descriptor 2 while it loads an ARPA file."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class BeamSearchDecoder:
    """CTC beam search over a model's units.

    Args:
        tokenizer: the model's units (``vocab[0]`` the blank, ``|`` the word boundary).
        lexicon: words and their pronunciations/spellings for lexicon-constrained decoding;
            None for lexicon-free decoding (the LM, if any, is then over units).
        lm_path: ARPA or KenLM binary file, or the word LM a recogniser carries
            (:class:`fastasr.lm.BundledLM`: its embedded text, or its file after a hash check);
            None for no LM.
        options: search settings.
    """

    def __init__(self, tokenizer: Tokenizer, lexicon: Lexicon | None = None,
                 lm_path: str | Path | BundledLM | None = None, options: BeamSearchOptions | None = None) -> None:
        from torchaudio.models.decoder import ctc_decoder  # needs flashlight-text

        self.tokenizer = tokenizer
        self.vocab = list(tokenizer.vocab)
        boundary = tokenizer.word_boundary
        if boundary not in self.vocab:
            raise ValueError(f"word boundary {boundary!r} is not in the {tokenizer.kind} model's vocabulary; the "
                             "beam search needs it between words (it decodes phoneme and char models; "
                             "decode bpe/unigram models with decoding=greedy)")
        self.boundary = boundary
        self.options = options or BeamSearchOptions()
        self.bundled_lm = lm_path if isinstance(lm_path, BundledLM) else None
        self.lm_path = None if lm_path is None else Path(lm_path.path if self.bundled_lm else lm_path)
        if self.lm_path is not None and self.bundled_lm is None and not self.lm_path.is_file():
            raise FileNotFoundError(f"decoding.lm.path={lm_path}: no such LM file (build one with "
                                    "`python -m fastasr.cli.lm build` or `make lm`)")
        self.lexicon = None
        if lexicon is not None:
            self.lexicon, dropped = lexicon.restrict_to_units(self.vocab)
            if dropped:
                log.warning("%d pronunciation(s) use units the model cannot emit and are left out, e.g. %s",
                            len(dropped), "; ".join(dropped[:3]))
            if not len(self.lexicon):
                raise ValueError("no lexicon word can be spelt with the model's units")
            if self.lm_path is None:  # homophones tie exactly: one word a spelling, by a fixed rule
                self.lexicon = self.lexicon.one_word_per_pronunciation()
        self._boundary_id = self.vocab.index(boundary)
        with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as files:
            lm_file = None if self.lm_path is None else (
                files.enter_context(self.bundled_lm.file()) if self.bundled_lm else self.lm_path)
            lexicon_file = None
            if self.lexicon is not None:
                lexicon_file = Path(tmp) / "lexicon.txt"
                lexicon_file.write_text("".join(
                    f"{w} {' '.join(p)} {boundary}\n" for w in sorted(self.lexicon.entries)
                    for p in self.lexicon.pronunciations(w)), encoding="utf-8")
            opts = asdict(self.options)
            try:
                with _quiet_stderr() if self.lm_path else contextlib.nullcontext():
                    self._decoder = ctc_decoder(
                        lexicon=None if lexicon_file is None else str(lexicon_file),
                        tokens=self.vocab,
                        lm=None if lm_file is None else str(lm_file),
                        blank_token=BLANK, sil_token=boundary, unk_word=UNK_WORD, nbest=1, **opts)
            except RuntimeError as err:
                if self.lm_path is None:
                    raise
                raise ValueError(f"decoding.lm.path={self.lm_path}: KenLM cannot read it as an ARPA or "
                                 f"KenLM binary file: {err}") from None

    @property
    def real_words(self) -> bool:
        """Whether ``Hypothesis.words`` are real words (lexicon words, or a char model's), not phonetic words."""
        return self.lexicon is not None or self.tokenizer.kind != "phoneme"

    def describe(self) -> dict:
        """The settings, for results.json."""
        options = {k: v if not isinstance(v, float) or math.isfinite(v) else str(v)  # JSON has no inf
                   for k, v in asdict(self.options).items()}
        lm = {"lm": str(self.lm_path) if self.lm_path else None}
        if self.bundled_lm is not None:  # the recogniser's own LM: its identity
            lm.update(lm_sha256=self.bundled_lm.sha256, lm_embedded=self.bundled_lm.embedded)
        return {"name": "beam", "lexicon_words": len(self.lexicon) if self.lexicon else None, **lm, **options}

    def __call__(self, log_probs: torch.Tensor) -> Hypothesis:
        """Decode one utterance's ``(T, V)`` log-probabilities (any float dtype/device)."""
        if log_probs.ndim != 2 or log_probs.shape[1] != len(self.vocab):
            raise ValueError(f"log_probs of shape {tuple(log_probs.shape)}; expected (T, {len(self.vocab)})")
        closing = torch.full((1, len(self.vocab)), IMPOSSIBLE)
        closing[0, self._boundary_id] = 0.0
        emissions = torch.cat([log_probs.detach().float().cpu(), closing]).unsqueeze(0).contiguous()
        best = self._decoder(emissions)[0][0]
        raw = [self.vocab[i] for i in best.tokens.tolist()]
        kept = tidy_boundary_indices(raw, self.boundary)
        units = [raw[i] for i in kept]
        frames = None
        if len(best.timesteps) == len(raw):  # flashlight's path starts with a start token: step t is frame t - 1
            last = log_probs.shape[0] - 1
            frames = [min(max(int(best.timesteps[i]) - 1, 0), last) for i in kept]
        words = list(best.words) if self.lexicon is not None else self.tokenizer.units_to_words(units)
        return Hypothesis(units=units, words=words, score=float(best.score), frames=frames)
