"""CTC output units: phonemes or characters.

* ``phoneme``: units are the manifest's ``phonemes`` field split on spaces;
  ``|`` is the word boundary unit.
* ``char``: units are the characters of the lower-cased ``text``; runs of
  whitespace become one ``|``.

The vocabulary is ``["<blank>"] + sorted(units seen in training)`` (index 0 is
the CTC blank), so the same training data always gives the same ids; for
``char`` the letters ``a``-``z`` and ``|`` are always included, so a letter
missing from a small training set does not make dev/test sentences
unencodable. It is saved with the model via ``state_dict()`` /
``Tokenizer.from_state_dict()``.

Unknown units at encode time raise ``UnknownUnitError`` naming the units and
the utterance (a model cannot be scored on labels it cannot emit; the
DataModule drops such dev/test utterances with a warning, or raises, per
``on_bad_utterance``).

Words (for WER): for ``char``, the characters between ``|`` joined; for
``phoneme``, the phonemes between ``|`` joined without separator, i.e. a
word is its phonetic spelling (``h ə l oʊ | w ɜː l d`` → ``həloʊ``,
``wɜːld``). So the WER of a phoneme model is the word error rate on phonetic
spellings: a word counts as right when all its phonemes are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

BLANK = "<blank>"
WORD_BOUNDARY = "|"
KINDS = ("phoneme", "char")
CHAR_BASE = frozenset("abcdefghijklmnopqrstuvwxyz" + WORD_BOUNDARY)  # always in a char vocabulary


class UnknownUnitError(ValueError):
    """A unit that is not in the vocabulary."""


class Tokenizer:
    """Maps utterances to CTC label ids and back. ``vocab[0] == "<blank>"``."""

    blank_id = 0
    word_boundary = WORD_BOUNDARY

    def __init__(self, kind: str, vocab: Sequence[str]) -> None:
        if kind not in KINDS:
            raise ValueError(f"tokenizer kind {kind!r}; expected one of {KINDS}")
        vocab = list(vocab)
        if not vocab or vocab[0] != BLANK:
            raise ValueError(f"vocab[0] is {vocab[:1]}; expected {BLANK!r} (the CTC blank) first")
        if len(set(vocab)) != len(vocab):
            raise ValueError("vocab has duplicate units")
        self.kind = kind
        self.vocab = vocab
        self._index = {u: i for i, u in enumerate(vocab)}

    # -- construction / persistence
    @classmethod
    def build(cls, utterances: Iterable, kind: str) -> Tokenizer:
        """Vocabulary from the units of ``utterances`` (the training set)."""
        if kind not in KINDS:
            raise ValueError(f"tokenizer kind {kind!r}; expected one of {KINDS}")
        units: set[str] = set(CHAR_BASE) if kind == "char" else set()
        for utt in utterances:
            units.update(units_of(utt, kind))
        if not units:
            raise ValueError("Tokenizer.build: no units in the given utterances")
        return cls(kind, [BLANK, *sorted(units)])

    def state_dict(self) -> dict:
        """Plain-Python state (``kind``, ``vocab``) to store in a checkpoint."""
        return {"kind": self.kind, "vocab": list(self.vocab)}

    @classmethod
    def from_state_dict(cls, state: Mapping) -> Tokenizer:
        return cls(str(state["kind"]), [str(u) for u in state["vocab"]])

    # -- mapping
    def __len__(self) -> int:
        return len(self.vocab)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def units(self, utt) -> list[str]:
        """The unit sequence of an utterance (``Utterance``, or a str: phonemes or text)."""
        return units_of(utt, self.kind)

    def encode(self, utt) -> list[int]:
        """Label ids of an utterance (or a phoneme/text string). Raises ``UnknownUnitError``."""
        units = self.units(utt)
        try:
            return [self._index[u] for u in units]
        except KeyError:
            unknown = sorted({u for u in units if u not in self._index})
            where = f" in utterance {utt.id!r}" if hasattr(utt, "id") else ""
            raise UnknownUnitError(
                f"{self.kind} unit(s) {unknown}{where} not in the vocabulary of {len(self.vocab)} units "
                "(built from the training set)"
            ) from None

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Ids → units (blanks dropped; no CTC collapsing: pass an already collapsed sequence)."""
        out = []
        for i in ids:
            i = int(i)
            if i == self.blank_id:
                continue
            if not 0 <= i < len(self.vocab):
                raise ValueError(f"id {i} outside the vocabulary of {len(self.vocab)} units")
            out.append(self.vocab[i])
        return out

    def units_to_words(self, units: Sequence[str]) -> list[str]:
        """Units → words: the units between ``|`` joined (empty words dropped)."""
        words, cur = [], []
        for u in units:
            if u == WORD_BOUNDARY:
                if cur:
                    words.append("".join(cur))
                cur = []
            elif u != BLANK:
                cur.append(u)
        if cur:
            words.append("".join(cur))
        return words

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, vocab_size={len(self.vocab)})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Tokenizer) and self.state_dict() == other.state_dict()


def units_of(utt, kind: str) -> list[str]:
    """Units of an ``Utterance`` or a string for a tokenizer kind."""
    if kind == "phoneme":
        s = utt if isinstance(utt, str) else utt.phonemes
        if s is None:
            raise ValueError(f"utterance {utt.id!r} has no 'phonemes' field; the phoneme tokenizer needs it "
                             "(or use tokenizer=char)")
        return s.split()
    if kind == "char":
        s = utt if isinstance(utt, str) else utt.text
        return list(WORD_BOUNDARY.join(s.lower().split()))
    raise ValueError(f"tokenizer kind {kind!r}; expected one of {KINDS}")
