"""The modified Kneser-Ney estimator and ARPA files, against probabilities computed by hand."""

import math

import pytest

from fastasr.cli.lm import main as lm_main
from fastasr.lm import BundledLM, corpus_lm_path, ensure_corpus_lm, estimate, read_arpa, write_arpa
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


def test_a_unigram_prior_gives_words_missing_from_the_training_text_their_prior_share(tmp_path):
    """With a prior, the unigrams interpolate with it instead of the uniform distribution: a
    prior word never seen in training gets gamma() x its prior share (by hand below), words the
    prior lacks weigh as its lightest word, and every context still sums to 1."""
    prior = {"b": 4.0, "c": 3.0, "d": 1.0}  # c, d: not in the training text
    model = estimate(TOY, order=2, discounts=FIXED, unigram_prior=prior)
    # base over a, b, c, d, </s>, <unk>: weights 1 (a: the floor), 4, 3, 1, 1, 1 -> total 11
    base = {"a": 1 / 11, "b": 4 / 11, "c": 3 / 11, "d": 1 / 11, "</s>": 1 / 11, "<unk>": 1 / 11}
    expected = {"a": 0.5 / 4 + 0.5 * base["a"], "b": 1.0 / 4 + 0.5 * base["b"], "</s>": 0.5 / 4 + 0.5 * base["</s>"],
                "c": 0.5 * base["c"], "d": 0.5 * base["d"], "<unk>": 0.5 * base["<unk>"]}
    for w, p in expected.items():
        assert model.prob[1][(w,)] == pytest.approx(p), w
    assert sum(expected.values()) == pytest.approx(1.0)
    assert model.prob[1][("c",)] > model.prob[1][("<unk>",)]  # a word of the prior beats the unknown
    arpa = read_arpa(write_arpa(model, tmp_path / "prior.arpa"))
    vocab = [g[0] for g in arpa.logprob if len(g) == 1 and g[0] != "<s>"]
    assert {"c", "d"} <= set(vocab)
    for context in [(), ("<s>",), ("a",), ("c",)]:
        assert sum(10 ** arpa.log10_prob(w, context) for w in vocab) == pytest.approx(1.0, abs=1e-4)
    # seen bigrams back off into the prior-weighted unigrams: a b = (2 - 1)/2 + gamma(a) p(b)
    assert model.prob[2][("a", "b")] == pytest.approx(0.5 + 0.5 * expected["b"])
    with pytest.raises(ValueError, match="must be > 0"):
        estimate(TOY, order=2, unigram_prior={"c": 0.0})
    with pytest.raises(ValueError, match="without whitespace"):
        estimate(TOY, order=2, unigram_prior={"c d": 1.0})


def test_frequent_words_are_wordfreq_s_most_frequent_spellable_ones():
    from fastasr.lm.word_lists import frequent_words

    words = frequent_words("en", 300, keep=lambda w: set(w) <= set("abcdefghijklmnopqrstuvwxyz"))
    assert len(words) == 300 and list(words)[:3] == ["the", "to", "and"]
    freqs = list(words.values())
    assert all(a >= b for a, b in zip(freqs, freqs[1:])) and freqs[-1] > 0  # most frequent first
    assert all(w.isalpha() and w.islower() for w in words)  # "don't" and digits were not kept
    assert "don't" in frequent_words("en", 300)  # without the filter it is there
    with pytest.raises(ValueError, match="no wordfreq list"):
        frequent_words("xx", 10)
    with pytest.raises(ValueError, match="expected >= 1"):
        frequent_words("en", 0)


def test_build_command_opens_the_vocabulary_with_frequent_words(tmp_path, capsys):
    """--frequent-words adds words missing from the training text to the LM (above <unk>) and,
    with --lexicon-out, to a spelt lexicon; only words spelt in the training text's letters."""
    manifest = _manifest(tmp_path / "train.jsonl", ["the cat sat", "a dog ran", "the dog sat"])
    out, lex = tmp_path / "open.arpa", tmp_path / "open.lex"
    assert lm_main(["build", "--manifest", str(manifest), "--out", str(out), "--frequent-words", "50",
                    "--lexicon-out", str(lex)]) == 0
    printed = capsys.readouterr().out
    arpa = read_arpa(out)
    vocab = {g[0] for g in arpa.logprob if len(g) == 1}
    letters = set("thecatsadogrn")
    added = vocab - {"the", "cat", "sat", "a", "dog", "ran", "<s>", "</s>", "<unk>"}
    assert added and all(set(w) <= letters for w in added)  # e.g. "and", "to", "that"
    assert "words not in the training text" in printed and f"{len(added)} words" in printed
    assert arpa.log10_prob("to", ["the"]) > arpa.log10_prob("zebra", ["the"])  # a frequent word beats <unk>
    from fastasr.data.lexicon import read_lexicon

    spelt = read_lexicon(lex)
    assert set(spelt.entries) == vocab - {"<s>", "</s>", "<unk>"}
    assert spelt.pronunciations("to") == [("t", "o")]
    with pytest.raises(ValueError, match="for word LMs"):
        lm_main(["build", "--manifest", str(manifest), "--units", "chars", "--frequent-words", "5"])


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
    # decoding's lm.source=auto and training's final decoding look
    assert lm_main(["build", "--manifest", str(manifest)]) == 0
    assert read_arpa(tmp_path / "lm" / "words-3gram.arpa").order == 3
    assert corpus_lm_path(manifest) == tmp_path / "lm" / "words-3gram.arpa"


