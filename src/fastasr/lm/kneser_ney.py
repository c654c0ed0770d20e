"""Interpolated modified Kneser-Ney n-gram estimation (Chen & Goodman 1998, as KenLM's lmplz).

For n-grams ``g = h w`` of order k (context ``h`` of k-1 tokens):

* adjusted count ``a(g)``: the raw count at the highest order and for n-grams that begin
  with ``<s>``; otherwise the number of distinct tokens seen immediately before ``g``
  (its continuation count);
* discounts of order k from the counts-of-adjusted-counts ``t_j`` (j = 1..4):
  ``Y = t1 / (t1 + 2 t2)``, ``D1 = 1 - 2Y t2/t1``, ``D2 = 2 - 3Y t3/t2``, ``D3+ = 3 - 4Y t4/t3``;
* ``p(w | h) = (a(hw) - D(a(hw))) / S(h) + gamma(h) p(w | h')`` with ``S(h) = sum_x a(hx)``,
  ``gamma(h) = (D1 n1(h) + D2 n2(h) + D3+ n3+(h)) / S(h)`` (``n_j(h)``: tokens x with
  ``a(hx) = j``, 3+ for the last) and ``h'`` = ``h`` without its first token; unigrams are
  interpolated with a base distribution over the vocabulary (``<unk>`` and ``</s>`` included,
  ``<s>`` excluded, as it is never predicted): the uniform one, or a *unigram prior* (word
  frequencies of a large text, :func:`fastasr.lm.word_lists.frequent_words`) whose words join
  the vocabulary. A prior lets the model give words absent from the training text what a large
  text says of them (``gamma() p_prior(w)``) instead of ``<unk>``'s share.

In ARPA form a seen n-gram's probability is the interpolated ``p(w | h)`` and the back-off
weight of a context ``h`` is ``gamma(h)``, so a back-off reader computes the same numbers.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)  # KenLM's --discount_fallback defaults
NGram = tuple[str, ...]


@dataclass
class NGramModel:
    """An estimated back-off model: for each order k (1-based), ``prob[k][g]`` is p(w | h)
    and ``backoff[k][g]`` the back-off weight gamma of ``g`` as a context (natural numbers,
    not logs; absent = 1). ``discounts[k]`` = (D1, D2, D3+) used at order k."""

    order: int
    prob: dict[int, dict[NGram, float]] = field(default_factory=dict)
    backoff: dict[int, dict[NGram, float]] = field(default_factory=dict)
    discounts: dict[int, tuple[float, float, float]] = field(default_factory=dict)

    @property
    def vocabulary(self) -> list[str]:
        """Every unigram, ``<s>`` included."""
        return [g[0] for g in self.prob[1]]


def discounts_from_counts(count_of_counts: Sequence[int]) -> tuple[float, float, float] | None:
    """(D1, D2, D3+) from ``[t1, t2, t3, t4]`` (how many n-grams have adjusted count 1..4);
    None when they are undefined or outside ``0 < D_j < j`` (too little data)."""
    t1, t2, t3, t4 = count_of_counts
    if min(t1, t2, t3) <= 0:
        return None
    y = t1 / (t1 + 2 * t2)
    d = (1 - 2 * y * t2 / t1, 2 - 3 * y * t3 / t2, 3 - 4 * y * t4 / t3)
    if not all(0 < dj < j + 1 for j, dj in enumerate(d)):
        return None
    return d


def count_ngrams(sentences: Iterable[Sequence[str]], order: int) -> dict[int, Counter]:
    """Raw counts of every n-gram of order 1..``order`` in the sentences, each padded with
    one ``<s>`` and one ``</s>``."""
    if order < 1:
        raise ValueError(f"order {order}; expected >= 1")
    counts: dict[int, Counter] = {k: Counter() for k in range(1, order + 1)}
    for sentence in sentences:
        for token in sentence:
            if token in (BOS, EOS) or not token or any(c.isspace() for c in token):
                raise ValueError(f"token {token!r} in sentence {list(sentence)}; tokens must be non-empty, "
                                 f"without whitespace, and not {BOS}/{EOS} (added here)")
        padded = (BOS, *sentence, EOS)
        for k in range(1, order + 1):
            for i in range(len(padded) - k + 1):
                counts[k][padded[i:i + k]] += 1
    return counts


def adjusted_counts(raw: dict[int, Counter]) -> dict[int, dict[NGram, int]]:
    """Kneser-Ney adjusted counts (see the module docstring)."""
    order = max(raw)
    adjusted: dict[int, dict[NGram, int]] = {order: dict(raw[order])}
    for k in range(order - 1, 0, -1):
        left = Counter(g[1:] for g in raw[k + 1])  # distinct left extensions of each k-gram
        adjusted[k] = {g: (c if g[0] == BOS else left[g]) for g, c in raw[k].items()}
    adjusted[1].pop((BOS,), None)  # never predicted
    return adjusted


def base_distribution(vocabulary: Iterable[str], prior: Mapping[str, float] | None = None) -> dict[str, float]:
    """The distribution the unigrams are interpolated with, over ``vocabulary`` and the
    prior's words (``<s>`` excluded): uniform without a prior; with one, proportional to the
    prior's weights, where a word the prior lacks (``<unk>`` and ``</s>`` among them) weighs as
    much as the prior's lightest word. Sums to 1."""
    words = (set(vocabulary) | set(prior or ())) - {BOS}
    if not prior:
        return {w: 1.0 / len(words) for w in words}
    bad = {w: v for w, v in prior.items() if not v > 0}
    if bad:
        raise ValueError(f"unigram prior: weights must be > 0; got {dict(list(bad.items())[:5])}")
    floor = min(prior.values())
    weights = {w: float(prior.get(w, floor)) for w in words}
    total = sum(weights.values())
    return {w: v / total for w, v in weights.items()}


