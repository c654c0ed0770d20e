"""Beam search (torchaudio ctc_decoder / flashlight) on hand-made emissions whose best path is known."""

import pytest
import torch

from fastasr.data.lexicon import Lexicon, spelling_lexicon
from fastasr.data.tokenizer import Tokenizer
from fastasr.decoding.beam import BeamSearchDecoder, BeamSearchOptions
from fastasr.decoding.builder import build_decoder
from fastasr.decoding.emissions import Emission
from fastasr.decoding.greedy import GreedyDecoder
from fastasr.decoding.tune import grid_search
from fastasr.lm import estimate, write_arpa

PHONES = Tokenizer("phoneme", ["<blank>", "a", "b", "c", "x", "|"])
WORDS = {"ab": "a b", "ba": "b a", "cab": "c a b", "xa": "x a", "xb": "x b"}


def frames(tok, *rows):
    """(T, V) log-probs; each row is a unit (p = 0.9) or a {unit: p} dict, the rest shared evenly."""
    out = []
    for row in rows:
        row = {row: 0.9} if isinstance(row, str) else row
        p = torch.full((len(tok.vocab),), (1 - sum(row.values())) / (len(tok.vocab) - len(row)))
        for unit, prob in row.items():
            p[tok.vocab.index(unit)] = prob
        out.append(p.log())
    return torch.stack(out)


@pytest.fixture(scope="module")
def lexicon():
    lex = Lexicon()
    for word, pron in WORDS.items():
        lex.add(word, pron.split())
    return lex


@pytest.fixture(scope="module")
def xa_lm(tmp_path_factory):
    """A bigram LM that has heard "xa" twenty times and "xb" once."""
    path = tmp_path_factory.mktemp("lm") / "xa.arpa"
    write_arpa(estimate([["xa"]] * 20 + [["xb"]] + [["ab", "ba"]], order=2), path)
    return path


def test_best_path_with_a_lexicon(lexicon):
    beam = BeamSearchDecoder(PHONES, lexicon)
    hyp = beam(frames(PHONES, "a", "a", "<blank>", "b", "|", "b", "a"))
    assert hyp.words == ["ab", "ba"] and hyp.units == ["a", "b", "|", "b", "a"]
    # the utterance-final word needs no boundary frame of its own, a missing boundary between
    # words is restored, and a word the acoustics alone would spell wrongly is a lexicon word
    assert beam(frames(PHONES, "c", "a", "b", "<blank>", "b", "a")).words == ["cab", "ba"]
    noisy = frames(PHONES, "a", {"c": 0.5, "b": 0.4})
    assert GreedyDecoder(PHONES)(noisy).words == ["ac"]
    assert beam(noisy).words == ["ab"]


def test_lm_flips_the_answer(lexicon, xa_lm):
    emissions = frames(PHONES, "x", {"b": 0.5, "a": 0.4})  # acoustics prefer "xb"
    assert BeamSearchDecoder(PHONES, lexicon)(emissions).words == ["xb"]
    with_lm = BeamSearchDecoder(PHONES, lexicon, xa_lm, BeamSearchOptions(lm_weight=2.0))
    assert with_lm(emissions).words == ["xa"]
    # an LM that agrees with clear acoustics changes nothing
    assert with_lm(frames(PHONES, "a", "b", "|", "b", "a")).words == ["ab", "ba"]
    # with weight 0 the LM is ignored
    assert BeamSearchDecoder(PHONES, lexicon, xa_lm, BeamSearchOptions(lm_weight=0.0))(emissions).words == ["xb"]


def test_lexicon_free_char_decoding():
    chars = Tokenizer("char", ["<blank>", "a", "b", "c", "|"])
    beam = BeamSearchDecoder(chars, None)
    hyp = beam(frames(chars, "a", "b", "<blank>", "b", "|", "|", "c"))
    assert hyp.units == ["a", "b", "b", "|", "c"] and hyp.words == ["abb", "c"]
    assert beam.real_words  # a char model's words are real words


def test_char_model_with_a_spelling_lexicon():
    chars = Tokenizer("char", ["<blank>", "a", "b", "c", "|"])
    beam = BeamSearchDecoder(chars, spelling_lexicon(["ab", "c", "cab"]))
    # no boundary between the words: "abc" is no word, "ab c" is the best spelling with words
    assert beam(frames(chars, "a", "b", "<blank>", "c", "c")).words == ["ab", "c"]
    assert beam(frames(chars, "c", "a", "b")).words == ["cab"]


def test_greedy_maps_phonetic_words_through_the_lexicon(lexicon):
    emissions = frames(PHONES, "a", "b", "|", "b", "a", "|", "c", "c")
    assert GreedyDecoder(PHONES)(emissions).words == ["ab", "ba", "c"]  # phonetic words
    mapped = GreedyDecoder(PHONES, lexicon)(emissions)
    assert mapped.words == ["ab", "ba", "c"] and mapped.units == ["a", "b", "|", "b", "a", "|", "c"]
    other = Lexicon()
    other.add("hello", ["a", "b"])
    assert GreedyDecoder(PHONES, other)(emissions).words == ["hello", "ba", "c"]  # unknown spellings kept


