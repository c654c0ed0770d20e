"""Transcribe audio with a trained checkpoint.

Usage (``python -m fastasr.cli.transcribe`` and ``python -m fastasr.transcribe`` run the same)::

    fastasr-transcribe ckpt_path=CKPT audio=PATH [overrides]
    fastasr-transcribe ckpt_path=CKPT audio=recordings/ decoding=beam_lm attention=auto
    fastasr-transcribe ckpt_path=CKPT audio='[a.wav,b.flac]' output.srt=true output.ctm=true
    find /data -name '*.wav' | fastasr-transcribe ckpt_path=CKPT audio=-

``audio`` is a file, a directory (searched recursively for audio files by extension:
``fastasr.data.recordings.AUDIO_EXTENSIONS``), a manifest (``.jsonl``/``.json``: ``audio_filepath``
and ``duration`` per line, ``text`` not needed), a list of these, or ``-``: paths on stdin,
one a line. For each file transcribed it prints ``path<TAB>text`` on stdout, and writes to
its run directory (``outputs/transcribe/<time>``, ``conf/hydra/transcribe.yaml``):

* ``transcripts.jsonl``: one JSON line per file (:meth:`fastasr.recognition.recogniser.Transcription.to_dict`:
  text, words with ``start``/``end`` seconds, units, mode);
* ``transcribe.json``: the report — files transcribed, every input that could not be and why
  (missing, unreadable, empty, not audio, truncated, ...), settings, real-time factor;
* with ``output.ctm=true`` ``transcripts.ctm``, with ``output.srt=true`` ``srt/<id>.srt``.

Bad inputs are named on stderr with their reason and the others are still transcribed; the
exit status is 1 only when nothing could be transcribed. The Python API is the same object:
``load_recogniser(ckpt).transcribe(paths)`` (:meth:`fastasr.recognition.recogniser.Recogniser.transcribe`).
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from fastasr.config import CONFIG_DIR
from fastasr.quiet import quiet_known_noise


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="transcribe")
def main(cfg: DictConfig) -> None:
    from fastasr.recognition.transcription_job import run_transcription, summary  # loads torch

    quiet_known_noise()  # third-party messages that are not the user's to act on (fastasr.quiet)
    report = run_transcription(cfg)
    print(summary(report), file=sys.stderr, flush=True)
    if not report["transcribed"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