def estimate(sentences: Iterable[Sequence[str]], order: int = 3,
             discounts: dict[int, tuple[float, float, float]] | None = None,
             unigram_prior: Mapping[str, float] | None = None) -> NGramModel:
    """Estimate an interpolated modified Kneser-Ney model.

    Args:
        sentences: token sequences (words, or characters for a character LM), without
            ``<s>``/``</s>``.
        order: n-gram order.
        discounts: fixed (D1, D2, D3+) per order instead of the count-of-counts estimate
            (an order whose estimate is undefined falls back to (0.5, 1.0, 1.5) with a warning).
        unigram_prior: word → weight (e.g. a frequency): its words join the vocabulary and the
            unigrams are interpolated with it instead of the uniform distribution
            (:func:`base_distribution`). None: the training tokens only, uniform.
    """
    raw = count_ngrams(sentences, order)
    if not raw[1]:
        raise ValueError("no sentences to estimate a language model from")
    adj = adjusted_counts(raw)
    model = NGramModel(order)
    for word in unigram_prior or ():
        if not word or word in (BOS, EOS) or any(c.isspace() for c in word):
            raise ValueError(f"unigram prior: word {word!r}; words must be non-empty, without whitespace, "
                             f"and not {BOS}/{EOS}")
    base = base_distribution({g[0] for g in adj[1]} | {UNK, EOS}, unigram_prior)
    for k in range(1, order + 1):
        if discounts and k in discounts:
            model.discounts[k] = tuple(discounts[k])
            continue
        coc = Counter(min(a, 4) for a in adj[k].values() if a <= 4)
        d = discounts_from_counts([coc[1], coc[2], coc[3], coc[4]])
        if d is None:
            log.warning("order %d: counts of counts %s give no valid discounts (too little data); "
                        "using %s", k, [coc[j] for j in (1, 2, 3, 4)], FALLBACK_DISCOUNTS)
            d = FALLBACK_DISCOUNTS
        model.discounts[k] = d

    for k in range(1, order + 1):
        d1, d2, d3 = model.discounts[k]
        disc = (0.0, d1, d2, d3)
        total: dict[NGram, float] = defaultdict(float)
        n_by_count: dict[NGram, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        for g, a in adj[k].items():
            total[g[:-1]] += a
            n_by_count[g[:-1]][min(a, 3)] += 1
        gamma = {h: (d1 * n[1] + d2 * n[2] + d3 * n[3]) / total[h] for h, n in n_by_count.items()}
        probs: dict[NGram, float] = {}
        for g, a in adj[k].items():
            h = g[:-1]
            lower = base[g[0]] if k == 1 else model.prob[k - 1][g[1:]]
            probs[g] = (a - disc[min(a, 3)]) / total[h] + gamma[h] * lower
        if k == 1:  # the vocabulary's words never seen in training: the base's share alone
            for word, p in base.items():
                if (word,) not in probs:
                    probs[(word,)] = gamma[()] * p
            probs[(BOS,)] = 0.0  # never predicted (ARPA: -99)
        model.prob[k] = probs
        if k > 1:
            model.backoff[k - 1] = {h: gamma[h] for h in gamma}
    model.backoff.setdefault(order, {})
    return model
