"""CTC decoding (greedy, beam search with lexicon and n-gram LM), lexicons and scoring."""

from fastasr.decoding.greedy import GreedyDecoder, ctc_greedy
from fastasr.decoding.hypothesis import Hypothesis
from fastasr.decoding.metrics import Alignment, ErrorRates, align

__all__ = ["Alignment", "ErrorRates", "GreedyDecoder", "Hypothesis", "align", "ctc_greedy"]
