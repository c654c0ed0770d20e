"""Offline corpus tools: builders and readers that write fastasr manifests (JSON lines).

Nothing here runs at training time; ``fastasr.data`` is the training-time pipeline and
only reads the manifests these tools write. Each builder's module holds its build function and,
beside it, its command-line arguments (``main(argv)``); the command that runs them is
``fastasr-corpus <builder>`` (:mod:`fastasr.cli.corpus`):

    fastasr-corpus synthetic        --out data/synthetic   # the built-in espeak-ng corpus
    fastasr-corpus digits           SRC OUT   # connected digits from AudioMNIST or FSDD
    fastasr-corpus librispeech      SRC OUT   # LibriSpeech (*.trans.txt + FLAC)
    fastasr-corpus mini-librispeech SRC OUT   # Mini LibriSpeech's train-clean-5, split train/dev/test
    fastasr-corpus timit            SRC OUT   # TIMIT (SPHERE .WAV, .PHN, .WRD, .TXT)
    fastasr-corpus kaldi            SRC OUT   # a Kaldi data directory (WSJ, Switchboard)
    fastasr-corpus commonvoice      SRC OUT   # Common Voice (train/dev/test.tsv + clips/*.mp3)
    fastasr-corpus join             MANIFEST OUT   # utterances joined into long ones, voices mixed
    fastasr-corpus shapes           SHAPE SRC OUT  # a built corpus reshaped (fastasr.corpora.shapes)
"""
