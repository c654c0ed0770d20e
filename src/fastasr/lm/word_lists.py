"""Word frequencies of large text, for vocabularies beyond the training transcripts.

A corpus of a few hours has a few thousand distinct words: 11 % of Mini LibriSpeech's test
words never occur in its training text, and a lexicon decoder cannot output a word it lacks.
:func:`frequent_words` gives the ``n`` most frequent words of a language with their frequencies
from `wordfreq <https://github.com/rspeer/wordfreq>`_ (which ships its tables in the package: no
download at run time). They serve twice: spelt, they extend a character model's lexicon, and as
a unigram prior they give each such word a probability in the word LM
(:func:`fastasr.lm.kneser_ney.estimate`'s ``unigram_prior``).
"""

from __future__ import annotations

from collections.abc import Callable


def frequent_words(language: str, n: int, keep: Callable[[str], bool] | None = None) -> dict[str, float]:
    """The ``n`` most frequent words of ``language`` (an ISO 639 code wordfreq knows, e.g.
    ``en``) that ``keep`` accepts (e.g. spellable in a model's characters), with their
    frequencies (wordfreq's, per word of text), most frequent first.

    wordfreq's lists hold lower-cased words as its tokenizer splits text; entries with
    whitespace (never a word of a transcript) are left out."""
    if n < 1:
        raise ValueError(f"frequent words: n={n}; expected >= 1")
    import wordfreq

    if language not in wordfreq.available_languages():
        raise ValueError(f"frequent words: language {language!r} has no wordfreq list; expected one of "
                         f"{sorted(wordfreq.available_languages())}")
    out: dict[str, float] = {}
    read, wanted = 0, n  # the list is ordered by frequency: read on in doubling slices until n are kept
    while True:
        candidates = wordfreq.top_n_list(language, wanted, wordlist="best")
        for word in candidates[read:]:
            if not word or any(c.isspace() for c in word) or (keep and not keep(word)):
                continue
            out[word] = wordfreq.word_frequency(word, language, wordlist="best")
            if len(out) == n:
                return out
        if len(candidates) < wanted:  # the list is exhausted
            return out
        read, wanted = len(candidates), wanted * 2