def test_tuning_grid_finds_the_lm_weight_that_helps(lexicon, xa_lm):
    emission = Emission("u1", "xa", ["x", "a"], frames(PHONES, "x", {"b": 0.5, "a": 0.4}))
    spec = {"name": "beam", "lm": {"path": str(xa_lm)}}

    def decoder_for(lm_weight, word_score):
        return build_decoder(dict(spec, lm_weight=lm_weight, word_score=word_score), PHONES, lexicon=lexicon)[0]

    points = grid_search([emission], PHONES, decoder_for, [0.0, 2.0], [0.0])
    assert points[0]["lm_weight"] == 2.0 and points[0]["wer"] == 0.0
    assert points[-1]["lm_weight"] == 0.0 and points[-1]["wer"] == 100.0


def test_config_errors_are_clear(lexicon, tmp_path):
    with pytest.raises(ValueError, match="expected one of"):
        build_decoder({"name": "viterbi"}, PHONES)
    with pytest.raises(ValueError, match="unknown key"):
        build_decoder({"name": "beam", "beam": 3, "lexicon": {"source": "none"}}, PHONES)
    with pytest.raises(FileNotFoundError, match="make lm"):
        BeamSearchDecoder(PHONES, lexicon, "/nonexistent/lm.arpa")
    bad = tmp_path / "bad.arpa"
    bad.write_text("garbage\n")
    with pytest.raises(ValueError, match="KenLM cannot read it"):
        BeamSearchDecoder(PHONES, lexicon, bad)
    with pytest.raises(ValueError, match="word boundary"):
        BeamSearchDecoder(Tokenizer("phoneme", ["<blank>", "a"]), None)


def test_auto_sources_take_the_recognisers_lexicon_and_lm(lexicon, xa_lm, tmp_path):
    """``lexicon.source`` / ``lm.source`` ``auto`` use what the recogniser carries; an explicit
    ``lm.path`` wins, ``none`` has no LM, and an LM that cannot be found says what to pass."""
    from fastasr.decoding.builder import resolve_lm
    from fastasr.lm import BundledLM

    own_lm = BundledLM.from_file(xa_lm)
    emissions = frames(PHONES, "x", {"b": 0.5, "a": 0.4})  # acoustics prefer "xb", the LM "xa"
    beam_lm = {"name": "beam", "lexicon": {"source": "auto"}, "lm": {"source": "auto", "path": None}}
    decoder, used = build_decoder(beam_lm, PHONES, None, bundled_lexicon=lexicon, bundled_lm=own_lm)
    assert used is lexicon and decoder(emissions).words == ["xa"]
    assert decoder.describe()["lm_sha256"] == own_lm.sha256 and decoder.describe()["lm"] == str(xa_lm)
    no_lm, _ = build_decoder(dict(beam_lm, lm={"source": "none"}), PHONES, bundled_lexicon=lexicon,
                             bundled_lm=own_lm)
    assert no_lm(emissions).words == ["xb"] and no_lm.describe()["lm"] is None
    assert resolve_lm({"source": "auto", "path": "/my/lm.arpa"}, None, own_lm) == "/my/lm.arpa"
    assert resolve_lm({"path": None}, None, own_lm) is None  # a spec without a source: no LM, as before
    # a recogniser without an LM of its own: an error naming decoding.lm.path, even with a corpus LM
    # beside its training manifest (no fallback to it)
    (tmp_path / "lm").mkdir()
    (tmp_path / "lm" / "words-3gram.arpa").write_bytes(xa_lm.read_bytes())
    with pytest.raises(FileNotFoundError, match="carries no word LM.*decoding.lm.path"):
        resolve_lm({"source": "auto"}, tmp_path / "train.jsonl", None)
    with pytest.raises(FileNotFoundError, match="carries no word LM"):
        resolve_lm({"source": "recogniser"}, tmp_path / "train.jsonl", None)
    with pytest.raises(ValueError, match="decoding.lm.source='kenlm'"):
        resolve_lm({"source": "kenlm"})


HOMOPHONES_SCRIPT = """
import sys
from fastasr.data.lexicon import Lexicon
from fastasr.decoding.beam import BeamSearchDecoder
sys.path.insert(0, {tests!r})
from test_beam_search import PHONES, frames
for words in {cases!r}:
    lex = Lexicon()
    for word, count in words:
        lex.add(word, ["a", "b"], count)
    lex.add("ba", ["b", "a"])
    beam = BeamSearchDecoder(PHONES, lex)
    print(" ".join(beam(frames(PHONES, "a", "b", "|", "a", "b", "|", "b", "a")).words))
"""

HOMOPHONE_CASES = [  # (words spelt "a b" with their counts, the word every process must give)
    ([("zab", 3), ("abb", 1), ("mab", 3)], "mab"),  # most often said: mab and zab tie on counts
    ([("zab", 1), ("abb", 5), ("mab", 1)], "abb"),
]


