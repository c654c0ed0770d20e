"""The built-in corpus's sentences: templates filled from the word classes of ``words.txt``
(~1400 common English words in classes: det, adj, noun, pron, modal, neg, verb, prep, adv, conj).
Not a pronunciation lexicon (that is :mod:`fastasr.data.lexicon`): this module writes the text
that :mod:`fastasr.corpora.synthetic` speaks."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import numpy as np

_WORDS_FILE = Path(__file__).with_name("words.txt")
@lru_cache(maxsize=1)
def load_lexicon(path: str | None = None) -> dict[str, tuple[str, ...]]:
    """Word classes of ``words.txt``: ``{"noun": (...), "verb": (...), ...}``."""
    classes: dict[str, list[str]] = {}
    current = None
    for line in Path(path or _WORDS_FILE).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"\[(\w+)\]", line)
        if m:
            current = classes.setdefault(m.group(1), [])
        elif current is None:
            raise ValueError(f"{path or _WORDS_FILE}: words before the first [class] header")
        else:
            current.extend(line.split())
    return {k: tuple(dict.fromkeys(v)) for k, v in classes.items()}


def vocabulary() -> set[str]:
    """All words the generator can use."""
    return {w for words in load_lexicon().values() for w in words}


def _noun_phrase(rng: np.random.Generator, lex) -> list[str]:
    det = str(rng.choice(lex["det"]))
    words = [str(rng.choice(lex["adj"]))] if rng.random() < 0.5 else []
    words.append(str(rng.choice(lex["noun"])))
    if det == "a" and words[0][0] in "aeiou":
        det = "an"
    return [det, *words]


def _clause(rng: np.random.Generator, lex) -> list[str]:
    words: list[str] = []
    if rng.random() < 0.1:
        words.append(str(rng.choice(lex["adv"])))
    words += [str(rng.choice(lex["pron"]))] if rng.random() < 0.3 else _noun_phrase(rng, lex)
    words.append(str(rng.choice(lex["modal"])))
    if rng.random() < 0.2:
        words.append(str(rng.choice(lex["neg"])))
    words.append(str(rng.choice(lex["verb"])))
    words += _noun_phrase(rng, lex)
    if rng.random() < 0.4:
        words += [str(rng.choice(lex["prep"])), *_noun_phrase(rng, lex)]
    if rng.random() < 0.3:
        words.append(str(rng.choice(lex["adv"])))
    return words


def make_sentence(rng: np.random.Generator, target_words: int) -> str:
    """A template sentence of about ``target_words`` words (a noun phrase when ≤ 3)."""
    lex = load_lexicon()
    if target_words <= 3:
        return " ".join(_noun_phrase(rng, lex))
    words = _clause(rng, lex)
    while len(words) < target_words - 2:
        words += [str(rng.choice(lex["conj"])), *_clause(rng, lex)]
    return " ".join(words)
