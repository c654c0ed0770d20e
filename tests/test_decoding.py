"""Greedy CTC decoding and error-rate accumulation."""

import math

import torch

from fastasr.decoding import ErrorRates, ctc_greedy


def one_hot_frames(seq, vocab=5):
    lp = torch.full((len(seq), vocab), -10.0)
    lp[torch.arange(len(seq)), torch.tensor(seq)] = 0.0
    return lp


def test_greedy_merges_repeats_and_drops_blanks():
    a = one_hot_frames([0, 1, 1, 0, 1, 2, 2, 2, 0, 3])
    b = one_hot_frames([4, 4, 0, 0, 0, 0, 0, 0, 0, 0])
    lp = torch.stack([a, b])
    assert ctc_greedy(lp, torch.tensor([10, 10])) == [[1, 1, 2, 3], [4]]
    # frames past the length are ignored
    assert ctc_greedy(lp, torch.tensor([3, 1])) == [[1], [4]]


def test_error_rates_against_hand_count():
    rates = ErrorRates()
    # units: one substitution in 4 + one deletion in 3 → 2/7
    rates.update(
        [["a", "b", "c", "d"], ["x", "y", "z"]],
        [["a", "b", "e", "d"], ["x", "z"]],
        [["ab", "cd"], ["xyz"]],
        [["ab", "ed"], ["xz"]],
    )
    out = rates.compute()
    assert math.isclose(out["uer"], 100 * 2 / 7)
    assert math.isclose(out["wer"], 100 * 2 / 3)
    assert rates.utterances == 2


def test_error_rates_empty_hypothesis_and_insertions():
    rates = ErrorRates()
    rates.update([["a", "b"]], [[]], [["ab"]], [[]])
    rates.update([["c"]], [["c", "c", "c"]], [["c"]], [["c", "c"]])
    out = rates.compute()
    assert math.isclose(out["uer"], 100 * (2 + 2) / 3)
    assert math.isclose(out["wer"], 100 * (1 + 1) / 2)


def test_error_rates_nothing_scored_is_nan():
    assert math.isnan(ErrorRates().compute()["wer"])


def test_error_rates_of_transcripts_equal_evaluates_score_in_batches():
    """The training module's accumulator (``ErrorRates.add``, a batch at a time) and evaluate.py's
    corpus scoring (``emissions.score``) give the same rates for the same transcripts."""
    from fastasr.decoding.emissions import score
    from fastasr.decoding.metrics import Transcript

    transcripts = [
        Transcript("u1", ["ab", "cd"], ["ab", "ed"], list("ab|cd"), list("ab|ed"), list("abcd"), list("abed")),
        Transcript("u2", ["xyz"], ["xz", "q"], list("xyz"), list("xz|q"), list("xyz"), list("xzq")),
        Transcript("u3", ["k"], [], ["k"], [], ["k"], []),
    ]
    rates = ErrorRates()
    rates.add(transcripts[:2], keep_examples=1)
    rates.add(transcripts[2:], keep_examples=1)
    corpus, _, _ = score(transcripts, "cer")
    out = rates.compute()
    assert math.isclose(out["uer"], corpus["cer"]) and math.isclose(out["uer"], 100 * 4 / 8)
    assert math.isclose(out["wer"], corpus["wer"]) and math.isclose(out["wer"], 100 * 4 / 4)
    assert rates.utterances == corpus["utterances"] == 3
    assert rates.examples == [("ab cd", "ab ed")]
