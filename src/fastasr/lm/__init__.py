"""n-gram language models for beam search: modified Kneser-Ney estimation and ARPA files.

``python -m fastasr.cli.lm build --manifest train.jsonl [--out lm.arpa]`` (``make lm``); without
``--out`` the LM goes to ``lm/words-3gram.arpa`` beside the (first) manifest (:func:`corpus_lm_path`).
A recogniser carries its word LM (:class:`BundledLM`: the ARPA text, or path and hash when large).
"""

from fastasr.lm.arpa import ArpaModel, corpus_lm_path, read_arpa, write_arpa
from fastasr.lm.bundled import EMBED_LIMIT_BYTES, BundledLM, ensure_corpus_lm
from fastasr.lm.kneser_ney import NGramModel, estimate

__all__ = ["EMBED_LIMIT_BYTES", "ArpaModel", "BundledLM", "NGramModel", "corpus_lm_path", "ensure_corpus_lm",
           "estimate", "read_arpa", "write_arpa"]
