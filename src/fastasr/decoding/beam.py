"""CTC beam search with flashlight-text's decoders (what torchaudio's ``ctc_decoder`` wraps, used
here directly so that the search needs no PyTorch: the ONNX runtime decodes with it too): lexicon-constrained
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
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flashlight.lib.text.decoder import (
    CriterionType,
    KenLM,
    LexiconDecoder,
    LexiconDecoderOptions,
    LexiconFreeDecoder,
    LexiconFreeDecoderOptions,
    SmearingMode,
    Trie,
    ZeroLM,
)
from flashlight.lib.text.dictionary import Dictionary, create_word_dict

from fastasr.data.lexicon import Lexicon
from fastasr.data.tokenizer import BLANK, Tokenizer
from fastasr.decoding.hypothesis import Hypothesis, PathWords, tidy_boundary_indices
from fastasr.decoding.parallel import resolve_workers, search_in_order
from fastasr.lm.bundled import BundledLM

log = logging.getLogger(__name__)

IMPOSSIBLE = -1e9  # log-probability of the non-boundary units on the appended frame
UNK_WORD = "<unk>"


@dataclass
class BeamSearchOptions:
    """Search settings (the ``decoding=beam`` config; names follow flashlight's decoder options)."""

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
        workers: processes that :meth:`map` searches utterances in (``decoding.workers``;
            :func:`fastasr.decoding.parallel.resolve_workers`); 0: this process.
    """

    def __init__(self, tokenizer: Tokenizer, lexicon: Lexicon | None = None,
                 lm_path: str | Path | BundledLM | None = None, options: BeamSearchOptions | None = None,
                 workers: int = 0) -> None:
        self._arguments = (tokenizer, lexicon, lm_path, options)  # a worker's copy is built from them
        self.workers = resolve_workers(workers)
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
        self._blank_id = self.vocab.index(BLANK)
        with contextlib.ExitStack() as files:
            lm_file = None if self.lm_path is None else (
                files.enter_context(self.bundled_lm.file()) if self.bundled_lm else self.lm_path)
            try:
                with _quiet_stderr() if self.lm_path else contextlib.nullcontext():
                    self._search = self._build_search(lm_file)
            except RuntimeError as err:
                if self.lm_path is None:
                    raise
                raise ValueError(f"decoding.lm.path={self.lm_path}: KenLM cannot read it as an ARPA or "
                                 f"KenLM binary file: {err}") from None

    def _build_search(self, lm_file: Path | None):
        """flashlight's lexicon (or lexicon-free) CTC decoder over our units, with KenLM or no LM.
        The LM, the trie and the dictionaries stay referenced by ``self``: the decoder holds them
        by reference only."""
        o = self.options
        self._tokens = Dictionary(self.vocab)
        beam_size_token = o.beam_size_token or len(self.vocab)
        if self.lexicon is not None:
            spellings = {w: [[*p, self.boundary] for p in self.lexicon.pronunciations(w)]
                         for w in sorted(self.lexicon.entries)}
            self._words = create_word_dict({UNK_WORD: [], **spellings})  # flashlight's lexicons hold <unk>
            self._lm = ZeroLM() if lm_file is None else KenLM(str(lm_file), self._words)
            self._trie = Trie(len(self.vocab), self._boundary_id)
            start = self._lm.start(False)
            for word, spelt in spellings.items():
                index = self._words.get_index(word)
                _, score = self._lm.score(start, index)
                for spelling in spelt:
                    self._trie.insert([self._tokens.get_index(u) for u in spelling], index, score)
            self._trie.smear(SmearingMode.MAX)
            options = LexiconDecoderOptions(
                beam_size=o.beam_size, beam_size_token=beam_size_token, beam_threshold=o.beam_threshold,
                lm_weight=o.lm_weight, word_score=o.word_score, unk_score=o.unk_score, sil_score=o.sil_score,
                log_add=o.log_add, criterion_type=CriterionType.CTC)
            return LexiconDecoder(options, self._trie, self._lm, self._boundary_id, self._blank_id,
                                  self._words.get_index(UNK_WORD), [], False)
        self._words = None
        self._lm = ZeroLM()
        if lm_file is not None:  # an LM over units: its words are the units
            self._words = create_word_dict({u: [[u]] for u in [*self.vocab, UNK_WORD]})
            self._lm = KenLM(str(lm_file), self._words)
        options = LexiconFreeDecoderOptions(
            beam_size=o.beam_size, beam_size_token=beam_size_token, beam_threshold=o.beam_threshold,
            lm_weight=o.lm_weight, sil_score=o.sil_score, log_add=o.log_add, criterion_type=CriterionType.CTC)
        return LexiconFreeDecoder(options, self._lm, self._boundary_id, self._blank_id, [])

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

    def __reduce__(self):
        """Pickled as its arguments (flashlight's search does not pickle): a spawned worker builds
        its own copy (:mod:`fastasr.decoding.parallel`), which searches in its own process."""
        return type(self), self._arguments

    def map(self, log_probs: Iterable[Any]) -> Iterator[Hypothesis]:
        """Each utterance's hypothesis (:meth:`__call__`), in order, the utterances searched by
        :attr:`workers` processes (:func:`fastasr.decoding.parallel.search_in_order`); the same
        hypotheses as one process finds."""
        return search_in_order(self, (self._emissions(lp) for lp in log_probs), self.workers)

    def __call__(self, log_probs: Any) -> Hypothesis:
        """Decode one utterance's ``(T, V)`` log-probabilities (a numpy array or a torch tensor of any
        float dtype and device)."""
        emissions = self._emissions(log_probs)
        emissions = np.ascontiguousarray(np.concatenate([emissions, self._closing()]))
        results = self._search.decode(emissions.ctypes.data, emissions.shape[0], emissions.shape[1])
        return self._hypothesis(results[0], emissions.shape[0] - 1)

    def _emissions(self, log_probs: Any) -> np.ndarray:
        """``(T, V)`` float32 C-contiguous numpy log-probabilities, checked."""
        if hasattr(log_probs, "detach"):  # a torch tensor (this module imports no torch)
            log_probs = log_probs.detach().float().cpu().numpy()
        log_probs = np.ascontiguousarray(log_probs, dtype=np.float32)
        if log_probs.ndim != 2 or log_probs.shape[1] != len(self.vocab):
            raise ValueError(f"log_probs of shape {tuple(log_probs.shape)}; expected (T, {len(self.vocab)})")
        return log_probs

    def _closing(self) -> np.ndarray:
        """The frame appended after the last: ``|`` certain, so the last word can close."""
        closing = np.full((1, len(self.vocab)), IMPOSSIBLE, np.float32)
        closing[0, self._boundary_id] = 0.0
        return closing

    def _hypothesis(self, result, frames_total: int) -> Hypothesis:
        """Our :class:`Hypothesis` of flashlight's ``DecodeResult`` over ``frames_total`` frames: its
        path's units (repeats merged, blanks dropped), the frame each starts at, its words."""
        path = list(result.tokens)
        starts = [t for t, unit in enumerate(path) if unit != self._blank_id and (t == 0 or unit != path[t - 1])]
        raw = [self.vocab[path[t]] for t in starts]
        kept = tidy_boundary_indices(raw, self.boundary)
        units = [raw[i] for i in kept]
        last = max(frames_total - 1, 0)
        frames = [min(max(starts[i] - 1, 0), last) for i in kept]  # the path starts with a start token
        if self.lexicon is not None:
            words = [self._words.get_entry(w) for w in result.words if w >= 0]
        else:
            words = self.tokenizer.units_to_words(units)
        return Hypothesis(units=units, words=words, score=float(result.score), frames=frames)

    def stream(self, max_unsettled: int = 250) -> BeamStream:
        """Search over log-probabilities that arrive chunk by chunk, with the LM state carried
        across chunks, its memory bounded (:class:`BeamStream`). One stream at a time per
        decoder: the search's state lives in the decoder."""
        return BeamStream(self, max_unsettled)


class BeamStream:
    """The beam search of a stream (flashlight's incremental decoding): ``accept(log_probs)`` per
    chunk, ``partial()`` the best hypothesis so far, ``finish()`` the final one, which equals the
    decoder's over the whole ``(T, V)`` (the same search, fed in pieces).

    Memory stays bounded: the search holds its hypotheses of every frame back to the last frame
    where all its live hypotheses agree (the same units and words up to it: the *settled* prefix);
    after each chunk the settled frames are committed here (their units and words, read once) and
    flashlight's ``prune`` drops them. Pruning leaves the search itself unchanged (it keeps every
    live hypothesis and its LM state; only their paths before the settled frame go, and their
    scores shift by one constant), so the words are exactly the unpruned search's. Where the
    hypotheses have not agreed for ``max_unsettled`` frames (10 s at 40 ms; rare: a beam's
    hypotheses usually share all but the last second or two), the best hypothesis's path up to
    ``max_unsettled`` frames back is committed instead, and the final words may then differ
    from the whole recording's search where a hypothesis that disagreed there wins later.
    Settling reads every live hypothesis's unsettled path once a chunk: its cost grows with
    the beam and the unsettled frames, both bounded.
    """

    def __init__(self, decoder: BeamSearchDecoder, max_unsettled: int = 250) -> None:
        if max_unsettled < 1:
            raise ValueError(f"max_unsettled={max_unsettled}; expected >= 1 frame")
        self.decoder = decoder
        self.max_unsettled = max_unsettled
        self.frames = 0  # emission frames decoded
        self.settled = 0  # path positions committed: the search's buffer starts at this one
        self.last: int | None = None  # the last committed position's unit id
        self.path = PathWords(decoder.tokenizer, decoder.tokenizer.units_to_words)
        self.words: list[str] = []  # the committed words (lexicon search)
        self.offset = 0.0  # the scores pruning subtracted
        decoder._search.decode_begin()

    @property
    def buffered(self) -> int:
        """Frames the search holds hypotheses of (the unsettled ones)."""
        return self.frames - self.settled + 1

    def accept(self, log_probs: Any) -> None:
        emissions = self.decoder._emissions(log_probs)
        if emissions.shape[0]:
            self.decoder._search.decode_step(emissions.ctypes.data, emissions.shape[0], emissions.shape[1])
            self.frames += emissions.shape[0]
            self._settle()

    def _settle(self) -> None:
        """Commit the prefix every live hypothesis shares and prune the search to after it."""
        search = self.decoder._search
        hyps = search.get_all_final_hypothesis()  # the live hypotheses (the last frame's)
        if not hyps:
            return
        tokens = np.array([h.tokens for h in hyps])  # (hypotheses, buffer + 1): buffer position 0 first
        words = np.array([h.words for h in hyps])
        differ = ((tokens != tokens[:1]) | (words != words[:1])).any(0)
        common = int(differ.argmax()) if differ.any() else tokens.shape[1]
        held = tokens.shape[1] - 1
        best = 0
        if held - common > self.max_unsettled:  # no agreement for too long: the best path's prefix
            best = max(range(len(hyps)), key=lambda i: hyps[i].score)
            common = held - self.max_unsettled
        # flashlight prunes where the best path last ended a word at or before `common` (so it may
        # keep more), the position its get_best_hypothesis with the same look-back ends at
        look_back = max(1, held - common)
        settled = len(search.get_best_hypothesis(look_back).tokens) - 1
        search.prune(look_back)
        if settled > 0:
            self.offset += max(h.score for h in hyps)  # what pruning subtracted from every score
            self._commit(tokens[best, :settled], words[best, :settled])

    def _add(self, path: PathWords, tokens: Any, last: int | None, frames: int | None) -> int | None:
        """Add a stretch of path positions (from ``self.settled`` on) to ``path``; the last unit id.
        ``frames``: the frames decoded, for the appended closing frame's position (None: none)."""
        blank, vocab = self.decoder._blank_id, self.decoder.vocab
        for i, t in enumerate(tokens.tolist() if hasattr(tokens, "tolist") else tokens):
            at = self.settled + i  # position 0 is the search's start token, position t + 1 frame t
            if t != blank and (at == 0 or t != last):
                frame = max(at - 1, 0)
                path.add(vocab[t], frame if frames is None else min(frame, max(frames - 1, 0)))
            last = t
        return last

    def _word_labels(self, words: Any) -> list[str]:
        return [self.decoder._words.get_entry(int(w)) for w in words if w >= 0]

    def _commit(self, tokens: np.ndarray, words: np.ndarray) -> None:
        self.last = self._add(self.path, tokens, self.last, None)
        if self.decoder.lexicon is not None:
            self.words += self._word_labels(words)
        self.settled += len(tokens)

    def _hypothesis(self, result, frames: int) -> Hypothesis:
        """The committed prefix and ``result``'s path over the search's buffer, as one hypothesis."""
        path = self.path.fork()
        self._add(path, result.tokens, self.last, frames)
        words = self.words + self._word_labels(result.words) if self.decoder.lexicon is not None else None
        return path.hypothesis(score=float(result.score) + self.offset, words=words)

    def partial(self) -> Hypothesis:
        if not self.frames:
            return Hypothesis(units=[], words=[], frames=[])
        return self._hypothesis(self.decoder._search.get_best_hypothesis(), self.frames)

    def finish(self) -> Hypothesis:
        search, closing = self.decoder._search, self.decoder._closing()
        search.decode_step(closing.ctypes.data, 1, closing.shape[1])
        search.decode_end()
        return self._hypothesis(search.get_all_final_hypothesis()[0], self.frames)
