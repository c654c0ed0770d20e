"""fastasr: CTC speech recognition with pluggable fast attention.

Sub-packages, from the ground up (docs/ARCHITECTURE.md "Layers"):
    (shared)     config, sections, rundir, distributed, progress, quiet: paths, config sections, run
                 directories, DDP ranks, progress bars
    kernels      C++ CPU and Triton GPU clustering kernels, and the PyTorch references they are checked against
    attention    parameter-free inner attentions (full, lsh, clustered, i-clustered, top-k, auto)
    data         manifests, audio, features, units (tokenizers), lexicons, samplers, the data module
    model        front end, encoder, CTC acoustic model
    lm           n-gram LM estimation (modified Kneser-Ney), ARPA files, the LM a recogniser carries
    decoding     CTC search over emissions (greedy, beam + lexicon + LM), error rates, long-form audio
    recognition  the recogniser (the bundle a checkpoint carries, the inference object), scoring,
                 evaluation, transcription, checkpoint averaging and migration, the final decoding
    training     fit, the LightningModule, schedules, loggers, checkpoint I/O, config checks, callbacks
    deploy, onnx the ONNX export, and the runtime that runs it without PyTorch
    studies      the approximation matrix, the budget study, reports
    corpora      offline corpus builders: the built-in synthetic corpus, converters, corpus shapes
    cli          the commands (python -m fastasr.cli.<command>): compose, call the library, print
"""

__version__ = "0.1.0"
