"""Recognition: what a trained checkpoint is and does, without training code.

Modules: :mod:`~fastasr.recognition.recogniser` (the bundle a checkpoint carries and the decoder
it chooses), :mod:`~fastasr.recognition.loading` (a checkpoint into a recogniser; the lexicon and
LM of its training data), :mod:`~fastasr.recognition.audio_decoding` (the transcription loop and its
timed words), :mod:`~fastasr.recognition.bundle_format`
(the entry's layout, its version and checks), :mod:`~fastasr.recognition.checkpoint_averaging` (averaged
weights), :mod:`~fastasr.recognition.scoring` (a labelled manifest's error rates, the LM-weight
search), :mod:`~fastasr.recognition.evaluation` (what evaluate.py runs),
:mod:`~fastasr.recognition.transcription_job` (what ``fastasr-transcribe`` runs),
:mod:`~fastasr.recognition.final_decoding` (training's final decoding: the test split with real
words). Imports ``data``, ``model``, ``lm``, ``decoding`` and the shared modules; never ``training``.
"""
