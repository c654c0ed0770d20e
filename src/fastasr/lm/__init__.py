"""n-gram language models for beam search: modified Kneser-Ney estimation and ARPA files.

``python -m fastasr.lm build --manifest train.jsonl --out lm.arpa`` (``make lm``).
"""

from fastasr.lm.arpa import ArpaModel, read_arpa, write_arpa
from fastasr.lm.kneser_ney import NGramModel, estimate

__all__ = ["ArpaModel", "NGramModel", "estimate", "read_arpa", "write_arpa"]
