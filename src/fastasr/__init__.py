"""fastasr: CTC speech recognition with pluggable fast attention.

Sub-packages:
    attention  parameter-free inner attentions (full, lsh, clustered, i-clustered, top-k)
    kernels    Triton kernels and the PyTorch references they are checked against
    data       manifests, audio, features, tokenisers, samplers, the built-in corpus
    model      positional encoding, encoder, CTC acoustic model
    decoding   CTC decoding and error rates
"""

__version__ = "0.1.0"
