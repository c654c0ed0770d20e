"""CTC decoding and error-rate scoring."""

from fastasr.decoding.greedy import ctc_greedy
from fastasr.decoding.metrics import ErrorRates

__all__ = ["ErrorRates", "ctc_greedy"]
