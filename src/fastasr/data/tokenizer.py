"""CTC output units: phonemes, characters or subwords (BPE / unigram).

* ``phoneme``: units are the manifest's ``phonemes`` field split on spaces;
  ``|`` is the word boundary unit. An optional phone folding (``phone_folding:
  timit``, see ``phone_sets.py``) maps them before training (61 → 48 TIMIT
  phones) and again before scoring (48 → 39).
* ``char``: units are the characters of the lower-cased ``text``; runs of
  whitespace become one ``|``.
* ``bpe`` / ``unigram``: sentencepiece pieces of the lower-cased ``text``
  (``▁`` starts a word), learnt from the training transcripts with
  ``vocab_size`` units including the blank (``subword.py``); the model travels
  in the tokenizer state as a base64 string.

For ``phoneme`` and ``char`` the vocabulary is ``["<blank>"] + sorted(units seen in
training)`` (index 0 is the CTC blank), so the same training data always gives the same ids; for
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
spellings: a word counts as right when all its phonemes are; for ``bpe`` /
``unigram``, the pieces joined and split at ``▁``. The unit error rate is scored
on ``scored_units``: phonemes without boundaries (folded for scoring when a
folding is set), characters without boundaries (``char``, and ``bpe`` / ``unigram``,
whose unit rate is therefore a CER too).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from fastasr.data import phone_sets, subword

BLANK = "<blank>"
WORD_BOUNDARY = "|"
SUBWORD_KINDS = ("bpe", "unigram")
KINDS = ("phoneme", "char", *SUBWORD_KINDS)
CHAR_BASE = frozenset("abcdefghijklmnopqrstuvwxyz" + WORD_BOUNDARY)  # always in a char vocabulary


def unit_metric(kind: str) -> str:
    """Name of the unit error rate of a tokenizer kind: ``per`` (phonemes) or ``cer`` (chars, and
    subwords, which are scored on their characters: :meth:`Tokenizer.scored_units`). The one home
    of this rule: the metric names logged (``val/per``), the checkpoint monitor, decoding results."""
    if kind not in KINDS:
        raise ValueError(f"tokenizer kind {kind!r}; expected one of {', '.join(KINDS)}")
    return "per" if kind == "phoneme" else "cer"


class UnknownUnitError(ValueError):
    """A unit that is not in the vocabulary."""


class Tokenizer:
    """Maps utterances to CTC label ids and back. ``vocab[0] == "<blank>"``."""

    blank_id = 0
    word_boundary = WORD_BOUNDARY

    def __init__(self, kind: str, vocab: Sequence[str], *, unit_map: Mapping[str, str | None] | None = None,
                 score_map: Mapping[str, str | None] | None = None, model: bytes | None = None) -> None:
        """``unit_map`` / ``score_map``: phoneme foldings for training / scoring (``None``
        in a map deletes the unit); ``model``: the serialised sentencepiece model
        (``bpe`` / ``unigram`` only; ``vocab`` must then be the blank + its pieces)."""
        if kind not in KINDS:
            raise ValueError(f"tokenizer kind {kind!r}; expected one of {KINDS}")
        vocab = list(vocab)
        if not vocab or vocab[0] != BLANK:
            raise ValueError(f"vocab[0] is {vocab[:1]}; expected {BLANK!r} (the CTC blank) first")
        if len(set(vocab)) != len(vocab):
            raise ValueError("vocab has duplicate units")
        if (unit_map or score_map) and kind != "phoneme":
            raise ValueError(f"phone foldings apply to phoneme units only; this tokenizer is {kind!r}")
        self._sp = None
        if kind in SUBWORD_KINDS:
            if model is None:
                raise ValueError(f"a {kind} tokenizer needs its sentencepiece model")
            self._sp = subword.load_model(model)
            if vocab[1:] != subword.pieces(self._sp):
                raise ValueError(f"{kind} vocab does not match its sentencepiece model's pieces")
        elif model is not None:
            raise ValueError(f"a sentencepiece model was given to a {kind!r} tokenizer")
        self.kind = kind
        self.vocab = vocab
        self.unit_map = dict(unit_map) if unit_map else None
        self.score_map = dict(score_map) if score_map else None
        self.model = model
        self._index = {u: i for i, u in enumerate(vocab)}

    # -- construction / persistence
    @classmethod
    def build(cls, utterances: Iterable, kind: str, vocab_size: int | None = None,
              phone_folding: str | None = None) -> Tokenizer:
        """Vocabulary from the units of ``utterances`` (the training set).

        ``vocab_size``: units including the blank, for ``bpe`` / ``unigram`` (required
        there, ignored otherwise). ``phone_folding``: a named folding of
        ``phone_sets.FOLDINGS`` (``timit``), for ``phoneme`` only.
        """
        if kind not in KINDS:
            raise ValueError(f"tokenizer kind {kind!r}; expected one of {KINDS}")
        if kind in SUBWORD_KINDS:
            if vocab_size is None:
                raise ValueError(f"tokenizer {kind!r} needs a vocab_size (units including the blank)")
            model = subword.train_model((normalize_text(_text_of(u)) for u in utterances), kind,
                                        int(vocab_size))
            return cls(kind, [BLANK, *subword.pieces(subword.load_model(model))], model=model)
        unit_map = score_map = None
        if phone_folding:
            if kind != "phoneme":
                raise ValueError(f"phone_folding {phone_folding!r} applies to tokenizer=phoneme, not {kind!r}")
            unit_map, score_map = phone_sets.folding(phone_folding)
        units: set[str] = set(CHAR_BASE) if kind == "char" else set()
        for utt in utterances:
            found = units_of(utt, kind)
            units.update(phone_sets.fold(found, unit_map) if unit_map else found)
        if not units:
            raise ValueError("Tokenizer.build: no units in the given utterances")
        return cls(kind, [BLANK, *sorted(units)], unit_map=unit_map, score_map=score_map)

    def state_dict(self) -> dict:
        """Plain-Python, JSON-able state to store in a checkpoint: ``kind``, ``vocab``, and
        when set ``unit_map`` / ``score_map`` (phone foldings) or ``model`` (the
        sentencepiece model, base64)."""
        state: dict = {"kind": self.kind, "vocab": list(self.vocab)}
        if self.unit_map:
            state["unit_map"] = dict(self.unit_map)
        if self.score_map:
            state["score_map"] = dict(self.score_map)
        if self.model is not None:
            state["model"] = subword.to_text(self.model)
        return state

    @classmethod
    def from_state_dict(cls, state: Mapping) -> Tokenizer:
        model = state.get("model")
        return cls(str(state["kind"]), [str(u) for u in state["vocab"]],
                   unit_map=state.get("unit_map"), score_map=state.get("score_map"),
                   model=subword.from_text(model) if model is not None else None)

    # -- mapping
    def __len__(self) -> int:
        return len(self.vocab)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def units(self, utt) -> list[str]:
        """The unit sequence of an utterance (``Utterance``, or a str: phonemes or text),
        folded for training when a phone folding is set."""
        if self._sp is not None:
            return self._sp.encode(normalize_text(_text_of(utt)), out_type=str)
        units = units_of(utt, self.kind)
        return phone_sets.fold(units, self.unit_map) if self.unit_map else units

    def encode(self, utt) -> list[int]:
        """Label ids of an utterance (or a phoneme/text string). Raises ``UnknownUnitError``."""
        units = self.units(utt)
        try:
            if self._sp is not None and subword.UNK in units:
                raise KeyError(subword.UNK)
            return [self._index[u] for u in units]
        except KeyError:
            if self._sp is not None:  # characters no piece covers
                unknown = sorted({c for c in normalize_text(_text_of(utt)).replace(" ", "")
                                  if self._sp.piece_to_id(c) == self._sp.unk_id()})
            else:
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
        """Units → words: the units between ``|`` joined (empty words dropped); for
        ``bpe`` / ``unigram``, the pieces joined and split where a piece starts with ``▁``."""
        if self._sp is not None:
            return "".join(u for u in units if u != BLANK).replace(subword.WORD_START, " ").split()
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

    def scored_units(self, units: Sequence[str]) -> list[str]:
        """The units the unit error rate (PER / CER) is computed on: word boundaries
        dropped; phonemes folded by the scoring map when one is set; for ``bpe`` /
        ``unigram``, the characters of the words (so the rate is a CER)."""
        if self._sp is not None:
            return list("".join(self.units_to_words(units)))
        kept = [u for u in units if u != WORD_BOUNDARY]
        return phone_sets.fold(kept, self.score_map) if self.score_map else kept

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, vocab_size={len(self.vocab)})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Tokenizer) and self.state_dict() == other.state_dict()


def normalize_text(text: str) -> str:
    """Lower-case and collapse whitespace to single spaces (char and subword units)."""
    return " ".join(text.lower().split())


def _text_of(utt) -> str:
    return utt if isinstance(utt, str) else utt.text


def units_of(utt, kind: str) -> list[str]:
    """Units of an ``Utterance`` or a string for a ``phoneme`` or ``char`` tokenizer
    (subword units need the tokenizer's model: ``Tokenizer.units``)."""
    if kind == "phoneme":
        s = utt if isinstance(utt, str) else utt.phonemes
        if s is None:
            raise ValueError(f"utterance {utt.id!r} has no 'phonemes' field; the phoneme tokenizer needs it "
                             "(or use tokenizer=char)")
        return s.split()
    if kind == "char":
        return list(normalize_text(_text_of(utt)).replace(" ", WORD_BOUNDARY))
    raise ValueError(f"tokenizer kind {kind!r}; expected 'phoneme' or 'char' here")


def ctc_min_frames(ids: Sequence[int]) -> int:
    """Fewest output frames a CTC path needs for the label ids ``ids``: one each, plus a blank
    between equal neighbours."""
    return len(ids) + sum(1 for a, b in zip(ids, ids[1:]) if a == b)