def test_homophones_without_an_lm_give_the_same_word_in_every_process():
    """Words spelt alike score exactly alike without an LM: the decoder reports the one said most
    often with that spelling (equal counts: the alphabetically first), in fresh processes with
    different hash seeds and lexicon orders alike."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tests = str(Path(__file__).parent)
    want = [f"{word} {word} ba" for _, word in HOMOPHONE_CASES]
    for seed, reorder in (("1", lambda w: w), ("2", lambda w: w[::-1]), ("3", lambda w: w[1:] + w[:1])):
        cases = [reorder(words) for words, _ in HOMOPHONE_CASES]
        proc = subprocess.run(
            [sys.executable, "-c", HOMOPHONES_SCRIPT.format(tests=tests, cases=cases)],
            capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": seed}, check=True)
        assert proc.stdout.split("\n")[:2] == want, (seed, proc.stdout)


def test_one_word_per_pronunciation_keeps_the_most_frequent_homophone():
    lex = Lexicon()
    lex.add("there", ["ð", "ɛ"], 7)
    lex.add("their", ["ð", "ɛ"], 3)
    lex.add("their", ["ð", "ə"], 9)
    kept = lex.one_word_per_pronunciation()
    assert kept.entries == {"there": {("ð", "ɛ"): 7}, "their": {("ð", "ə"): 9}}
    assert lex.entries["their"][("ð", "ɛ")] == 3  # the original is left as it was


class _WeightedDecoder:
    """A decoder whose hypothesis gets one word more wrong for each half step its (lm_weight,
    word_score) lies from ``best``: the grid's WER is a bowl around ``best``."""

    real_words, lexicon = True, None
    reference = ["ab", "ba", "cab", "xa", "xb", "ab", "ba", "cab", "xa", "xb"]

    def __init__(self, lm_weight, word_score, best):
        ws_distance = 0.0 if best[1] is None else abs(word_score - best[1])  # None: the word score does not matter
        self.wrong = min(len(self.reference), round(2 * (abs(lm_weight - best[0]) + ws_distance)))

    def __call__(self, log_probs):
        from fastasr.decoding.hypothesis import Hypothesis

        words = ["zz"] * self.wrong + self.reference[self.wrong:]
        return Hypothesis(units=list("|".join(words)), words=words)


def _bowl_search(best, lm_weights, word_scores, extend_edges):
    emission = Emission("u1", " ".join(_WeightedDecoder.reference), ["a"], torch.zeros(3, len(PHONES.vocab)))
    searched = []

    def decoder_for(lm_weight, word_score):
        searched.append((lm_weight, word_score))
        return _WeightedDecoder(lm_weight, word_score, best)

    return grid_search([emission], PHONES, decoder_for, lm_weights, word_scores, extend_edges=extend_edges), searched


def test_tuning_grid_grows_past_the_edge_its_best_point_sits_on():
    """A best point on the grid's edge, better than its neighbour, has not bracketed the optimum:
    with ``extend_edges`` the axis grows by its edge spacing until the best is inside, searching
    each new row and column once; without, the grid is searched as given; an axis along which
    the error is flat does not grow."""
    points, searched = _bowl_search((3.0, -2.0), [0.5, 1.0, 1.5, 2.0], [-1.0, 0.0, 1.0], extend_edges=0)
    assert (points[0]["lm_weight"], points[0]["word_score"]) == (2.0, -1.0) and len(searched) == 12
    points, searched = _bowl_search((3.0, -2.0), [0.5, 1.0, 1.5, 2.0], [-1.0, 0.0, 1.0], extend_edges=4)
    assert (points[0]["lm_weight"], points[0]["word_score"], points[0]["wer"]) == (3.0, -2.0, 0.0)
    assert len(searched) == len(set(searched)) == len(points)  # no point decoded twice
    lms, wss = {p[0] for p in searched}, {p[1] for p in searched}
    assert lms == {0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5} and wss == {-3.0, -2.0, -1.0, 0.0, 1.0}  # one past the best
    assert len(searched) == len(lms) * len(wss)  # each new value against every value of the other axis
    # at most extend_edges new values per axis, whatever the bowl
    points, searched = _bowl_search((3.0, 0.0), [0.5, 1.0], [0.0], extend_edges=2)
    assert {p[0] for p in searched} == {0.5, 1.0, 1.5, 2.0} and points[0]["lm_weight"] == 2.0
    # an LM weight never goes below 0; a one-value axis does not grow
    points, searched = _bowl_search((0.0, 0.0), [0.75, 1.5], [0.0], extend_edges=3)
    assert {p[0] for p in searched} == {0.0, 0.75, 1.5} and points[0]["lm_weight"] == 0.0
    # a word score that changes nothing (digit strings, an untrained model): its axis stays as given
    points, searched = _bowl_search((2.5, None), [1.0, 2.0], [-1.0, 0.0, 1.0], extend_edges=3)
    assert {p[1] for p in searched} == {-1.0, 0.0, 1.0} and {p[0] for p in searched} == {1.0, 2.0, 3.0}
    with pytest.raises(ValueError, match="extend_edges=-1; expected .* an integer ≥ 0"):  # python -m fastasr.cli.tune's too
        _bowl_search((1.0, 0.0), [1.0], [0.0], extend_edges=-1)
