"""ARPA back-off language model files: write an estimated model, read one back, score text.

The ARPA format stores log10 probabilities and log10 back-off weights:
``p(w | h) = P[h w]`` if ``h w`` is listed, else ``B[h] * p(w | h')`` (``h'``: ``h``
without its first token). KenLM (and so the flashlight decoder) reads it, and converts it
to its binary format with ``build_binary`` where that tool is installed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fastasr.lm.kneser_ney import BOS, EOS, UNK, NGram, NGramModel

NEVER = -99.0  # ARPA's log10 "probability" of <s>


def _log10(p: float) -> float:
    return math.log10(p) if p > 0 else NEVER


def corpus_lm_path(train_manifest: str | Path, order: int = 3, units: str = "words") -> Path:
    """Where a corpus's n-gram LM lives: ``lm/<units>-<order>gram.arpa`` beside its training
    manifest (``make lm`` writes ``data/synthetic/lm/words-3gram.arpa``; ``python -m fastasr.cli.lm
    build`` without ``--out``; training, when it is missing: :func:`fastasr.lm.ensure_corpus_lm`)."""
    return Path(train_manifest).parent / "lm" / f"{units}-{order}gram.arpa"


def write_arpa(model: NGramModel, path: str | Path) -> Path:
    """Write ``model`` as an ARPA file (n-grams sorted within each order)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        f.write("\\data\\\n")
        for k in range(1, model.order + 1):
            f.write(f"ngram {k}={len(model.prob[k])}\n")
        for k in range(1, model.order + 1):
            f.write(f"\n\\{k}-grams:\n")
            backoff = model.backoff.get(k, {})
            for g in sorted(model.prob[k]):
                line = f"{_log10(model.prob[k][g]):.6f}\t{' '.join(g)}"
                if k < model.order and g in backoff:
                    line += f"\t{_log10(backoff[g]):.6f}"
                f.write(line + "\n")
        f.write("\n\\end\\\n")
    return path


@dataclass
class ArpaModel:
    """An ARPA model in memory: ``logprob[g]`` and ``logbackoff[g]`` (log10) per n-gram tuple."""

    order: int
    logprob: dict[NGram, float] = field(default_factory=dict)
    logbackoff: dict[NGram, float] = field(default_factory=dict)

    def log10_prob(self, word: str, context: Sequence[str] = ()) -> float:
        """log10 p(word | context) by back-off; unknown words score as ``<unk>``."""
        word = word if (word,) in self.logprob else UNK
        context = tuple(c if (c,) in self.logprob else UNK for c in context)[-(self.order - 1):] if self.order > 1 else ()
        penalty = 0.0
        while True:
            g = (*context, word)
            if g in self.logprob:
                return penalty + self.logprob[g]
            if not context:
                return penalty + self.logprob.get((UNK,), NEVER)
            penalty += self.logbackoff.get(context, 0.0)
            context = context[1:]

    def sentence_log10_prob(self, tokens: Sequence[str]) -> float:
        """log10 p(tokens </s> | <s>)."""
        history: list[str] = [BOS]
        total = 0.0
        for token in [*tokens, EOS]:
            total += self.log10_prob(token, history)
            history.append(token)
        return total

    def perplexity(self, sentences: Iterable[Sequence[str]]) -> float:
        """Per-token perplexity (``</s>`` counted) over ``sentences``."""
        total, n = 0.0, 0
        for s in sentences:
            total += self.sentence_log10_prob(s)
            n += len(s) + 1
        if not n:
            raise ValueError("perplexity of no sentences")
        return 10 ** (-total / n)


def read_arpa(path: str | Path) -> ArpaModel:
    """Read an ARPA file. Errors name the file, line and what was expected."""
    path = Path(path)
    model = ArpaModel(order=0)
    section = 0
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line in ("\\data\\", "\\end\\") or line.startswith("ngram "):
                continue
            if line.startswith("\\") and line.endswith("-grams:"):
                section = int(line[1:].split("-")[0])
                model.order = max(model.order, section)
                continue
            if not section:
                raise ValueError(f"{path} line {lineno}: {line[:60]!r} before any \\N-grams: section; "
                                 "expected an ARPA file")
            parts = line.split()
            if len(parts) not in (section + 1, section + 2):
                raise ValueError(f"{path} line {lineno}: {len(parts)} fields in the {section}-grams; "
                                 f"expected log10 prob, {section} token(s) and an optional back-off")
            g = tuple(parts[1:section + 1])
            model.logprob[g] = float(parts[0])
            if len(parts) == section + 2:
                model.logbackoff[g] = float(parts[-1])
    if not model.logprob:
        raise ValueError(f"{path}: no n-grams; expected an ARPA file")
    return model
