"""n-gram language models for beam search: modified Kneser-Ney estimation and ARPA files.

``python -m fastasr.lm build --manifest train.jsonl [--out lm.arpa]`` (``make lm``); without
``--out`` the LM goes to ``lm/words-3gram.arpa`` beside the (first) manifest (:func:`corpus_lm_path`).
"""

from fastasr.lm.arpa import ArpaModel, corpus_lm_path, read_arpa, write_arpa
from fastasr.lm.kneser_ney import NGramModel, estimate

__all__ = ["ArpaModel", "NGramModel", "corpus_lm_path", "estimate", "read_arpa", "write_arpa"]
