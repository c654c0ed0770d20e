"""Offline corpus tools: builders and readers that write fastasr manifests (JSON lines).

Nothing here runs at training time; ``fastasr.data`` is the training-time pipeline and
only reads the manifests these tools write. Each module is a command:

    python -m fastasr.corpora.synthetic   --out data/synthetic   # the built-in espeak-ng corpus
    python -m fastasr.corpora.digits      SRC OUT   # connected digits from AudioMNIST or FSDD
    python -m fastasr.corpora.librispeech SRC OUT   # LibriSpeech (*.trans.txt + FLAC)
    python -m fastasr.corpora.timit       SRC OUT   # TIMIT (SPHERE .WAV, .PHN, .WRD, .TXT)
    python -m fastasr.corpora.kaldi       SRC OUT   # a Kaldi data directory (WSJ, Switchboard)
    python -m fastasr.corpora.commonvoice SRC OUT   # Common Voice (train/dev/test.tsv + clips/*.mp3)
"""
