"""LM estimation from manifests' transcripts: :func:`build` (``python -m fastasr.cli.lm build`` is its command).

Word LMs serve lexicon decoding; character LMs (tokens = the char tokenizer's units, ``|``
between words) serve lexicon-free decoding of char models. ``frequent_words=N`` opens a word
LM's vocabulary: the N most frequent words of ``language`` (wordfreq) spellable in the training
text's characters join it, weighted by their frequency (the unigram prior of
:func:`fastasr.lm.kneser_ney.estimate`); ``lexicon_out`` writes the whole vocabulary spelt, the
lexicon a char model decodes it with (``decoding.lexicon.path``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fastasr.data.lexicon import spelling_lexicon, words_of, write_lexicon
from fastasr.data.manifest import read_manifest
from fastasr.data.tokenizer import units_of
from fastasr.lm.arpa import read_arpa, write_arpa
from fastasr.lm.kneser_ney import BOS, EOS, UNK, estimate
from fastasr.lm.word_lists import frequent_words as frequent_words_of

__all__ = ["build", "transcripts"]


def transcripts(manifests: Sequence[str | Path], units: str) -> list[list[str]]:
    """Token sequences of the ``text`` of every utterance: words, or characters (``|`` between words)."""
    if units not in ("words", "chars"):
        raise ValueError(f"units {units!r}; expected 'words' or 'chars'")
    out = []
    for path in manifests:
        for utt in read_manifest(path, on_error="skip", check_audio=False):
            out.append(words_of(utt.text) if units == "words" else units_of(utt.text, "char"))
    return out


def build(manifests: Sequence[str | Path], out: str | Path, order: int = 3, units: str = "words",
          dev: Sequence[str | Path] = (), frequent_words: int = 0, language: str = "en",
          lexicon_out: str | Path | None = None) -> dict:
    """Estimate a modified Kneser-Ney LM from the manifests' transcripts and write it as ARPA.

    ``frequent_words``: add the N most frequent words of ``language`` (wordfreq) that are spelt
    in the training text's characters, as the unigram prior (word LMs only). ``lexicon_out``:
    also write the LM's words spelt (a char model's lexicon for it).
    Returns ``{"path", "sentences", "ngrams": {order: count}, "discounts", "dev_perplexity",
    "added_words", "lexicon"}`` (``added_words``: vocabulary words not in the training text).
    """
    sentences = transcripts(manifests, units)
    prior = None
    if frequent_words:
        if units != "words":
            raise ValueError(f"frequent_words={frequent_words} is for word LMs; units={units!r}")
        alphabet = {c for sentence in sentences for word in sentence for c in word}
        prior = frequent_words_of(language, frequent_words, keep=lambda w: set(w) <= alphabet)
    model = estimate(sentences, order, unigram_prior=prior)
    path = write_arpa(model, out)
    training_words = {w for sentence in sentences for w in sentence}
    words = [g[0] for g in model.prob[1] if g[0] not in (BOS, EOS, UNK)]
    info = {
        "path": str(path),
        "sentences": len(sentences),
        "ngrams": {k: len(model.prob[k]) for k in range(1, order + 1)},
        "discounts": {k: [round(d, 4) for d in ds] for k, ds in model.discounts.items()},
        "dev_perplexity": None,
        "added_words": sum(w not in training_words for w in words),
        "lexicon": None,
    }
    if lexicon_out is not None:
        info["lexicon"] = str(write_lexicon(spelling_lexicon(words), lexicon_out, with_counts=False))
    if dev:
        info["dev_perplexity"] = read_arpa(path).perplexity(transcripts(dev, units))
    return info
