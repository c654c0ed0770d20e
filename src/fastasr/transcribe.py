"""``python -m fastasr.transcribe ckpt_path=CKPT audio=PATH [overrides]``: the transcription
command under the name the project's outside contract gives it; the command is
:mod:`fastasr.cli.transcribe` (usage there, and in docs/TRANSCRIBE.md)."""

from fastasr.cli.transcribe import main

if __name__ == "__main__":
    main()