def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no sentences"):
        estimate([], order=2)
    with pytest.raises(ValueError, match="without whitespace"):
        estimate([["a b"]], order=2)
    bad = tmp_path / "bad.arpa"
    bad.write_text("\\data\\\nngram 1=1\n\n\\1-grams:\n-1.0\n")
    with pytest.raises(ValueError, match="bad.arpa line 5"):
        read_arpa(bad)


def _manifest(path, texts):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f'{{"audio_filepath": "x.wav", "duration": 1.0, "text": "{t}"}}\n' for t in texts))
    return path


def test_bundled_lm_embeds_small_arpa_and_references_large(tmp_path):
    """A small ARPA travels as its text (plain data); a larger one by path, size and SHA-256,
    and decoding refuses it, naming the path, once it is missing or changed."""
    import hashlib
    import json

    arpa = write_arpa(estimate([["the", "cat"], ["a", "dog"]] * 3, order=2), tmp_path / "lm" / "w.arpa")
    data = arpa.read_bytes()
    embedded = BundledLM.from_file(arpa)
    assert embedded.embedded and embedded.arpa == data.decode() and embedded.size == len(data)
    assert embedded.sha256 == hashlib.sha256(data).hexdigest() and embedded.path == str(arpa.resolve())
    state = embedded.to_dict()
    assert json.loads(json.dumps(state)) == state and BundledLM.from_dict(state) == embedded
    arpa.unlink()  # the embedded text is all it needs
    with embedded.file() as path:
        assert path.read_bytes() == data and read_arpa(path).order == 2

    arpa.write_bytes(data)
    referenced = BundledLM.from_file(arpa, embed_limit=len(data) - 1)
    assert not referenced.embedded and referenced.sha256 == embedded.sha256
    assert BundledLM.from_dict(referenced.to_dict()) == referenced
    with referenced.file() as path:
        assert path == arpa.resolve()
    arpa.write_text(data.decode().replace("\\end\\", "\n\\end\\"))  # another LM at the same path
    with pytest.raises(ValueError, match=rf"word LM {arpa}.* has changed since the model was trained"):
        referenced.check_file()
    arpa.unlink()
    with pytest.raises(FileNotFoundError, match=rf"word LM {arpa}: no such file"):
        with referenced.file():
            pass
    with pytest.raises(ValueError, match="bad word LM entry"):
        BundledLM.from_dict({"path": "x"}, source="a.ckpt")


def test_ensure_corpus_lm_builds_once_beside_the_manifest(tmp_path):
    manifest = _manifest(tmp_path / "corpus" / "train.jsonl", ["the cat", "a dog", "the dog"])
    built = ensure_corpus_lm(manifest)
    assert built == tmp_path / "corpus" / "lm" / "words-3gram.arpa" and read_arpa(built).order == 3
    assert built.read_text() == write_arpa(estimate([["the", "cat"], ["a", "dog"], ["the", "dog"]], 3),
                                           tmp_path / "same.arpa").read_text()  # = python -m fastasr.cli.lm build
    mtime = built.stat().st_mtime_ns
    assert ensure_corpus_lm(manifest) == built and built.stat().st_mtime_ns == mtime  # not rebuilt
    assert [p.name for p in built.parent.iterdir()] == ["words-3gram.arpa"]  # no temporary left behind
    # a corpus directory that cannot take it: the LM goes to the fallback directory
    other = _manifest(tmp_path / "ro" / "train.jsonl", ["a b"])
    (tmp_path / "ro" / "lm").write_text("not a directory")
    assert ensure_corpus_lm(other, tmp_path / "run") == tmp_path / "run" / "lm" / "words-3gram.arpa"
    with pytest.raises(OSError, match="can be written"):
        ensure_corpus_lm(other)
