"""CTC decoding (greedy, beam search with lexicon and n-gram LM), lexicons and scoring.

Names are imported lazily: the modules that need no PyTorch (:mod:`fastasr.decoding.windows`,
:mod:`fastasr.decoding.hypothesis`) import without it, as the ONNX runtime (:mod:`fastasr.onnx`) needs.
"""

from importlib import import_module

_EXPORTS = {"GreedyDecoder": "greedy", "ctc_greedy": "greedy", "Hypothesis": "hypothesis",
            "Alignment": "metrics", "ErrorRates": "metrics", "align": "metrics"}

__all__ = ["Alignment", "ErrorRates", "GreedyDecoder", "Hypothesis", "align", "ctc_greedy"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f"fastasr.decoding.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'fastasr.decoding' has no attribute {name!r}")
