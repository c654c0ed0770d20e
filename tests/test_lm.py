"""The modified Kneser-Ney estimator and ARPA files, against probabilities computed by hand."""

import math

import pytest

from fastasr.config import corpus_lm
from fastasr.lm import estimate, read_arpa, write_arpa
from fastasr.lm.__main__ import main as lm_main
from fastasr.lm.kneser_ney import adjusted_counts, count_ngrams, discounts_from_counts

TOY = [["a", "b"], ["a", "b"], ["b"]]
FIXED = {1: (0.5, 1.0, 1.5), 2: (0.5, 1.0, 1.5)}
# By hand (see the module docstring's formulas). Padded: <s> a b </s> (twice), <s> b </s>.
# Unigram adjusted (continuation) counts: a 1 ({<s>}), b 2 ({a, <s>}), </s> 1 ({b}); total 4;
# gamma() = (0.5*2 + 1.0*1) / 4 = 0.5, |V| = 4 (a, b, </s>, <unk>).
UNIGRAMS = {"a": 0.5 / 4 + 0.5 / 4, "b": 1.0 / 4 + 0.5 / 4, "</s>": 0.5 / 4 + 0.5 / 4, "<unk>": 0.5 / 4}
# Bigrams (raw counts): <s> a 2, <s> b 1, a b 2, b </s> 3; gamma(<s>) = (0.5 + 1.0)/3, gamma(a) = 1/2,
# gamma(b) = 1.5/3.
BIGRAMS = {
    ("<s>", "a"): (2 - 1.0) / 3 + 0.5 * UNIGRAMS["a"],
    ("<s>", "b"): (1 - 0.5) / 3 + 0.5 * UNIGRAMS["b"],
    ("a", "b"): (2 - 1.0) / 2 + 0.5 * UNIGRAMS["b"],
    ("b", "</s>"): (3 - 1.5) / 3 + 0.5 * UNIGRAMS["</s>"],
}


def test_discounts_from_counts_of_counts():
    y = 10 / (10 + 2 * 4)
    d = discounts_from_counts([10, 4, 2, 1])
    assert d == pytest.approx((1 - 2 * y * 4 / 10, 2 - 3 * y * 2 / 4, 3 - 4 * y * 1 / 2))
    assert discounts_from_counts([3, 0, 0, 0]) is None  # undefined: too little data


def test_adjusted_counts_are_continuation_counts():
    adj = adjusted_counts(count_ngrams(TOY, 2))
    assert adj[1] == {("a",): 1, ("b",): 2, ("</s>",): 1}
    assert adj[2] == {("<s>", "a"): 2, ("a", "b"): 2, ("b", "</s>"): 3, ("<s>", "b"): 1}


def test_probabilities_match_the_hand_computation(tmp_path):
    model = estimate(TOY, order=2, discounts=FIXED)
    for w, p in UNIGRAMS.items():
        assert model.prob[1][(w,)] == pytest.approx(p)
    for g, p in BIGRAMS.items():
        assert model.prob[2][g] == pytest.approx(p)
    assert model.backoff[1][("<s>",)] == pytest.approx(0.5)

    arpa = read_arpa(write_arpa(model, tmp_path / "toy.arpa"))
    for g, p in BIGRAMS.items():
        assert 10 ** arpa.log10_prob(g[1], g[:1]) == pytest.approx(p, rel=1e-5)
    # unseen bigram: back-off weight of b (0.5) times p(a)
    assert 10 ** arpa.log10_prob("a", ["b"]) == pytest.approx(0.5 * UNIGRAMS["a"], rel=1e-5)
    # an unknown word is <unk>: back-off weight of a (0.5) times p(<unk>)
    assert 10 ** arpa.log10_prob("zebra", ["a"]) == pytest.approx(0.5 * UNIGRAMS["<unk>"], rel=1e-5)
    assert arpa.logprob[("<s>",)] == -99.0


def test_every_context_is_a_distribution(tmp_path):
    corpus = [s.split() for s in ["the cat sat", "the cat ran", "a dog sat", "the dog ran fast", "a cat"] * 3]
    arpa = read_arpa(write_arpa(estimate(corpus, order=3), tmp_path / "lm.arpa"))
    vocab = [g[0] for g in arpa.logprob if len(g) == 1 and g[0] != "<s>"]
    for context in [(), ("<s>",), ("the",), ("the", "cat"), ("<s>", "a"), ("dog", "zebra")]:
        assert sum(10 ** arpa.log10_prob(w, context) for w in vocab) == pytest.approx(1.0, abs=1e-4)


def test_build_command_writes_arpa_from_manifest(tmp_path, capsys):
    manifest = tmp_path / "train.jsonl"
    manifest.write_text("".join(f'{{"audio_filepath": "x.wav", "duration": 1.0, "text": "{t}"}}\n'
                                for t in ["The cat", "the dog", "a cat"]))
    out = tmp_path / "lm" / "words.arpa"
    assert lm_main(["build", "--manifest", str(manifest), "--out", str(out), "--order", "2",
                    "--dev", str(manifest)]) == 0
    printed = capsys.readouterr().out
    assert "3 sentences" in printed and "dev perplexity" in printed
    arpa = read_arpa(out)
    assert arpa.order == 2 and ("the", "cat") in arpa.logprob  # lower-cased words
    assert math.isfinite(arpa.perplexity([["the", "cat"]]))
    # without --out: the corpus's LM, lm/words-<order>gram.arpa beside the manifest, where
    # conf/decoding/beam_lm.yaml (the corpus_lm resolver) and training's final decoding look
    assert lm_main(["build", "--manifest", str(manifest)]) == 0
    assert read_arpa(tmp_path / "lm" / "words-3gram.arpa").order == 3
    assert corpus_lm(str(manifest)) == str(tmp_path / "lm" / "words-3gram.arpa") and corpus_lm(None) is None


def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no sentences"):
        estimate([], order=2)
    with pytest.raises(ValueError, match="without whitespace"):
        estimate([["a b"]], order=2)
    bad = tmp_path / "bad.arpa"
    bad.write_text("\\data\\\nngram 1=1\n\n\\1-grams:\n-1.0\n")
    with pytest.raises(ValueError, match="bad.arpa line 5"):
        read_arpa(bad)
