"""fastasr: CTC speech recognition with pluggable fast attention.

Sub-packages, from the ground up (docs/ARCHITECTURE.md "Layers"):
    kernels    C++ CPU and Triton GPU clustering kernels, and the PyTorch references they are checked against
    attention  parameter-free inner attentions (full, lsh, clustered, i-clustered, top-k, auto)
    data       manifests, audio, features, units (tokenizers), the lexicon, samplers, the data module
    model      front end, encoder, CTC acoustic model
    lm         n-gram LM estimation (modified Kneser-Ney), ARPA files, the LM a recogniser carries
    decoding   CTC search over emissions (greedy, beam + lexicon + LM), error rates, long-form audio
    callbacks  Lightning callbacks (checkpoints, preemption, throughput, not-learning warning, ...)
    corpora    offline corpus builders: the built-in synthetic corpus, converters, corpus shapes
    matrix     the approximation matrix (train with X, decode with Y)
    budget     the budget study (accuracy for a wall-clock budget)
    cli        the commands (python -m fastasr.cli.<command>): compose, call the library, print

Modules: ``recogniser`` (the bundle a checkpoint carries, and the inference object),
``scoring`` (a labelled manifest's error rates), ``training`` (fit, test, final decoding),
``lit`` (the LightningModule), ``config``/``derived_config``/``config_check`` (configuration),
``rundir``, ``loggers``, ``report``, ``transcription`` (transcribing audio files).
"""

__version__ = "0.1.0"
